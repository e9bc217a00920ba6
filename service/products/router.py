"""HTTP for a campaign's Monte Carlo products (user tokens; another user's campaign answers 404)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query
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
from service.deps import MAX_ROW_ID, CurrentUser, ReadSessionDep, RealizationIndex, RowId, SettingsDep
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

@spectrum_router.post("/spectrum", response_model=DataSpectrum, responses={422: {"model": ErrorBody}})
def data_spectrum(
    user: CurrentUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    map_fits: Annotated[bytes, Body(media_type="application/fits", description="HEALPix FITS map: I, Q, U in K")],
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
) -> DataSpectrum:
    """Unbiased bandpowers (C_b - N_b) / F_b of the uploaded map (the request body, a HEALPix FITS file),
    with errors from the covariance campaign; with a transfer_e and transfer_b pair instead of transfer,
    EE, EB, BB are T_b^-1 (C_b - N_b) with their E/B transfer matrix (TT, TE by the pure-E campaign's F_b),
    and error_matrix gives the matrix's own error. The campaigns must share the map's pointing (scan key),
    mask and binning, and be of the kind their role needs: else 422 naming the query field and what differs."""
    return spectrum.data_spectrum(
        session=session,
        owner_id=user.user_id,
        products_dir=settings.products_dir,
        work_dir=settings.data_dir / "spectrum-work",
        map_bytes=map_fits,
        transfer_id=transfer,
        noise_id=noise,
        covariance_id=covariance,
        transfer_e_id=transfer_e,
        transfer_b_id=transfer_b,
    )


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
        pure_b_id=pure_b, roles=("pure_e", "pure_b"),
    )
    product = spectrum.transfer_matrix_product(pair)
    if format == "json":
        return product
    return Response(
        content=spectrum.transfer_matrix_npz(pair),
        media_type=MEDIA_TYPES["npz"],
        headers={
            "Content-Disposition": f'attachment; filename="transfer-matrix-{pure_e}-{pure_b}.npz"',
            "Cache-Control": "private, no-cache",
            "X-Content-Type-Options": "nosniff",
        },
    )
