"""HTTP for uploaded instrument files (user tokens)."""

from __future__ import annotations

from functools import partial
from pathlib import Path as FilePath
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Path, Query, Request, Response, status
from fastapi.responses import FileResponse

from campaignlib.instrument import UPLOADS
from schemas.api import INSTRUMENT_MEDIA_TYPES, ErrorBody, InstrumentFile, InstrumentFileKind, ValidationErrorBody
from service.db import get_database
from service.deps import CurrentUser, CurrentWorker, DatabaseDep, ReadSessionDep, SettingsDep
from service.errors import UnsupportedMediaType
from service.instruments import service
from service.limits import declared_length, receive_to_file, stream_body

router = APIRouter(
    prefix="/instrument-files",
    tags=["instruments"],
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}},
)


_SHA256 = Annotated[str, Path(pattern="^[0-9a-f]{64}$", description="SHA-256 of the uploaded file")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=InstrumentFile,
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "The file: a TOAST focal plane (HDF5) or schedule (ECSV)",
            "content": {
                media_type: {"schema": {"type": "string", "format": "binary"}}
                for media_type in sorted(set(INSTRUMENT_MEDIA_TYPES.values()))
            },
        }
    },
    responses={
        200: {"model": InstrumentFile, "description": "You uploaded the same bytes before: the same record"},
        408: {"model": ErrorBody, "description": "The body stopped arriving (MAPCAMPAIGN_UPLOAD_IDLE_TIMEOUT_S)"},
        409: {"model": ErrorBody, "description": "The service has no instrument_root"},
        413: {"model": ErrorBody, "description": "Over MAPCAMPAIGN_MAX_UPLOAD_BYTES, or over your upload quota"},
        415: {"model": ErrorBody},
        422: {"model": ValidationErrorBody},
    },
)
async def upload_instrument_file(
    request: Request,
    user: CurrentUser,
    settings: SettingsDep,
    response: Response,
    kind: Annotated[InstrumentFileKind, Query(description="What the file is")],
    content_type: Annotated[str | None, Header()] = None,
) -> InstrumentFile:
    """Check a TOAST focal-plane or schedule file as a campaign's would be checked, and keep it once, by its
    sha256, under the service's instrument_root (``uploads/<sha256>.h5`` or ``.ecsv``); a spec then names it by
    that ``file`` and ``sha256``. The body's media type is ``application/x-hdf5`` for a focal plane and
    ``text/x-ecsv`` for a schedule. A file that does not check: 422 naming the column, nothing stored.

    The token, the media type and a declared size are checked before the body is read; the body may be
    ``MAPCAMPAIGN_MAX_UPLOAD_BYTES`` long, and a user keeps at most ``MAPCAMPAIGN_UPLOAD_QUOTA_BYTES`` of
    uploads (413 ``quota_exceeded``). 201 for a file new to you, 200 for one you uploaded before."""
    expected = INSTRUMENT_MEDIA_TYPES[kind]
    given = (content_type or "").split(";")[0].strip().lower()
    if given != expected:
        raise UnsupportedMediaType(f"a {kind} file is sent as {expected}, not {given or 'no media type'}")
    database = get_database(request)
    await anyio.to_thread.run_sync(
        partial(
            service.check_declared_upload,
            database=database,
            owner_id=user.user_id,
            instrument_root=settings.instrument_root,
            declared_bytes=declared_length(request.scope),
            quota=settings.upload_quota_bytes,
        )
    )
    received = await receive_to_file(
        stream_body(request, max_bytes=settings.max_upload_bytes, idle_timeout_s=settings.upload_idle_timeout_s),
        folder=FilePath(settings.instrument_root or ".") / UPLOADS,
    )
    record, new = await anyio.to_thread.run_sync(
        partial(
            service.store_upload,
            database=database,
            owner_id=user.user_id,
            instrument_root=settings.instrument_root,
            kind=kind,
            received=received,
            quota=settings.upload_quota_bytes,
            file_mode=settings.upload_file_permissions,
        )
    )
    if not new:
        response.status_code = status.HTTP_200_OK
    return record


@router.get("", response_model=list[InstrumentFile])
def list_instrument_files(user: CurrentUser, session: ReadSessionDep) -> list[InstrumentFile]:
    """Your uploads, newest first (each file you uploaded, once)."""
    return service.list_uploads(session=session, owner_id=user.user_id)


@router.delete(
    "/{sha256}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody, "description": "A campaign still uses it"}},
)
def delete_instrument_file(user: CurrentUser, database: DatabaseDep, settings: SettingsDep, sha256: _SHA256) -> Response:
    """Delete your upload of this file: refused (409) while one of your campaigns that is not finished names
    it. The bytes are removed when no other user keeps the same file and no unfinished campaign names it."""
    service.delete_upload(
        database=database, owner_id=user.user_id, instrument_root=settings.instrument_root, sha256=sha256
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{sha256}",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/x-hdf5": {}, "text/x-ecsv": {}}, "description": "The file's bytes"},
        404: {"model": ErrorBody},
    },
)
def download_instrument_file(
    _worker: CurrentWorker,
    settings: SettingsDep,
    sha256: _SHA256,
) -> FileResponse:
    """An uploaded file's bytes, by its checksum (worker tokens): a site that does not share the service's
    instrument folder fetches the uploads its campaigns name into its own ``instrument_root``."""
    path = service.uploaded_file(instrument_root=settings.instrument_root, sha256=sha256)
    media_type = INSTRUMENT_MEDIA_TYPES["focal-plane" if path.suffix == ".h5" else "ground-schedule"]
    return FileResponse(path, media_type=media_type, filename=path.name)
