"""Uploaded TOAST files: checked, kept once by sha256 under the instrument_root, and owned by their uploaders.

The file lands in ``<instrument_root>/uploads/<sha256>.h5`` (a focal plane) or ``.ecsv`` (a schedule), where a
spec names it like any file under the root, with the permissions of ``upload_file_mode`` (0640 by default:
a site reading the shared folder as another account of the service's group reads it). Each uploader has a
row in ``instrument_uploads``: the same bytes uploaded by two users are one file and two rows. A user's
rows count against the user's quota; a user deletes their own row, and the file goes with the last row.
A file that does not check is refused with the column named and never written under the root.

The body arrives as chunks (``service.limits.stream_body``) into a temporary ``.upload-*`` file beside its
target (``service.limits.receive_to_file``); a reader never sees a partial file. A temporary file left by a stopped service is removed at the
next start (:func:`sweep_stale_uploads`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sqlalchemy import String, cast, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from schemas.api import InstrumentFile
from schemas.files import move_into_place
from schemas.instrument import UPLOAD_SUFFIXES, UPLOADS, FocalPlaneFileError, check_instrument_file, upload_path
from schemas.states import UNFINISHED_CAMPAIGN_STATES
from service.campaigns.models import Campaign
from service.db import Database
from service.errors import Conflict, InsufficientStorage, InvalidField, NotFound, TooLarge
from service.instruments.models import InstrumentUpload
from service.limits import ReceivedFile

log = logging.getLogger("mapcampaign.service")

TEMPORARY_PREFIX = ".upload-"  # service.limits.receive_to_file's files
# A temporary file not written to for this long belongs to no running upload (an upload that pauses longer
# than upload_idle_timeout_s, at most an hour, is cut off): it is swept at start-up.
STALE_UPLOAD_AGE_S = 2 * 3_600.0


class QuotaExceeded(TooLarge):
    code = "quota_exceeded"


def _root(instrument_root: Path | None) -> Path:
    if instrument_root is None:
        raise Conflict("this service has no instrument_root (MAPCAMPAIGN_INSTRUMENT_ROOT) to keep instrument files in")
    return Path(instrument_root)


def _used_bytes(session: Session, owner_id: int) -> int:
    total = session.scalar(select(func.coalesce(func.sum(InstrumentUpload.size_bytes), 0)).where(
        InstrumentUpload.owner_id == owner_id
    ))
    return int(total or 0)


def _refuse_over_quota(used: int, adding: int, quota: int) -> None:
    if used + adding > quota:
        raise QuotaExceeded(
            f"upload quota exceeded: you keep {used} bytes of instrument files, this file is {adding} bytes and the "
            f"quota is {quota} bytes (MAPCAMPAIGN_UPLOAD_QUOTA_BYTES); delete uploads you no longer need "
            "(DELETE /api/v1/instrument-files/<sha256>)"
        )


def check_declared_upload(
    *, database: Database, owner_id: int, instrument_root: Path | None, declared_bytes: int | None, quota: int
) -> None:
    """Before a byte of the body is read: the service keeps uploads, and a declared size could fit the quota.

    Only a body larger than the whole quota is refused here: a file the user keeps already costs nothing
    more, and its checksum is not known before the body is read.
    """
    _root(instrument_root)
    if declared_bytes is not None and declared_bytes > quota:
        with database.session(write=False) as session:
            used = _used_bytes(session, owner_id)
        _refuse_over_quota(used, declared_bytes, quota)


def _record(row: InstrumentUpload) -> InstrumentFile:
    return InstrumentFile(
        sha256=row.sha256,
        kind=row.kind,
        file=upload_path(row.sha256, row.kind),
        size_bytes=row.size_bytes,
        detectors=row.entries if row.kind == "focal-plane" else None,
        scans=None if row.kind == "focal-plane" else row.entries,
    )


def store_upload(
    *,
    database: Database,
    owner_id: int,
    instrument_root: Path | None,
    kind: str,
    received: ReceivedFile,
    quota: int,
    file_mode: int,
) -> tuple[InstrumentFile, bool]:
    """Check the received file, record it as the owner's and put it in place; return its record and whether it
    is new *for this owner* (another user's upload of the same bytes is not revealed). Removes the temporary file.
    """
    root = _root(instrument_root)
    try:
        if received.size_bytes == 0:
            raise InvalidField(("body",), "the file is empty")
        relative = upload_path(received.sha256, kind)
        target = root / relative
        try:
            count = check_instrument_file(received.path, kind=kind, file=relative)
        except FocalPlaneFileError as error:  # a schedule's error is one too
            raise InvalidField(("body",), str(error)) from None
        with database.session() as session:
            row = session.scalar(
                select(InstrumentUpload).where(
                    InstrumentUpload.owner_id == owner_id, InstrumentUpload.sha256 == received.sha256
                )
            )
            new = row is None
            if row is None:
                _refuse_over_quota(_used_bytes(session, owner_id), received.size_bytes, quota)
                row = InstrumentUpload(
                    owner_id=owner_id, sha256=received.sha256, kind=kind, size_bytes=received.size_bytes, entries=count
                )
                session.add(row)
                try:
                    session.commit()
                except IntegrityError:  # the same user's same bytes, uploaded at the same moment
                    session.rollback()
                    new = False
            record = InstrumentFile(
                sha256=received.sha256,
                kind=kind,
                file=relative,
                size_bytes=received.size_bytes,
                detectors=count if kind == "focal-plane" else None,
                scans=None if kind == "focal-plane" else count,
            )
        # Put in place after the row is committed, and even when a file is there: a delete by another owner
        # that removed the last row before this one was committed may have removed it meanwhile.
        try:
            _open_folder_to(target.parent, file_mode)
            move_into_place(received.path, target, mode=file_mode)
        except OSError as error:
            raise InsufficientStorage(f"cannot keep the instrument file: {error.strerror or error}") from None
        if new:
            log.info("instrument file %s stored for user %d (%s, %d bytes)", relative, owner_id, kind, received.size_bytes)
        return record, new
    finally:
        received.path.unlink(missing_ok=True)


def _open_folder_to(folder: Path, file_mode: int) -> None:
    """Let whoever may read the files (group, others) also list the uploads folder, whatever the umask made it."""
    readers = file_mode & 0o044
    search = (readers >> 2) | readers  # read and search (x) for the same classes
    current = folder.stat().st_mode & 0o777
    if current & search != search:
        folder.chmod(current | search)


def list_uploads(*, session: Session, owner_id: int) -> list[InstrumentFile]:
    """The caller's uploads, newest first."""
    rows = session.scalars(
        select(InstrumentUpload)
        .where(InstrumentUpload.owner_id == owner_id)
        .order_by(InstrumentUpload.created_at.desc(), InstrumentUpload.id.desc())
    )
    return [_record(row) for row in rows]


def _unfinished_campaigns_naming(session: Session, sha256: str, owner_id: int | None) -> list[int]:
    """Ids of unfinished campaigns (of ``owner_id``, or of anyone) whose spec names a file with this checksum.

    A spec pins each file by its sha256, so the checksum in the stored spec's text is the file named (a
    match elsewhere in a spec would only make a delete more careful).
    """
    query = select(Campaign.id).where(
        Campaign.state.in_(UNFINISHED_CAMPAIGN_STATES), cast(Campaign.spec, String).contains(sha256)
    )
    if owner_id is not None:
        query = query.where(Campaign.owner_id == owner_id)
    return list(session.scalars(query.order_by(Campaign.id).limit(20)))


def delete_upload(*, database: Database, owner_id: int, instrument_root: Path | None, sha256: str) -> None:
    """Remove the owner's upload; the file goes too when no other user keeps it and no unfinished campaign
    names it. Refused (409) while one of the owner's unfinished campaigns names it; 404 when the owner has
    no such upload (whoever else has)."""
    root = _root(instrument_root)
    with database.session() as session:
        row = session.scalar(
            select(InstrumentUpload).where(InstrumentUpload.owner_id == owner_id, InstrumentUpload.sha256 == sha256)
        )
        if row is None:
            raise NotFound(f"you have no instrument file with sha256 {sha256}")
        using = _unfinished_campaigns_naming(session, sha256, owner_id)
        if using:
            raise Conflict(
                f"instrument file {sha256} is used by campaign(s) {', '.join(map(str, using))}, not finished yet: "
                "cancel them or wait for them to finish, then delete it"
            )
        kind = row.kind
        session.execute(delete(InstrumentUpload).where(InstrumentUpload.id == row.id))
        session.commit()
        others = session.scalar(select(func.count()).where(InstrumentUpload.sha256 == sha256))
        still_used = bool(_unfinished_campaigns_naming(session, sha256, None))
        session.rollback()
    if others or still_used:
        return
    (root / upload_path(sha256, kind)).unlink(missing_ok=True)
    log.info("instrument file %s removed (its last uploader deleted it)", upload_path(sha256, kind))


def uploaded_file(*, instrument_root: Path | None, sha256: str) -> Path:
    """The uploaded file with this checksum (a focal plane or a schedule), for a site that has no copy."""
    if instrument_root is None:
        raise NotFound("this service keeps no instrument files (no instrument_root)")
    for suffix in sorted(set(UPLOAD_SUFFIXES.values())):
        path = Path(instrument_root) / UPLOADS / f"{sha256}{suffix}"
        if path.is_file():
            return path
    raise NotFound(f"no instrument file with sha256 {sha256} was uploaded here")


def sweep_stale_uploads(instrument_root: Path | None, *, now: float | None = None) -> int:
    """Remove temporary upload files no running upload writes to (older than :data:`STALE_UPLOAD_AGE_S`);
    return how many. Called at start-up: an upload cut short by a stop leaves its temporary file."""
    if instrument_root is None:
        return 0
    folder = Path(instrument_root) / UPLOADS
    if not folder.is_dir():
        return 0
    now = time.time() if now is None else now
    removed = 0
    for path in folder.glob(f"{TEMPORARY_PREFIX}*"):
        try:
            if path.is_file() and now - path.stat().st_mtime > STALE_UPLOAD_AGE_S:
                path.unlink()
                removed += 1
        except OSError:
            continue  # gone meanwhile, or not ours to remove: not a reason to refuse to start
    if removed:
        log.info("removed %d stale temporary upload file(s) from %s", removed, folder)
    return removed
