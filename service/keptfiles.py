"""Realisation maps kept at their site (site setting ``products.maps = "keep"``): read there, or fetched through a worker.

The result records each kept file's site, absolute path, size and SHA-256 (``ProductFile.kept``). A
download reads the file at that path when the service's host sees the site's store (one machine, or a
shared file system) and the file has the recorded size and checksum; the check is remembered beside
the realisation's downloads by the file's modification time and size, so a large map is hashed once,
not on every download. A file there with another size or checksum is damaged: a permanent 404.

When the service cannot read the path, it asks the site: a request file
``<products>/fetches/<site>/c<campaign>-r<index>-<role>.json`` that the site's workers list
(``GET /workers/{id}/fetches``) and answer by uploading the file (checked against the recorded size
and SHA-256 before it is kept, in the realisation's download cache) or by saying why they cannot (the
file is gone or damaged at the site). Meanwhile a download answers 202 with Retry-After; a refusal, a
damaged upload, or a site with no registered worker is a 404 naming the reason, never a 202.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas.files import atomic_write_json, sha256_file
from service.errors import DomainError, NotFound
from service.storage import CampaignProducts
from service.workers.models import Worker

FETCH_RETRY_AFTER_S = 5
MAX_LISTED_FETCHES = 16


class KeptFileUnavailable(NotFound):
    """A kept map the service cannot read at its site's path, or whose size or checksum differ."""

    code = "kept_file_unavailable"


class KeptFilePending(DomainError):
    """The site's worker was asked for the file and has not sent it yet: ask again after Retry-After."""

    status_code = 202
    code = "kept_file_pending"

    def __init__(self, detail: str):
        super().__init__(detail)
        self.headers = {"Retry-After": str(FETCH_RETRY_AFTER_S)}


def readable_here(path: Path) -> bool:
    """Whether the service's host reads the site's path (one machine, or a shared file system)."""
    return os.access(path, os.R_OK)


def sites_with_workers(session: Session) -> set[str]:
    """The sites with a registered worker: those that can answer a fetch request."""
    return set(session.scalars(select(Worker.site).distinct()))


def fetch_root(products_dir: Path) -> Path:
    return products_dir / ".fetches"  # beside the campaigns folders, not one of them


def request_path(products_dir: Path, site: str, campaign_id: int, index: int, role: str) -> Path:
    return fetch_root(products_dir) / site / f"c{campaign_id}-r{index}-{role}.json"


def fetched_path(files: CampaignProducts, index: int, role: str) -> Path:
    """Where a kept file fetched through its site's worker is kept (the realisation's download cache)."""
    return files.realization_cache_path(index, f"kept-{role}.fetched")


def read_request(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pending_requests(products_dir: Path, site: str) -> list[dict[str, Any]]:
    """The site's pending fetch requests, oldest first, at most ``MAX_LISTED_FETCHES``."""
    folder = fetch_root(products_dir) / site
    found = []
    for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []:
        request = read_request(path)
        if request is not None and request.get("state") == "pending":
            found.append(request)
            if len(found) == MAX_LISTED_FETCHES:
                break
    return found


def fail_request(products_dir: Path, request: dict[str, Any], reason: str) -> None:
    path = request_path(products_dir, request["site"], request["campaign_id"], request["realization"], request["role"])
    atomic_write_json(path, {**request, "state": "failed", "reason": reason[:1_000]})


def accept_fetched(files: CampaignProducts, request: dict[str, Any], received: Path, sha256: str, size: int) -> Path:
    """Keep an uploaded kept file once its size and SHA-256 are the recorded ones; else fail the request (ValueError)."""
    products_dir = files.products_dir
    if size != int(request["size_bytes"]) or sha256 != request["sha256"]:
        reason = (
            f"the site sent {size} bytes with SHA-256 {sha256[:12]}..., the result recorded "
            f"{request['size_bytes']} bytes and {request['sha256'][:12]}... (damaged at the site)"
        )
        fail_request(products_dir, request, reason)
        raise ValueError(reason)
    target = fetched_path(files, request["realization"], request["role"])
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(received, target)
    status = os.stat(target)
    proof = {"path": str(target), "mtime_ns": status.st_mtime_ns, "size": status.st_size, "sha256": sha256}
    atomic_write_json(target.with_name(target.name + ".verified.json"), proof)
    request_path(products_dir, request["site"], request["campaign_id"], request["realization"], request["role"]).unlink(
        missing_ok=True
    )
    return target


def kept_state(files: CampaignProducts, index: int, product: dict[str, Any]) -> dict[str, str]:
    """Where a kept file stands for a reader, without asking the site: ``state`` is ``readable`` (the service
    reads the site's path), ``ready`` (fetched), ``pending`` (the site's worker is asked), ``failed`` (with
    ``reason``) or ``at-site`` (fetched when first opened)."""
    kept = product["kept"]
    if readable_here(Path(kept["path"])):
        return {"state": "readable", "site": kept["site"]}
    if fetched_path(files, index, product["name"]).is_file():
        return {"state": "ready", "site": kept["site"]}
    request = read_request(request_path(files.products_dir, kept["site"], files.campaign_id, index, product["name"]))
    if request is None:
        return {"state": "at-site", "site": kept["site"]}
    if request.get("state") == "failed":
        return {"state": "failed", "site": kept["site"], "reason": str(request.get("reason"))}
    return {"state": "pending", "site": kept["site"]}


def kept_source(
    files: CampaignProducts, index: int, product: dict[str, Any], *, site_has_workers: Callable[[str], bool]
) -> Path:
    """The path of a kept product with the recorded size and SHA-256: at the site's path, or fetched.

    Raises :class:`KeptFilePending` while the site's worker is asked for it, :class:`KeptFileUnavailable`
    when it is damaged or the site cannot send it. ``site_has_workers(site)``: a worker of that site is
    registered (else nobody would answer a request).
    """
    kept = product["kept"]
    path = Path(kept["path"])
    where = f"realisation {index}'s {product['name']} file is kept at site {kept['site']!r} ({path})"
    if readable_here(path):
        proof = files.realization_cache_path(index, f"kept-{product['name']}.verified.json")
        return _verified(path, product, proof, where)
    fetched = fetched_path(files, index, product["name"])
    if fetched.is_file():
        return _verified(fetched, product, fetched.with_name(fetched.name + ".verified.json"), where)
    request_file = request_path(files.products_dir, kept["site"], files.campaign_id, index, product["name"])
    request = read_request(request_file)
    if request is not None and request.get("state") == "failed":
        raise KeptFileUnavailable(f"{where}: the site cannot send it: {request.get('reason')}")
    if not site_has_workers(kept["site"]):
        raise KeptFileUnavailable(f"{where}: the service cannot read it, and no worker of the site is registered")
    if request is None:
        atomic_write_json(
            request_file,
            {
                "state": "pending", "site": kept["site"], "campaign_id": files.campaign_id, "realization": index,
                "role": product["name"], "path": kept["path"], "sha256": product["sha256"],
                "size_bytes": int(product["size_bytes"]),
            },
        )  # fmt: skip
    raise KeptFilePending(f"{where}: the site's worker is asked to send it; ask again in {FETCH_RETRY_AFTER_S} s")


def _verified(path: Path, product: dict[str, Any], proof: Path, where: str) -> Path:
    """``path`` once its size and SHA-256 are the product's (the check remembered in ``proof`` by mtime and size)."""
    try:
        status = os.stat(path)
    except OSError:
        raise KeptFileUnavailable(f"{where}: the service cannot read it there") from None
    if status.st_size != int(product["size_bytes"]):
        raise KeptFileUnavailable(
            f"{where}: it has {status.st_size} bytes, the result recorded {product['size_bytes']}"
        )
    seen = {"path": str(path), "mtime_ns": status.st_mtime_ns, "size": status.st_size, "sha256": product["sha256"]}
    try:
        if json.loads(proof.read_text()) == seen:
            return path
    except (OSError, ValueError):
        pass
    try:
        digest = sha256_file(path)
    except OSError:
        raise KeptFileUnavailable(f"{where}: the service cannot read it there") from None
    if digest != product["sha256"]:
        raise KeptFileUnavailable(f"{where}: its SHA-256 is not the one the result recorded (damaged or replaced)")
    proof.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(proof, seen)
    return path
