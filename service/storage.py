"""The service's campaign files: the one module that knows the paths under ``<data dir>/campaigns/``.

Layout under ``Settings.products_dir`` (``<data dir>/campaigns``)::

    <id>/realizations/<index>/<name>                            accepted products of a realisation
    <id>/realizations/.staging/attempt-<attempt id>/<name>      uploads of one attempt, each with
    <id>/realizations/.staging/attempt-<attempt id>/<name>.sha256   its note "<sha256> <size>"
    <id>/products/state.json                                    Monte Carlo aggregates (service.products.aggregates)
    <id>/products/mapsums-<generation>.npz                      their per-pixel map sums
    <id>/products/mask.fits                                     the analysis mask, stored once per campaign
    <id>/products/.lock                                         per-campaign lock of the aggregates
    <id>/products/cache/g<generation>-<name>                    downloads and images of one generation
    <id>/products/realization-cache/r<index>-<name>             one realisation's downloads in other formats
    <id>/products/sitesums-<site>-<version>/                   a site's partial map sums (service.products.mapsums)
    <id>/quicklook/<index>-<sha256[:16]>-<I|Q|U>.png            quick-look images of a realisation's map
    .fetches/<site>/c<id>-r<index>-<role>.json                  kept files asked of a site (service.keptfiles)

Deleting a campaign removes its folder, and with it all of the above.

:class:`CampaignStorage` names the folders of a campaign, :class:`CampaignProducts` the
files of its aggregates, and :class:`ArtifactStore` keeps the products a worker uploads for
a realisation before it reports success: an upload is written to a temporary file, hashed on
the way, checked against the sha256 the worker sent, then renamed into the attempt's staging
folder with a ``<name>.sha256`` note beside it. When the success report is accepted, the
staging folder is checked against the result's ``products`` list and renamed as a whole to
the realisation's folder: readers see all the products or none.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from schemas.api import is_valid_artifact_name
from schemas.files import atomic_write_text
from schemas.result import ProductFile
from service.errors import InsufficientStorage, Invalid, TooLarge

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_NOTE = ".sha256"

log = logging.getLogger("mapcampaign.service")


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class CampaignStorage:
    """The folders of every campaign under ``root``."""

    root: Path  # Settings.products_dir: <data dir>/campaigns

    def campaign_dir(self, campaign_id: int) -> Path:
        return self.root / str(campaign_id)

    def realizations_dir(self, campaign_id: int) -> Path:
        return self.campaign_dir(campaign_id) / "realizations"

    def realization_dir(self, campaign_id: int, index: int) -> Path:
        """Where the accepted products of a realisation are."""
        return self.realizations_dir(campaign_id) / str(index)

    def product_path(self, campaign_id: int, index: int, name: str) -> Path:
        """One accepted product file of a realisation (``name`` as in the result's ``products``)."""
        return self.realization_dir(campaign_id, index) / name

    def staging_root(self, campaign_id: int) -> Path:
        """The uploads of every attempt of the campaign."""
        return self.realizations_dir(campaign_id) / ".staging"

    def staging_dir(self, campaign_id: int, attempt_id: int) -> Path:
        return self.staging_root(campaign_id) / f"attempt-{attempt_id}"

    def aggregates_dir(self, campaign_id: int) -> Path:
        return self.campaign_dir(campaign_id) / "products"

    def quicklook_image(self, campaign_id: int, index: int, sha256: str, field: str) -> Path:
        """The quick-look PNG of one field of a realisation's map; the map's checksum is in the name."""
        return self.campaign_dir(campaign_id) / "quicklook" / f"{index}-{sha256[:16]}-{field}.png"

    def delete_campaign(self, campaign_id: int) -> None:
        """Remove every file of the campaign: products, uploads, aggregates, images."""
        shutil.rmtree(self.campaign_dir(campaign_id), ignore_errors=True)


@dataclass(frozen=True)
class CampaignProducts:
    """The files of one campaign's Monte Carlo aggregates (their logic: ``service.products.aggregates``)."""

    products_dir: Path  # Settings.products_dir: <data dir>/campaigns
    campaign_id: int

    @property
    def storage(self) -> CampaignStorage:
        return CampaignStorage(self.products_dir)

    @property
    def root(self) -> Path:
        return self.storage.aggregates_dir(self.campaign_id)

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    def unreadable_state_path(self) -> Path:
        """A new name beside ``state.json`` to keep a state that cannot be read."""
        return self.state_path.with_name(f"state.json.unreadable-{uuid.uuid4().hex[:8]}")

    @property
    def lock_path(self) -> Path:
        return self.root / ".lock"

    @property
    def mask_path(self) -> Path:
        return self.root / "mask.fits"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def map_sums_path(self, generation: int) -> Path:
        return self.root / f"mapsums-{generation:09d}.npz"

    def map_sums_files(self) -> Iterator[Path]:
        """Every map-sum file in the folder, of any generation."""
        return self.root.glob("mapsums-*.npz")

    def site_sums_dir(self, site: str, version: int) -> Path:
        """A site's partial map sums of one version, as .npy files read by memory map (``sitesums-<site>-<version>/``)."""
        return self.root / f"sitesums-{site}-{version:09d}"

    def site_sums_files(self) -> Iterator[Path]:
        """Every site-sum folder, of any site and version."""
        return self.root.glob("sitesums-*")

    def bandpower_sums_path(self, generation: int) -> Path:
        """Running mean and co-moment of the decoupled bandpowers of one generation (``bpsums-<generation>.npz``)."""
        return self.root / f"bpsums-{generation:09d}.npz"

    def bandpower_sums_files(self) -> Iterator[Path]:
        """Every bandpower-sum file in the folder, of any generation."""
        return self.root.glob("bpsums-*.npz")

    def cache_path(self, generation: int, name: str) -> Path:
        """Where a file derived from one generation of the aggregates is kept (``cache/g<generation>-<name>``)."""
        return self.cache_dir / f"g{generation}-{name}"

    @staticmethod
    def cache_generation(file_name: str) -> int | None:
        """The generation in a cache file's name; None for a name :meth:`cache_path` did not make."""
        head = file_name.split("-", 1)[0]
        return int(head[1:]) if head.startswith("g") and head[1:].isdigit() else None

    def realization_dir(self, index: int) -> Path:
        """Where the accepted products of a realisation are (see :class:`ArtifactStore`)."""
        return self.storage.realization_dir(self.campaign_id, index)

    def realization_cache_path(self, index: int, name: str) -> Path:
        """A realisation's download in another format than uploaded (``realization-cache/r<index>-<name>``)."""
        return self.root / "realization-cache" / f"r{index}-{name}"


# --------------------------------------------------------------------------- uploads


def _storage_failed(what: str, error: OSError) -> InsufficientStorage:
    """507 naming the operating system's cause (``No space left on device``, ``File too large``, ...)."""
    cause = f"[Errno {error.errno}] {error.strerror or os.strerror(error.errno or 0)}"
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        cause += " (the service's data folder is full or over a size limit)"
    log.warning("could not store %s: %s", what, cause)
    return InsufficientStorage(f"the service could not store {what}: {cause}; nothing was kept, try again later")


class ArtifactRejected(Invalid):
    code = "artifact_rejected"


class ArtifactTooLarge(TooLarge):
    code = "artifact_too_large"


class ProductsMissing(Invalid):
    code = "products_missing"


class ArtifactStore:
    """Uploads of realisations' products: staged per attempt, published as a whole when the result is accepted."""

    def __init__(self, products_dir: Path):
        self.layout = CampaignStorage(products_dir)

    @staticmethod
    def check_name(name: str) -> None:
        if not is_valid_artifact_name(name) or name.endswith(_NOTE):
            raise ArtifactRejected(
                f"artifact name {name!r}: use 1-128 letters, digits and _.+- starting with a letter or digit, "
                f"no '..', not ending in {_NOTE}"
            )

    @staticmethod
    def check_sha256(value: str | None) -> str:
        if value is None or not SHA256_HEX.match(value.strip().lower()):
            raise ArtifactRejected("header X-Content-SHA256: 64 lower-case hex digits of the body's SHA-256 required")
        return value.strip().lower()

    async def receive(
        self,
        chunks: AsyncIterator[bytes],
        *,
        campaign_id: int,
        attempt_id: int,
        name: str,
        sha256: str,
        max_bytes: int,
    ) -> int:
        """Store one upload in the attempt's staging folder; return its size. Replaces an earlier upload."""
        staging = self.layout.staging_dir(campaign_id, attempt_id)
        partial = staging / f".upload-{uuid.uuid4().hex}"
        note = staging / (name + _NOTE)
        # The body is hashed as it is written (not read back), from an async stream that
        # schemas.files.atomic_write's synchronous writer cannot take: hence the file handled here.
        # Each chunk is written as it arrives, between awaits of the request body (local file, small chunks).
        digest = hashlib.sha256()
        size = 0
        try:
            staging.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as handle:  # noqa: ASYNC230
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise ArtifactTooLarge(f"artifact {name!r} is larger than the limit of {max_bytes} bytes")
                    digest.update(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            if digest.hexdigest() != sha256:
                raise ArtifactRejected(
                    f"artifact {name!r}: the body's SHA-256 is {digest.hexdigest()}, not {sha256} (X-Content-SHA256)"
                )
            # The note is what makes an upload count (check_products): an earlier upload's note goes
            # first, the new one is written last and atomically.
            note.unlink(missing_ok=True)
            os.replace(partial, staging / name)
            atomic_write_text(note, f"{sha256} {size}\n")
        except OSError as error:
            # A write that failed (disk full, EFBIG, ...): no file of this name may look uploaded.
            for leftover in (note, staging / name):
                try:
                    leftover.unlink(missing_ok=True)
                except OSError:
                    pass
            raise _storage_failed(f"artifact {name!r}", error) from None
        finally:
            try:
                partial.unlink(missing_ok=True)
            except OSError:
                pass
        return size

    def check_products(self, *, campaign_id: int, attempt_id: int, products: list[ProductFile]) -> None:
        staging = self.layout.staging_dir(campaign_id, attempt_id)
        problems = []
        for product in products:
            if product.kept is not None:
                continue  # kept at the site: the service records where, it never holds the bytes
            if not is_valid_artifact_name(product.path):
                problems.append(f"{product.path!r} is not a valid artifact name")
                continue
            note = staging / (product.path + _NOTE)
            if not note.is_file() or not (staging / product.path).is_file():
                problems.append(f"{product.path!r} was not uploaded")
                continue
            sha256, size = note.read_text().split()
            if sha256 != product.sha256.lower() or int(size) != product.size_bytes:
                problems.append(
                    f"{product.path!r} uploaded with sha256 {sha256[:12]}... and {size} bytes, "
                    f"result says {product.sha256[:12]}... and {product.size_bytes} bytes"
                )
        if problems:
            raise ProductsMissing("result.products: " + "; ".join(problems))

    def publish(
        self, *, campaign_id: int, attempt_id: int, index: int, products: list[ProductFile]
    ) -> Callable[[], None]:
        """Move the attempt's products into the realisation folder in one rename; return an undo."""
        staging = self.layout.staging_dir(campaign_id, attempt_id)
        final = self.layout.realization_dir(campaign_id, index)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            staging.mkdir(parents=True, exist_ok=True)
            keep = {product.path for product in products if product.kept is None}
            for entry in staging.iterdir():
                if entry.name not in keep:  # notes, partial uploads, files the result does not name
                    entry.unlink(missing_ok=True) if entry.is_file() else shutil.rmtree(entry, ignore_errors=True)
            if final.exists():
                # Only a crash between a rename and its commit leaves this: that result was never accepted.
                leftover = final.with_name(f".replaced-{index}-{uuid.uuid4().hex}")
                os.rename(final, leftover)
                shutil.rmtree(leftover, ignore_errors=True)
            os.rename(staging, final)
        except OSError as error:  # nothing was moved into place, so nothing is accepted
            raise _storage_failed(f"the products of realisation {index}", error) from None

        def undo() -> None:
            os.rename(final, staging)

        return undo

    def discard(self, *, campaign_id: int, attempt_id: int | None = None) -> None:
        """Drop the uploads of one ended attempt, or of every attempt of the campaign."""
        folder = (
            self.layout.staging_dir(campaign_id, attempt_id)
            if attempt_id is not None
            else self.layout.staging_root(campaign_id)
        )
        shutil.rmtree(folder, ignore_errors=True)
