"""HTTP for uploaded instrument files (user tokens)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Response, status
from fastapi.responses import FileResponse

from schemas.api import INSTRUMENT_MEDIA_TYPES, ErrorBody, InstrumentFile, InstrumentFileKind, ValidationErrorBody
from service.deps import CurrentUser, CurrentWorker, SettingsDep
from service.errors import DomainError
from service.instruments import service

router = APIRouter(
    prefix="/instrument-files",
    tags=["instruments"],
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}},
)


class UnsupportedMediaType(DomainError):
    status_code = 415
    code = "unsupported_media_type"


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=InstrumentFile,
    responses={
        200: {"model": InstrumentFile, "description": "The same bytes were uploaded before: the same record"},
        409: {"model": ErrorBody, "description": "The service has no instrument_root"},
        413: {"model": ErrorBody},
        415: {"model": ErrorBody},
        422: {"model": ValidationErrorBody},
    },
)
def upload_instrument_file(
    user: CurrentUser,
    settings: SettingsDep,
    response: Response,
    content: Annotated[
        bytes,
        Body(media_type="application/x-hdf5", description="The file: a TOAST focal plane (HDF5) or schedule (ECSV)"),
    ],
    kind: Annotated[InstrumentFileKind, Query(description="What the file is")],
    content_type: Annotated[str | None, Header()] = None,
) -> InstrumentFile:
    """Check a TOAST focal-plane or schedule file as a campaign's would be checked, and keep it once, by its
    sha256, under the service's instrument_root (``uploads/<sha256>.h5`` or ``.ecsv``); a spec then names it by
    that ``file`` and ``sha256``. The body's media type is ``application/x-hdf5`` for a focal plane and
    ``text/x-ecsv`` for a schedule. A file that does not check: 422 naming the column, nothing stored."""
    expected = INSTRUMENT_MEDIA_TYPES[kind]
    given = (content_type or "").split(";")[0].strip().lower()
    if given != expected:
        raise UnsupportedMediaType(f"a {kind} file is sent as {expected}, not {given or 'no media type'}")
    record, new = service.store_instrument_file(instrument_root=settings.instrument_root, kind=kind, content=content)
    if not new:
        response.status_code = status.HTTP_200_OK
    return record


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
    sha256: Annotated[str, Path(pattern="^[0-9a-f]{64}$", description="SHA-256 of the uploaded file")],
) -> FileResponse:
    """An uploaded file's bytes, by its checksum (worker tokens): a site that does not share the service's
    instrument folder fetches the uploads its campaigns name into its own ``instrument_root``."""
    path = service.uploaded_file(instrument_root=settings.instrument_root, sha256=sha256)
    media_type = INSTRUMENT_MEDIA_TYPES["focal-plane" if path.suffix == ".h5" else "ground-schedule"]
    return FileResponse(path, media_type=media_type, filename=path.name)
