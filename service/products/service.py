"""The Monte Carlo products of a campaign for its owner: the summary, and the files to download.

Routers (API and dashboard) call these; they take a keyword-only ``session``
and raise domain errors (another user's campaign: ``CampaignNotFound``, 404).
Downloads are derived from one generation of the aggregates and kept in
``products/cache/`` until the aggregates move on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from schemas.api import API_PREFIX
from schemas.files import atomic_write_bytes
from schemas.products import (
    BandpowerBins,
    BandpowerCovariance,
    BandpowerEstimate,
    BandpowerProducts,
    CorrectionStats,
    EllBins,
    MaskInfo,
    NoiseBias,
    ProductDownloads,
    ProductsSummary,
    RealizationSpectra,
    SpectrumStats,
    TransferFunction,
)
from schemas.result import SPECTRA
from schemas.states import RealizationState
from service.campaigns import reads as campaigns
from service.campaigns.models import Campaign, Realization
from service.errors import Invalid, NotFound
from service.keptfiles import kept_source, sites_with_workers
from service.products import formats
from service.products.aggregates import (
    AggregateState,
    BandpowerAggregates,
    SpectraAggregates,
    bandpower_aggregates,
    load_state,
    spectra_aggregates,
)
from service.products.mapsums import mean_and_variance_maps
from service.storage import CampaignProducts

T = TypeVar("T")


class ProductsNotReady(NotFound):
    code = "products_not_ready"


class RealizationProductsNotFound(NotFound):
    code = "realization_products_not_found"


class FormatNotOffered(Invalid):
    code = "format_not_offered"


@dataclass(frozen=True)
class Download:
    path: Path
    media_type: str
    filename: str


def _finite(values: np.ndarray | None) -> list[float | None] | None:
    if values is None:
        return None
    return [float(v) if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64)]


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in values]


def owned_products(
    *, session: Session, owner_id: int, campaign_id: int, products_dir: Path
) -> tuple[Campaign, CampaignProducts]:
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    return campaign, CampaignProducts(products_dir, campaign.id)


def snapshot(files: CampaignProducts, read: Callable[[AggregateState], T]) -> T:
    """``read(state)`` on the committed state; retried when an update removed its files meanwhile."""
    for _ in range(5):
        state = load_state(files)
        if state is None or not state.has_products:
            raise ProductsNotReady(f"campaign {files.campaign_id} has no Monte Carlo products yet")
        try:
            return read(state)
        except FileNotFoundError:
            latest = load_state(files)
            if latest is None or latest.generation == state.generation:
                raise  # not a race with an update: a real problem
            # A newer generation replaced the files this state names: read the new one.
    raise ProductsNotReady(f"campaign {files.campaign_id}: its products are changing too fast to read; try again")


# --------------------------------------------------------------------------- summary


def _bins(aggregates: SpectraAggregates) -> EllBins:
    return EllBins(
        ell_min=[int(v) for v in aggregates.ell_min],
        ell_max=[int(v) for v in aggregates.ell_max],
        ell_center=_floats(aggregates.ell_center),
        lmax=aggregates.lmax,
        ell_bin_width=aggregates.ell_bin_width,
    )


def _correction(value: np.ndarray, scatter: np.ndarray | None, n: int) -> CorrectionStats:
    return CorrectionStats(
        value=_finite(value),
        std=_finite(scatter),
        error=_finite(None if scatter is None else scatter / math.sqrt(n)),
    )


def _estimates(value: np.ndarray, error: np.ndarray | None) -> dict[str, BandpowerEstimate]:
    return {
        name: BandpowerEstimate(value=_finite(value[row]) or [], error=None if error is None else _finite(error[row]))
        for row, name in enumerate(SPECTRA)
    }


def bandpower_products(bandpowers: BandpowerAggregates) -> BandpowerProducts:
    """The summary's block on the decoupled bandpowers (the covariance matrix itself is in the download)."""
    n_bins = bandpowers.ell_lo.size
    error = bandpowers.error if bandpowers.n >= 2 else None
    block: dict[str, Any] = {
        "n": bandpowers.n,
        "bins": BandpowerBins(
            ell_lo=[int(v) for v in bandpowers.ell_lo],
            ell_hi=[int(v) for v in bandpowers.ell_hi],
            ell_center=_floats(bandpowers.ell_center),
            lmax=bandpowers.lmax,
            bin_width=bandpowers.bin_width,
            reliable=[bool(v) for v in bandpowers.reliable],
        ),
        "purify_b": bandpowers.purify_b,
        "mask_sha256": bandpowers.mask_sha256,
        "mean": _estimates(bandpowers.mean, error),
        "beam_fwhm_arcmin": bandpowers.beam_fwhm_arcmin,
    }
    if bandpowers.model is not None:
        block["model"] = {name: _floats(bandpowers.model[row]) for row, name in enumerate(SPECTRA)}
    if bandpowers.transfer_available:
        value, sigma = bandpowers.transfer_function()
        block["transfer_function"] = _estimates(value, sigma if error is not None else None)
    if bandpowers.noise_bias_available:
        value, sigma = bandpowers.noise_bias()
        block["noise_bias"] = _estimates(value, sigma if error is not None else None)
    if bandpowers.covariance_available and bandpowers.covariance is not None:
        std = np.sqrt(np.maximum(np.diag(bandpowers.covariance), 0.0)).reshape(6, n_bins)
        hartlap = bandpowers.hartlap
        block["covariance"] = BandpowerCovariance(
            n=bandpowers.n,
            p=int(bandpowers.covariance.shape[0]),
            hartlap=hartlap if hartlap is not None and math.isfinite(hartlap) else None,
            std={name: _floats(std[row]) for row, name in enumerate(SPECTRA)},
        )
    return BandpowerProducts(**block)


def build_summary(*, campaign: Campaign, files: CampaignProducts, succeeded: int) -> ProductsSummary:
    def read(state: AggregateState) -> tuple[AggregateState, BandpowerAggregates | None]:
        return state, bandpower_aggregates(files, state)

    try:
        state, bandpowers = snapshot(files, read)
    except ProductsNotReady:
        state, bandpowers = load_state(files) or AggregateState(campaign_id=campaign.id), None
    aggregates = spectra_aggregates(state)
    base = f"{API_PREFIX}/campaigns/{campaign.id}/products"
    summary: dict[str, Any] = {
        "campaign_id": campaign.id,
        "kind": campaign.kind,
        "campaign_state": campaign.state,
        "succeeded": succeeded,
        "included": state.n_included,
        "spectra_realizations": state.n_spectra,
        "map_realizations": state.n_maps,
        "ready": state.has_products,
        "generation": state.generation,
        "updated_at": state.updated_at,
        "warnings": state.warnings,
        "downloads": ProductDownloads(
            spectra=f"{base}/spectra" if aggregates else None,
            bandpowers=f"{base}/bandpowers" if bandpowers else None,
            mean_map=f"{base}/mean-map" if state.n_maps else None,
            variance_map=f"{base}/variance-map" if state.n_maps >= 2 else None,
            mask=f"{base}/mask" if state.mask else None,
        ),
    }
    if aggregates is not None:
        summary["bins"] = _bins(aggregates)
        summary["mask"] = MaskInfo(
            w2=aggregates.w2,
            fsky=aggregates.fsky,
            apodization_deg=aggregates.apodization_deg,
            min_hits=aggregates.min_hits,
            stored=state.mask is not None,
            sha256=state.mask["sha256"] if state.mask else None,
            from_realization=state.mask["realization"] if state.mask else None,
        )
        summary["spectra"] = {
            name: SpectrumStats(
                mean=_floats(aggregates.mean[name]),
                std=None if aggregates.std is None else _floats(aggregates.std[name]),
            )
            for name in SPECTRA
        }
        if aggregates.noise_bias_available:
            summary["noise_bias"] = NoiseBias(
                spectra={
                    name: _correction(value, scatter, aggregates.n)
                    for name, (value, scatter) in aggregates.noise_bias().items()
                }
            )
        if aggregates.transfer_available and aggregates.model is not None:
            summary["transfer_function"] = TransferFunction(
                beam_fwhm_arcmin=aggregates.beam_fwhm_arcmin,
                model={name: _floats(aggregates.model[name]) for name in SPECTRA},
                spectra={
                    name: _correction(value, scatter, aggregates.n)
                    for name, (value, scatter) in aggregates.transfer_function().items()
                },
            )
    if bandpowers is not None:
        summary["bandpowers"] = bandpower_products(bandpowers)
    return ProductsSummary(**summary)


def succeeded_count(*, session: Session, campaign_id: int) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(Realization)
            .where(Realization.campaign_id == campaign_id, Realization.state == RealizationState.SUCCEEDED)
        )
        or 0
    )


def products_summary(*, session: Session, owner_id: int, campaign_id: int, products_dir: Path) -> ProductsSummary:
    campaign, files = owned_products(
        session=session, owner_id=owner_id, campaign_id=campaign_id, products_dir=products_dir
    )
    return build_summary(
        campaign=campaign, files=files, succeeded=succeeded_count(session=session, campaign_id=campaign.id)
    )


# --------------------------------------------------------------------------- campaign downloads


def spectra_table(aggregates: SpectraAggregates) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Columns [n_bins] and scalars of the spectra download (K^2; N_L_* and F_L_* where they exist)."""
    nan = np.full(aggregates.ell_min.size, np.nan)
    columns: dict[str, np.ndarray] = {"ell_min": aggregates.ell_min, "ell_max": aggregates.ell_max}
    for name in SPECTRA:
        columns[f"{name}_mean"] = aggregates.mean[name]
        columns[f"{name}_std"] = aggregates.std[name] if aggregates.std else nan
    if aggregates.noise_bias_available:
        for spectrum, (value, scatter) in aggregates.noise_bias().items():
            columns[f"nl_{spectrum}"] = value
            columns[f"nl_{spectrum}_std"] = scatter if scatter is not None else nan
    if aggregates.transfer_available and aggregates.model is not None:
        for name in SPECTRA:
            columns[f"model_{name}"] = aggregates.model[name]
        for spectrum, (value, scatter) in aggregates.transfer_function().items():
            columns[f"fl_{spectrum}"] = value
            columns[f"fl_{spectrum}_std"] = scatter if scatter is not None else nan
    scalars = {
        "n": aggregates.n,
        "w2": aggregates.w2,
        "fsky": aggregates.fsky,
        "lmax": aggregates.lmax,
        "binwidth": aggregates.ell_bin_width,
        "apodeg": aggregates.apodization_deg,
        "minhits": aggregates.min_hits,
        "fwhm": aggregates.beam_fwhm_arcmin,
    }
    return columns, scalars


def spectra_download(*, session: Session, owner_id: int, campaign_id: int, products_dir: Path, fmt: str) -> Download:
    campaign, files = owned_products(
        session=session, owner_id=owner_id, campaign_id=campaign_id, products_dir=products_dir
    )
    succeeded = succeeded_count(session=session, campaign_id=campaign.id)

    def build(state: AggregateState) -> Download:
        aggregates = spectra_aggregates(state)
        if aggregates is None:
            raise ProductsNotReady(f"campaign {campaign.id} has no Monte Carlo spectra yet")
        path = files.cache_path(state.generation, f"spectra.{fmt}")
        if fmt == "json":  # written every time: it also says the campaign's state and succeeded count
            summary = build_summary(campaign=campaign, files=files, succeeded=succeeded)
            payload = json.dumps(summary.model_dump(mode="json"), indent=1).encode()
            atomic_write_bytes(path, payload)
        elif not path.is_file():
            columns, scalars = spectra_table(aggregates)
            writer = formats.write_spectra_fits if fmt == "fits" else formats.write_spectra_npz
            writer(path, columns, scalars)
        return Download(path, formats.MEDIA_TYPES[fmt], f"campaign-{campaign.id}-spectra.{fmt}")

    return snapshot(files, build)


def bandpower_download(*, session: Session, owner_id: int, campaign_id: int, products_dir: Path, fmt: str) -> Download:
    """The decoupled bandpowers' aggregates with the covariance matrix: JSON, npz or FITS (:mod:`formats`)."""
    campaign, files = owned_products(
        session=session, owner_id=owner_id, campaign_id=campaign_id, products_dir=products_dir
    )

    def build(state: AggregateState) -> Download:
        bandpowers = bandpower_aggregates(files, state)
        if bandpowers is None:
            raise ProductsNotReady(f"campaign {campaign.id} has no decoupled bandpowers yet")
        path = files.cache_path(state.generation, f"bandpowers.{fmt}")
        if not path.is_file():
            block = bandpower_products(bandpowers)
            if fmt == "json":
                payload = block.model_dump(mode="json")
                payload.update(
                    campaign_id=campaign.id,
                    kind=campaign.kind,
                    scan_key=campaign.scan_key,
                    covariance_matrix=None
                    if bandpowers.covariance is None
                    else [_finite(row) for row in bandpowers.covariance],
                )
                atomic_write_bytes(path, json.dumps(payload, indent=1).encode())
            else:
                arrays = formats.bandpower_arrays(bandpowers)
                scalars = {"campaign": campaign.id, "kind": campaign.kind, "scankey": campaign.scan_key}
                writer = formats.write_bandpowers_fits if fmt == "fits" else formats.write_bandpowers_npz
                writer(path, arrays, scalars)
        return Download(path, formats.MEDIA_TYPES[fmt], f"campaign-{campaign.id}-bandpowers.{fmt}")

    return snapshot(files, build)


def map_download(
    *, session: Session, owner_id: int, campaign_id: int, products_dir: Path, which: str, fmt: str
) -> Download:
    """``which``: ``mean-map`` (I, Q, U in K), ``variance-map`` (K^2, ddof 1) or ``mask``."""
    if fmt not in ("fits", "npz"):
        raise FormatNotOffered(f"the {which} comes as fits or npz, not {fmt}")
    campaign, files = owned_products(
        session=session, owner_id=owner_id, campaign_id=campaign_id, products_dir=products_dir
    )

    def build(state: AggregateState) -> Download:
        name = f"campaign-{campaign.id}-{which}.{fmt}"
        path = files.cache_path(state.generation, f"{which}.{fmt}")
        if which == "mask":
            if state.mask is None:
                raise ProductsNotReady(f"campaign {campaign.id} has no stored mask yet")
            if fmt == "fits":
                return Download(files.mask_path, formats.MEDIA_TYPES[fmt], name)
            if not path.is_file():
                import healpy as hp  # deferred: healpy takes 1-3 s to import here, paid only when a map is read or written

                formats.write_map_npz(path, mask=np.asarray(hp.read_map(str(files.mask_path), dtype=np.float64)))
            return Download(path, formats.MEDIA_TYPES[fmt], name)
        if which == "variance-map" and state.n_maps < 2:
            raise ProductsNotReady(f"campaign {campaign.id}: a variance map needs two realisations with maps")
        if not path.is_file():
            maps = mean_and_variance_maps(files, state)
            if maps is None:
                raise ProductsNotReady(f"campaign {campaign.id} has no mean map yet")
            values = maps[0] if which == "mean-map" else maps[1]
            header = [("NREALIZ", state.n_maps), ("GENERAT", state.generation)]
            if fmt == "fits":
                unit = "K" if which == "mean-map" else "K^2"
                prefix = "MEAN" if which == "mean-map" else "VAR"
                names = [f"{prefix}_{stokes}" for stokes in "IQU"]
                formats.write_map_fits(path, values, names, unit, header)
            else:
                key = "mean" if which == "mean-map" else "variance"
                formats.write_map_npz(path, **{key: values, "n": np.int64(state.n_maps)})
        return Download(path, formats.MEDIA_TYPES[fmt], name)

    return snapshot(files, build)


# --------------------------------------------------------------------------- one realisation


def _succeeded_result(*, session: Session, campaign_id: int, index: int) -> dict[str, Any]:
    row = session.execute(
        select(Realization.state, Realization.result).where(
            Realization.campaign_id == campaign_id, Realization.index == index
        )
    ).first()
    if row is None:
        raise RealizationProductsNotFound(f"campaign {campaign_id} has no realisation {index}")
    if row.state != RealizationState.SUCCEEDED or not row.result:
        raise RealizationProductsNotFound(f"realisation {index} of campaign {campaign_id} is {row.state}: no products")
    return row.result


def realization_spectra(*, session: Session, owner_id: int, campaign_id: int, index: int) -> RealizationSpectra:
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    record = _succeeded_result(session=session, campaign_id=campaign.id, index=index).get("spectra")
    if not record:
        raise RealizationProductsNotFound(f"realisation {index} of campaign {campaign.id} reported no spectra")
    ell_min, ell_max = record["ell_min"], record["ell_max"]
    return RealizationSpectra(
        campaign_id=campaign.id,
        realization=index,
        bins=EllBins(
            ell_min=ell_min,
            ell_max=ell_max,
            ell_center=[(a + b) / 2 for a, b in zip(ell_min, ell_max, strict=True)],
            lmax=record["lmax"],
            ell_bin_width=record["ell_bin_width"],
        ),
        spectra=record["cl"],
        w2=record["w2"],
        fsky=record["fsky"],
        model=record.get("model"),
    )


def realization_download(
    *, session: Session, owner_id: int, campaign_id: int, index: int, products_dir: Path, which: str, fmt: str
) -> Download | RealizationSpectra:
    """One realisation's ``spectra`` (json, npz, fits), ``map`` or ``mask`` (fits as uploaded, or npz)."""
    if which == "spectra":
        spectra = realization_spectra(session=session, owner_id=owner_id, campaign_id=campaign_id, index=index)
        if fmt == "json":
            return spectra
        files = CampaignProducts(products_dir, campaign_id)
        path = files.realization_cache_path(index, f"spectra.{fmt}")
        if not path.is_file():
            columns = {"ell_min": np.asarray(spectra.bins.ell_min), "ell_max": np.asarray(spectra.bins.ell_max)}
            columns.update({name: np.asarray(spectra.spectra[name]) for name in SPECTRA})
            if spectra.model:
                columns.update({f"model_{name}": np.asarray(spectra.model[name]) for name in SPECTRA})
            scalars = {"realiz": index, "w2": spectra.w2, "fsky": spectra.fsky}
            writer = formats.write_spectra_fits if fmt == "fits" else formats.write_spectra_npz
            writer(path, formats.spectra_columns(columns), scalars)
        return Download(path, formats.MEDIA_TYPES[fmt], f"campaign-{campaign_id}-r{index}-spectra.{fmt}")
    if fmt not in ("fits", "npz"):
        raise FormatNotOffered(f"a realisation's {which} comes as fits or npz, not {fmt}")
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    result = _succeeded_result(session=session, campaign_id=campaign.id, index=index)
    role = "iqu" if which == "map" else "mask"
    files = CampaignProducts(products_dir, campaign.id)
    source = None
    for product in result.get("products") or []:
        if product.get("name") == role:
            if product.get("kept"):
                # Read at the site's path, or fetched through its worker (202 meanwhile: KeptFilePending).
                source = kept_source(files, index, product, site_has_workers=sites_with_workers(session).__contains__)
            else:
                source = files.storage.product_path(campaign.id, index, product["path"])
    if source is None and which == "mask" and files.mask_path.is_file():
        source = files.mask_path  # the mask comes once per coupling: the campaign's is every realisation's
    if source is None or not source.is_file():
        raise RealizationProductsNotFound(f"realisation {index} of campaign {campaign.id} has no {which} file")
    name = f"campaign-{campaign.id}-r{index}-{which}.{fmt}"
    if fmt == "fits":
        return Download(source, formats.MEDIA_TYPES[fmt], name)
    path = files.realization_cache_path(index, f"{which}.npz")
    if not path.is_file():
        import healpy as hp  # deferred: healpy takes 1-3 s to import here, paid only when a map is read or written

        fields = (0, 1, 2) if which == "map" else 0
        values = np.asarray(hp.read_map(str(source), field=fields, dtype=np.float64))
        formats.write_map_npz(path, **{"iqu" if which == "map" else "mask": values})
    return Download(path, formats.MEDIA_TYPES[fmt], name)
