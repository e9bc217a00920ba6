"""Store an uploaded TOAST file under the instrument_root, named by its sha256, after checking it.

The file lands in ``<instrument_root>/uploads/<sha256>.h5`` (a focal plane) or ``.ecsv`` (a schedule), where a
spec names it like any file under the root. The same bytes uploaded again find the file already there and
get the same record; nothing but the file is stored (its name is its checksum, its record is read from it).
A file that does not check is refused with the column named and never written under the root.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from schemas.api import InstrumentFile
from schemas.instrument import UPLOAD_SUFFIXES, UPLOADS, FocalPlaneFileError, check_instrument_file, upload_path
from service.errors import Conflict, InsufficientStorage, InvalidField, NotFound

log = logging.getLogger("mapcampaign.service")


def store_instrument_file(*, instrument_root: Path | None, kind: str, content: bytes) -> tuple[InstrumentFile, bool]:
    """Check and keep ``content``; return its record and whether it was new (False: the same bytes were there)."""
    if instrument_root is None:
        raise Conflict("this service has no instrument_root (MAPCAMPAIGN_INSTRUMENT_ROOT) to keep instrument files in")
    if not content:
        raise InvalidField(("body",), "the file is empty")
    digest = hashlib.sha256(content).hexdigest()
    relative = upload_path(digest, kind)
    target = Path(instrument_root) / relative
    # Checked from a temporary file beside the target (the readers take paths), renamed into place once good:
    # a reader never sees a partial file, and two uploads of the same bytes write the same content.
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".upload-", suffix=target.suffix)
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
    except OSError as error:
        raise InsufficientStorage(f"cannot write the instrument file: {error.strerror or error}") from None
    try:
        try:
            count = check_instrument_file(Path(temporary), kind=kind, file=relative)
        except FocalPlaneFileError as error:  # a schedule's error is one too
            raise InvalidField(("body",), str(error)) from None
        new = not target.exists()
        if new:
            os.replace(temporary, target)
            log.info("instrument file %s stored (%s, %d bytes)", relative, kind, len(content))
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    record = InstrumentFile(
        sha256=digest,
        kind=kind,
        file=relative,
        size_bytes=len(content),
        detectors=count if kind == "focal-plane" else None,
        scans=None if kind == "focal-plane" else count,
    )
    return record, new


def uploaded_file(*, instrument_root: Path | None, sha256: str) -> Path:
    """The uploaded file with this checksum (a focal plane or a schedule), for a site that has no copy."""
    if instrument_root is None:
        raise NotFound("this service keeps no instrument files (no instrument_root)")
    for suffix in sorted(set(UPLOAD_SUFFIXES.values())):
        path = Path(instrument_root) / UPLOADS / f"{sha256}{suffix}"
        if path.is_file():
            return path
    raise NotFound(f"no instrument file with sha256 {sha256} was uploaded here")
