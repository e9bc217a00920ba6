"""Uploaded instrument files a task names, fetched from the service into the site's instrument_root.

A spec names an uploaded file as ``uploads/<sha256>.h5`` (or ``.ecsv``) under the instrument_root. A site that
shares the service's instrument folder already has it; one that does not fetches it by its checksum before the
task starts, checks the bytes against that checksum, and keeps it for the next task. A file the service does
not have is left for the map-maker to refuse (a bad input, exit status 2, the file named).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from campaignlib.instrument import UPLOADS
from schemas.files import atomic_write_bytes
from schemas.spec import CampaignSpec, GroundScheduleScan, SatelliteScheduleScan
from worker.client import ServiceClient, ServiceError

log = logging.getLogger("mapcampaign.worker")


def uploaded_files(spec: CampaignSpec) -> list[tuple[str, str]]:
    """(file, sha256) of each uploaded file the spec names (its focal plane's and its schedule's)."""
    named = []
    if spec.focal_plane.file is not None and spec.focal_plane.sha256 is not None:
        named.append((spec.focal_plane.file, spec.focal_plane.sha256))
    if isinstance(spec.scan, (GroundScheduleScan, SatelliteScheduleScan)):
        named.append((spec.scan.file, spec.scan.sha256))
    return [(file, sha256) for file, sha256 in named if file.startswith(f"{UPLOADS}/")]


def fetch_uploads(spec: CampaignSpec, instrument_root: Path | None, client: ServiceClient) -> list[Path]:
    """Fetch the uploaded files the spec names that this site lacks; return those written.

    Raises :class:`ServiceError` when the service cannot be asked (the task is given back, a site error) or
    sends other bytes than the checksum says.
    """
    if instrument_root is None:
        return []
    written = []
    for file, sha256 in uploaded_files(spec):
        target = Path(instrument_root) / file
        if target.is_file():
            continue
        try:
            content = client.instrument_file(sha256)
        except ServiceError as error:
            if error.status == 404:
                continue  # not uploaded there: the map-maker refuses the spec, naming the file
            raise
        if hashlib.sha256(content).hexdigest() != sha256:
            raise ServiceError(f"the service sent other bytes for {file} than its sha256 says")
        atomic_write_bytes(target, content)  # whole or not at all; two workers write the same bytes
        log.info("fetched %s from the service (%d bytes)", file, len(content))
        written.append(target)
    return written
