"""HTTP for a campaign's Monte Carlo products (user tokens; another user's campaign answers 404)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse, Response

from schemas.api import ErrorBody
from schemas.products import (
    DataSpectrum,
    DownloadFormat,
    MapFormat,
    ProductsSummary,
    RealizationSpectra,
    TransferMatrix,
)
from service.db import get_database
from service.deps import MAX_ROW_ID, CurrentUser, ReadSessionDep, RealizationIndex, RowId, SettingsDep
from service.errors import InvalidField, UnsupportedMediaType
from service.limits import receive_to_file, stream_body
from service.products import service, spectrum
from service.products.formats import MEDIA_TYPES

router = APIRouter(
    prefix="/campaigns/{campaign_id}/products",
    tags=["products"],
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody}},
)

_FILE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The file (Content-Disposition names it)",
        "content": {MEDIA_TYPES["fits"]: {}, MEDIA_TYPES["npz"]: {}, MEDIA_TYPES["json"]: {}},
    },
    422: {"model": ErrorBody},
}


def _file(download: service.Download) -> FileResponse:
    return FileResponse(
        download.path,
        media_type=download.media_type,
        filename=download.filename,
        headers={"Cache-Control": "private, no-cache", "X-Content-Type-Options": "nosniff"},
    )


@router.get("", response_model=ProductsSummary)
def products_summary(
    campaign_id: RowId, user: CurrentUser, session: ReadSessionDep, settings: SettingsDep
) -> ProductsSummary:
    """Which aggregates exist, how many realisations they include, the ell bins, mean and scatter of the
    spectra, and the noise bias N_l (noise-only) or transfer function F_l (signal-only)."""
    return service.products_summary(
        session=session, owner_id=user.user_id, campaign_id=campaign_id, products_dir=settings.products_dir
    )


@router.get("/spectra", response_class=Response, responses=_FILE)
def spectra(
    campaign_id: RowId,
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    format: DownloadFormat = "json",
) -> Response:
    """Mean and scatter of the binned spectra (and N_l or F_l): JSON (the summary), npz or a FITS table."""
    return _file(
        service.spectra_download(
            session=session,
            owner_id=user.user_id,
            campaign_id=campaign_id,
            products_dir=settings.products_dir,
            fmt=format,
        )
    )


@router.get("/bandpowers", response_class=Response, responses=_FILE)
def bandpowers(
    campaign_id: RowId,
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    format: DownloadFormat = "json",
) -> Response:
    """Decoupled (MASTER) bandpowers over the realisations: mean and Monte Carlo error, the transfer function
    F_b (signal-only), the noise bias N_b (noise-only), and the bandpower covariance with n and the Hartlap
    factor: JSON, npz or FITS (table BANDPOWERS, image COVARIANCE)."""
    return _file(
        service.bandpower_download(
            session=session,
            owner_id=user.user_id,
            campaign_id=campaign_id,
            products_dir=settings.products_dir,
            fmt=format,
        )
    )


def _map_download(campaign_id: int, user, session, settings, which: str, fmt: str) -> Response:
    return _file(
        service.map_download(
            session=session,
            owner_id=user.user_id,
            campaign_id=campaign_id,
            products_dir=settings.products_dir,
            which=which,
            fmt=fmt,
        )
    )


@router.get("/mean-map", response_class=Response, responses=_FILE)
def mean_map(
    campaign_id: RowId, user: CurrentUser, session: ReadSessionDep, settings: SettingsDep, format: MapFormat = "fits"
) -> Response:
    """Running mean of the I, Q, U maps (K): HEALPix FITS (RING, UNSEEN where never observed) or npz (``mean``)."""
    return _map_download(campaign_id, user, session, settings, "mean-map", format)


@router.get("/variance-map", response_class=Response, responses=_FILE)
def variance_map(
    campaign_id: RowId, user: CurrentUser, session: ReadSessionDep, settings: SettingsDep, format: MapFormat = "fits"
) -> Response:
    """Per-pixel sample variance (ddof 1) of I, Q, U over the realisations (K^2); needs two realisations."""
    return _map_download(campaign_id, user, session, settings, "variance-map", format)


@router.get("/mask", response_class=Response, responses=_FILE)
def mask(
    campaign_id: RowId, user: CurrentUser, session: ReadSessionDep, settings: SettingsDep, format: MapFormat = "fits"
) -> Response:
    """The campaign's apodised analysis mask (stored once: it depends on the pointing only)."""
    return _map_download(campaign_id, user, session, settings, "mask", format)


@router.get(
    "/realizations/{index}/spectra",
    response_model=RealizationSpectra,
    responses={200: {"content": {MEDIA_TYPES["fits"]: {}, MEDIA_TYPES["npz"]: {}}}, 422: {"model": ErrorBody}},
)
def realization_spectra(
    campaign_id: RowId,
    index: RealizationIndex,
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    format: DownloadFormat = "json",
) -> Response | RealizationSpectra:
    """One realisation's binned pseudo-spectra as stored with its result."""
    answer = service.realization_download(
        session=session,
        owner_id=user.user_id,
        campaign_id=campaign_id,
        index=index,
        products_dir=settings.products_dir,
        which="spectra",
        fmt=format,
    )
    return answer if isinstance(answer, RealizationSpectra) else _file(answer)


def _realization_file(campaign_id: int, index: int, user, session, settings, which: str, fmt: str) -> Response:
    answer = service.realization_download(
        session=session,
        owner_id=user.user_id,
        campaign_id=campaign_id,
        index=index,
        products_dir=settings.products_dir,
        which=which,
        fmt=fmt,
    )
    if not isinstance(answer, service.Download):  # only which="spectra" with fmt="json" answers with a model
        raise TypeError(f"{which} as {fmt} is a file download, not {type(answer).__name__}")
    return _file(answer)


@router.get("/realizations/{index}/map", response_class=Response, responses=_FILE)
def realization_map(
    campaign_id: RowId,
    index: RealizationIndex,
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    format: MapFormat = "fits",
) -> Response:
    """One realisation's I, Q, U map: the uploaded FITS file, or npz (``iqu``)."""
    return _realization_file(campaign_id, index, user, session, settings, "map", format)


@router.get("/realizations/{index}/mask", response_class=Response, responses=_FILE)
def realization_mask(
    campaign_id: RowId,
    index: RealizationIndex,
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    format: MapFormat = "fits",
) -> Response:
    """One realisation's analysis mask: the uploaded FITS file, or npz (``mask``)."""
    return _realization_file(campaign_id, index, user, session, settings, "mask", format)


spectrum_router = APIRouter(
    tags=["products"],
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody}},
)

SPECTRUM_MEDIA_TYPE = MEDIA_TYPES["fits"]


def _spectrum_slots(request: Request) -> spectrum.PerUserSlots:
    """The app's count of running spectrum requests per user (one per app, made on first use)."""
    slots = getattr(request.app.state, "spectrum_slots", None)
    if slots is None:
        slots = request.app.state.spectrum_slots = spectrum.PerUserSlots()
    return slots


@spectrum_router.post(
    "/spectrum",
    response_model=DataSpectrum,
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "HEALPix FITS map: I, Q, U in K",
            "content": {SPECTRUM_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        }
    },
    responses={
        408: {"model": ErrorBody, "description": "The body stopped arriving (MAPCAMPAIGN_UPLOAD_IDLE_TIMEOUT_S)"},
        413: {"model": ErrorBody, "description": "Over MAPCAMPAIGN_MAX_SPECTRUM_BYTES"},
        415: {"model": ErrorBody},
        422: {"model": ErrorBody},
        429: {"model": ErrorBody, "description": "You run MAPCAMPAIGN_SPECTRUM_PER_USER already (Retry-After)"},
    },
)
async def data_spectrum(
    request: Request,
    user: CurrentUser,
    settings: SettingsDep,
    noise: Annotated[int, Query(ge=1, le=MAX_ROW_ID, description="Noise-only campaign giving N_b")],
    transfer: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Signal-only campaign giving F_b (or transfer_e + transfer_b)")
    ] = None,
    transfer_e: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Pure-E campaign of the E/B transfer matrix (with transfer_b)")
    ] = None,
    transfer_b: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Pure-B campaign of the E/B transfer matrix (with transfer_e)")
    ] = None,
    covariance: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Signal+noise campaign giving the errors")
    ] = None,
    content_type: Annotated[str | None, Header()] = None,
) -> DataSpectrum:
    """Unbiased bandpowers (C_b - N_b) / F_b of the uploaded map (the request body, a HEALPix FITS file,
    ``application/fits``), with errors from the covariance campaign; with a transfer_e and transfer_b pair
    instead of transfer, EE, EB, BB are T_b^-1 (C_b - N_b) with their E/B transfer matrix (TT, TE by the
    pure-E campaign's F_b), and error_matrix gives the matrix's own error. The campaigns must share the
    map's pointing (scan key), mask and binning, and be of the kind their role needs: else 422 naming the
    query field and what differs.

    The token, the media type (415), the campaigns and the caller's limit of running spectra
    (``MAPCAMPAIGN_SPECTRUM_PER_USER``; 429 with Retry-After) are checked before the body is read; the
    body may be ``MAPCAMPAIGN_MAX_SPECTRUM_BYTES`` long. The mask's mode coupling is built once per
    coupling key and mask and kept by the service."""
    given = (content_type or "").split(";")[0].strip().lower()
    if given != SPECTRUM_MEDIA_TYPE:
        raise UnsupportedMediaType(f"the map is sent as {SPECTRUM_MEDIA_TYPE}, not {given or 'no media type'}")
    database = get_database(request)

    def campaigns_by_role() -> dict[str, spectrum.RoleCampaign]:
        with database.session(write=False) as session:
            return spectrum.resolve_campaigns(
                session=session,
                owner_id=user.user_id,
                products_dir=settings.products_dir,
                transfer_id=transfer,
                noise_id=noise,
                covariance_id=covariance,
                transfer_e_id=transfer_e,
                transfer_b_id=transfer_b,
            )

    with _spectrum_slots(request).hold(user.user_id, settings.spectrum_per_user):
        roles = await anyio.to_thread.run_sync(campaigns_by_role)
        received = await receive_to_file(
            stream_body(request, max_bytes=settings.max_spectrum_bytes, idle_timeout_s=settings.upload_idle_timeout_s),
            folder=settings.spectrum_work_dir,
        )
        try:
            with open(received.path, "rb") as handle:  # noqa: ASYNC230 -- nine bytes of a local file
                start = handle.read(9)
            if not spectrum.is_fits(start):  # refused before starting the program
                raise InvalidField(
                    ("body",), "the map is not a HEALPix FITS map: a FITS file starts with 'SIMPLE  ='"
                )
            measured = await spectrum.map_bandpowers(
                roles["transfer"], received.path, coupling_dir=settings.coupling_cache_dir
            )
        finally:
            received.path.unlink(missing_ok=True)
    return spectrum.data_spectrum(roles, measured)


@spectrum_router.get(
    "/transfer-matrix",
    response_model=TransferMatrix,
    responses={200: {"content": {MEDIA_TYPES["npz"]: {}}}, 422: {"model": ErrorBody}},
)
def transfer_matrix(
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    pure_e: Annotated[int, Query(ge=1, le=MAX_ROW_ID, description="Signal-only campaign with sky.polarization E-only")],
    pure_b: Annotated[int, Query(ge=1, le=MAX_ROW_ID, description="Signal-only campaign with sky.polarization B-only")],
    format: Annotated[Literal["json", "npz"], Query(description="json (this model) or npz (arrays)")] = "json",
) -> Response | TransferMatrix:
    """The E/B transfer matrix per bin, (EE, EB, BB) out over (EE, EB, BB) in, with Monte Carlo errors, from the
    current aggregates of a pure-E and a pure-B campaign with the same coupling key (it follows their
    realisations as they arrive). 422 naming the query field when a campaign has another kind or sky
    polarisation, or the two differ in scan key, mask, binning or estimator."""
    pair = spectrum.transfer_matrix_pair(
        session=session, owner_id=user.user_id, products_dir=settings.products_dir, pure_e_id=pure_e,
        pure_b_id=pure_b, fields=("pure_e", "pure_b"),
    )
    if format == "json":
        return spectrum.transfer_matrix_product(pair)
    return Response(
        content=spectrum.transfer_matrix_npz(pair),
        media_type=MEDIA_TYPES["npz"],
        headers={
            "Content-Disposition": f'attachment; filename="transfer-matrix-{pure_e}-{pure_b}.npz"',
            "Cache-Control": "private, no-cache",
            "X-Content-Type-Options": "nosniff",
        },
    )
