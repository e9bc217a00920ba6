"""Realisation maps kept at their site (site setting ``products.maps = "keep"``): served when the service can read them.

The result records each kept file's site, absolute path, size and SHA-256 (``ProductFile.kept``). A
download reads the file at that path when the service's host sees the site's store (one machine, or a
shared file system) and the file still has the recorded size and checksum; the check is remembered
beside the realisation's downloads by the file's modification time and size, so a large map is hashed
once, not on every download. Otherwise the answer is a 404 naming the site and the path: the file is
not readable from here, and asking again will not change that.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from schemas.files import atomic_write_json, sha256_file
from service.errors import NotFound
from service.storage import CampaignProducts


class KeptFileUnavailable(NotFound):
    """A kept map the service cannot read at its site's path, or whose size or checksum differ."""

    code = "kept_file_unavailable"


def kept_source(files: CampaignProducts, index: int, product: dict[str, Any]) -> Path:
    """The path of a kept product once its size and SHA-256 are those recorded; else :class:`KeptFileUnavailable`."""
    kept = product["kept"]
    path = Path(kept["path"])
    where = f"realisation {index}'s {product['name']} file is kept at site {kept['site']!r} ({path})"
    try:
        status = os.stat(path)
    except OSError:
        raise KeptFileUnavailable(f"{where}: the service cannot read it there") from None
    if status.st_size != int(product["size_bytes"]):
        raise KeptFileUnavailable(
            f"{where}: it has {status.st_size} bytes, the result recorded {product['size_bytes']}"
        )
    proof = files.realization_cache_path(index, f"kept-{product['name']}.verified.json")
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
