"""Maps kept at the site (site setting ``products.maps = "keep"``): the store, the journal and the partial sums.

::

    <store>/                                  products.store, default <site data>/products
        campaign-<id>/
            <index>/map_iqu.fits ...          the kept maps (iqu, hits, rcond) of a realisation
            journal/<index>.json              accepted by the service, not yet in the sums: {"iqu": path}
            sums.npz                          the partial sums (campaignlib.sitesums), their ledger inside
            sent.json                         {"version": n}: the sums the service last acknowledged
            .lock                             flock: the workers of the site that share the store

A realisation's maps are moved here before its result is reported, and the result names them
(``ProductFile.kept``: site and path) instead of uploading them. Its map joins the sums only once the
service accepted the result: the journal entry is written right after the acceptance and removed once
the sums (whose ledger names it) are written, so a worker killed in between folds the entry in at its
next start (:meth:`SiteStore.repair`), and an entry whose realisation the ledger already holds is only
removed: no realisation is counted twice. The sums are sent to the service at most once per
``products.sums_interval_s`` per campaign, and at once when the worker's last task of the campaign ends
and when it stops. A realisation the service accepted whose acknowledgement the worker never heard
(killed between the two) has no journal entry: its map stays kept and fetchable but is not in the sums.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from campaignlib import sitesums
from campaignlib.healpixfile import NotAHealpixMap, observed_columns, read_healpix_fields
from campaignlib.sitesums import SiteSums, SiteSumsInvalid
from schemas.api import KeptFileRequest
from schemas.files import atomic_write_json, sha256_file
from schemas.result import KEPT_ROLES, KeptFile, RealizationResult
from worker.client import ServiceClient, ServiceError
from worker.clock import SYSTEM_CLOCK, Clock
from worker.site import SiteConfig

log = logging.getLogger("mapcampaign.worker")

SUMS_FILE = "sums.npz"
SENT_FILE = "sent.json"


def store_root(site: SiteConfig, site_data: Path) -> Path:
    """The site's store of kept maps: ``products.store``, or ``<site data>/products``."""
    return site.products.store or site_data / "products"


class SiteStore:
    """The kept maps and partial sums of one site (see the module doc); safe to use from several threads."""

    def __init__(self, root: Path, site: str, *, interval_s: float, clock: Clock = SYSTEM_CLOCK):
        self.root = root
        self.site = site
        self.interval_s = interval_s
        self.clock = clock
        self.worker_id: int | None = None  # set once the worker is registered: sends need it
        self._lock = threading.Lock()
        self._last_send: dict[int, float] = {}  # campaign -> clock.monotonic() of the last attempt

    def campaign_dir(self, campaign_id: int) -> Path:
        return self.root / f"campaign-{campaign_id}"

    @contextlib.contextmanager
    def _locked(self, campaign_id: int) -> Iterator[Path]:
        folder = self.campaign_dir(campaign_id)
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock:
            descriptor = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                yield folder
            finally:
                os.close(descriptor)

    # ------------------------------------------------------------------ maps

    def keep_maps(self, result: RealizationResult, folder: Path, campaign_id: int) -> RealizationResult:
        """Move the result's maps (:data:`schemas.result.KEPT_ROLES`) from the product ``folder`` into the store;
        return the result naming where they are. Sizes and checksums were checked by the caller."""
        target = self.campaign_dir(campaign_id) / str(result.realization)
        target.mkdir(parents=True, exist_ok=True)
        products = []
        for product in result.products:
            if product.name in KEPT_ROLES and product.kept is None:
                kept = target / product.path
                shutil.move(folder / product.path, kept)  # a rename on one file system, else copy and remove
                product = product.model_copy(update={"kept": KeptFile(site=self.site, path=str(kept.resolve()))})
            products.append(product)
        return result.model_copy(update={"products": products})

    # ------------------------------------------------------------------ sums

    def accepted(self, campaign_id: int, result: RealizationResult) -> None:
        """Journal an accepted realisation whose map is kept here, then fold it into the sums."""
        iqu = next((p for p in result.products if p.name == "iqu" and p.kept is not None), None)
        if iqu is None:
            return
        assert iqu.kept is not None
        with self._locked(campaign_id) as folder:
            atomic_write_json(folder / "journal" / f"{result.realization}.json", {"iqu": iqu.kept.path})
        self.fold(campaign_id)

    def fold(self, campaign_id: int) -> SiteSums | None:
        """Add every journalled realisation to the campaign's sums (each once), then clear the journal."""
        with self._locked(campaign_id) as folder:
            entries = sorted((folder / "journal").glob("*.json")) if (folder / "journal").is_dir() else []
            sums = self._read_sums(folder)
            changed = False
            for entry in entries:
                index = int(entry.stem)
                if sums is not None and sums.includes(index):
                    continue
                try:
                    path = Path(json.loads(entry.read_text())["iqu"])
                    npix, pixels, iqu = read_healpix_fields(path, 3)
                except (OSError, ValueError, KeyError, NotAHealpixMap) as error:
                    log.error(
                        "campaign %d realisation %d: kept map not added to the sums: %s", campaign_id, index, error
                    )
                    continue
                where, columns = observed_columns(pixels, iqu)
                sums = sums or SiteSums.empty(round((npix / 12) ** 0.5))
                sums = sitesums.add_map(sums, index, where, iqu[:, columns])
                changed = True
            if changed and sums is not None:
                sitesums.write(folder / SUMS_FILE, sums)  # the commit point: its ledger names the entries
            for entry in entries:
                if sums is not None and sums.includes(int(entry.stem)):
                    entry.unlink(missing_ok=True)
            return sums

    def _read_sums(self, folder: Path) -> SiteSums | None:
        try:
            return sitesums.read(folder / SUMS_FILE)
        except SiteSumsInvalid as error:
            if (folder / SUMS_FILE).exists():
                raise SiteSumsInvalid(error.field, f"{folder / SUMS_FILE}: {error.reason}") from None
            return None

    def campaigns(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(
            int(path.name.removeprefix("campaign-"))
            for path in self.root.glob("campaign-*")
            if path.name.removeprefix("campaign-").isdigit()
        )

    def repair(self) -> None:
        """At start-up: fold the journal entries a stopped worker left (each realisation once)."""
        for campaign_id in self.campaigns():
            if any((self.campaign_dir(campaign_id) / "journal").glob("*.json")):
                log.info("campaign %d: adding journalled realisations to the site's partial sums", campaign_id)
                self.fold(campaign_id)

    # ------------------------------------------------------------------ sends

    def unsent(self, campaign_id: int) -> bool:
        folder = self.campaign_dir(campaign_id)
        try:
            sums = sitesums.read(folder / SUMS_FILE)
        except SiteSumsInvalid:
            return False
        try:
            sent = int(json.loads((folder / SENT_FILE).read_text())["version"])
        except (OSError, ValueError, KeyError):
            sent = -1
        return sums.version > sent

    def send(self, client: ServiceClient, campaign_id: int, *, force: bool = False) -> bool:
        """Send the campaign's sums if they changed since the last acknowledged send and, unless ``force``, the
        last attempt is ``interval_s`` old; True when the service took them."""
        now = self.clock.monotonic()
        with self._lock:
            last = self._last_send.get(campaign_id)
            if self.worker_id is None or (not force and last is not None and now - last < self.interval_s):
                return False
            if not self.unsent(campaign_id):
                return False
            self._last_send[campaign_id] = now
        folder = self.campaign_dir(campaign_id)
        with self._locked(campaign_id):
            snapshot = folder / f".sending-{threading.get_ident()}.npz"
            shutil.copyfile(folder / SUMS_FILE, snapshot)  # a fold during the send must not change what is sent
        try:
            receipt = client.put_map_sums(self.worker_id, campaign_id, snapshot)
        except ServiceError as error:
            log.error("campaign %d: the site's partial map sums were not taken: %s", campaign_id, error)
            return False
        finally:
            snapshot.unlink(missing_ok=True)
        with self._locked(campaign_id):
            atomic_write_json(folder / SENT_FILE, {"version": receipt.version})
        log.info("campaign %d: partial map sums of %d realisations sent", campaign_id, receipt.version)
        return True

    # ------------------------------------------------------------------ kept files the service asks for

    def serve_fetch(self, client: ServiceClient, request: KeptFileRequest) -> bool:
        """Send a kept file the service asked for, once checked against the recorded size and SHA-256; else tell
        the service why not (outside the store, gone, damaged). True when it was sent."""
        assert self.worker_id is not None
        path = Path(request.path)
        reason = None
        if not path.resolve().is_relative_to(self.root.resolve()):
            reason = f"{path} is not in the site's store {self.root}"
        elif not path.is_file():
            reason = f"{path} is missing at the site"
        elif path.stat().st_size != request.size_bytes or sha256_file(path) != request.sha256:
            reason = f"{path} at the site does not have the recorded size and SHA-256 (damaged or replaced)"
        try:
            if reason is not None:
                log.error("campaign %d realisation %d: cannot send its %s: %s", request.campaign_id,
                          request.realization, request.role, reason)  # fmt: skip
                client.kept_file_failed(self.worker_id, request, reason)
                return False
            client.send_kept_file(self.worker_id, request, path)
        except ServiceError as error:
            log.warning("campaign %d realisation %d: kept %s not sent: %s", request.campaign_id, request.realization,
                        request.role, error)  # fmt: skip
            return False
        log.info(
            "campaign %d realisation %d: kept %s sent on request",
            request.campaign_id,
            request.realization,
            request.role,
        )
        return True

    def send_all(self, client: ServiceClient) -> None:
        """Send every campaign's unsent sums now (the worker starts or stops)."""
        for campaign_id in self.campaigns():
            self.send(client, campaign_id, force=True)
