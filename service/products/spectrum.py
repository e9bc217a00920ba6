"""The spectrum of a user's data map from three campaigns: ``(C_b - N_b) / F_b`` with Monte Carlo errors.

Or, with a pure-E and a pure-B campaign in place of the transfer campaign, ``T_b^-1 (C_b - N_b)`` for EE, EB,
BB with their E/B transfer matrix (:func:`transfer_matrix_pair`, also served as a product of its own). The
transfer function comes from a signal-only campaign, the noise bias from a noise-only one, and
the errors from the bandpower covariance of a signal+noise one; all must share the data's pointing
(scan key), mask and binning, else the request is refused naming what differs (422). The data
map's own bandpowers need the harmonic transforms and the mode coupling of ``mapmaker``, which the
service may not import (``tests/unit/test_architecture.py``): they come from the map-maker's
program ``python -m mapmaker bandpowers``, started here as the worker starts ``realize``. Running it
as a program also keeps pspy's spin-waiting OpenMP threads and healpy's import out of the API
process. The debiasing itself is :func:`schemas.montecarlo.debiased_bandpowers`.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session

from schemas import montecarlo
from schemas.products import (
    TRANSFER_MATRIX_DEFINITION,
    BandpowerBins,
    BandpowerEstimate,
    DataSpectrum,
    SpectrumCampaigns,
    TransferMatrix,
    TransferMatrixCampaigns,
)
from schemas.programs import MapmakerExit, mapmaker_bandpowers_args
from schemas.result import SPECTRA, MapBandpowers
from service.campaigns import service as campaigns
from service.campaigns.models import Campaign
from service.errors import InvalidField
from service.products.aggregates import AggregateState, BandpowerAggregates, bandpower_aggregates
from service.products.service import ProductsNotReady, snapshot
from service.storage import CampaignProducts

BANDPOWERS_TIMEOUT_S = 600.0  # the map-maker's bandpowers of one map: seconds at nside 256 (pure B, one thread)

# What each role needs: the campaign kind, and what it gives.
ROLES = {
    "transfer": ("signal-only", "the transfer function F_b"),
    "transfer_e": ("signal-only", "the E column of the transfer matrix"),
    "transfer_b": ("signal-only", "the B column of the transfer matrix"),
    "noise": ("noise-only", "the noise bias N_b"),
    "covariance": ("signal+noise", "the bandpower covariance"),
}
# The sky option (spec sky.polarization) each role needs.
POLARIZATION_OF_ROLE = {"transfer_e": "E-only", "transfer_b": "B-only"}


@dataclass(frozen=True)
class RoleCampaign:
    role: str
    campaign: Campaign
    files: CampaignProducts
    state: AggregateState
    bandpowers: BandpowerAggregates


def _role_campaign(
    *, session: Session, owner_id: int, products_dir: Path, role: str, campaign_id: int, field: str | None = None
) -> RoleCampaign:
    """The campaign ``campaign_id`` checked for ``role``; a refusal names the query ``field`` (default: the role)."""
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    kind, gives = ROLES[role]
    field = field or role
    if campaign.kind != kind:
        raise InvalidField(
            ("query", field), f"campaign {campaign_id} is {campaign.kind}: {gives} comes from a {kind} campaign"
        )
    wanted = POLARIZATION_OF_ROLE.get(role)
    if wanted is not None:
        sky = (campaign.spec or {}).get("sky") or {}
        polarization = sky.get("polarization", "both") if sky.get("kind", "cmb") == "cmb" else None
        if polarization != wanted:
            raise InvalidField(
                ("query", field),
                f"campaign {campaign_id} has sky.polarization {polarization!r}: {gives} comes from a signal-only "
                f"campaign with sky.polarization = {wanted!r}",
            )
    files = CampaignProducts(products_dir, campaign.id)

    def read(state: AggregateState) -> tuple[AggregateState, BandpowerAggregates | None]:
        return state, bandpower_aggregates(files, state)

    state, bandpowers = snapshot(files, read)
    if bandpowers is None:
        raise ProductsNotReady(f"campaign {campaign.id} has no decoupled bandpowers yet")
    if role in ("transfer", "transfer_e", "transfer_b") and not bandpowers.transfer_available:
        raise InvalidField(("query", field), f"campaign {campaign_id} simulated no CMB sky: it has no input model")
    if role != "noise" and bandpowers.n < 2:
        raise ProductsNotReady(f"campaign {campaign_id} has {bandpowers.n} realisation: {gives} needs two")
    return RoleCampaign(role, campaign, files, state, bandpowers)


def _differences(reference: RoleCampaign, other: RoleCampaign) -> list[str]:
    """What differs between two campaigns' bandpowers that must agree (pointing, mask, binning, estimator)."""
    mine, theirs = reference.bandpowers, other.bandpowers
    found = []
    if reference.campaign.scan_key != other.campaign.scan_key:
        found.append(f"scan key {other.campaign.scan_key[:12]}... (not {reference.campaign.scan_key[:12]}...)")
    if mine.mask_sha256 != theirs.mask_sha256:
        found.append(f"mask sha256 {theirs.mask_sha256[:12]}... (not {mine.mask_sha256[:12]}...)")
    if (mine.bin_width, mine.lmax) != (theirs.bin_width, theirs.lmax) or not np.array_equal(mine.ell_lo, theirs.ell_lo):
        found.append(
            f"binning bin_width {theirs.bin_width} lmax {theirs.lmax} (not bin_width {mine.bin_width} lmax {mine.lmax})"
        )
    if mine.purify_b != theirs.purify_b:
        found.append(f"purify_b {theirs.purify_b} (not {mine.purify_b})")
    return found


@dataclass(frozen=True)
class MatrixPair:
    """A pure-E and a pure-B campaign of one coupling, and their transfer matrix."""

    pure_e: RoleCampaign
    pure_b: RoleCampaign
    matrix: montecarlo.TransferMatrix


def transfer_matrix_pair(
    *, session: Session, owner_id: int, products_dir: Path, pure_e_id: int, pure_b_id: int,
    roles: tuple[str, str] = ("transfer_e", "transfer_b"),
) -> MatrixPair:
    """The E/B transfer matrix (:func:`schemas.montecarlo.transfer_matrix`) of the two campaigns' current aggregates.

    Refused (422 on the pure-B campaign's query field, ``roles[1]``) when they differ in scan key, mask, binning or
    estimator: the matrix needs one coupling. Each must be signal-only with its ``sky.polarization``, with two
    realisations (404 ``products_not_ready`` before).
    """
    pure_e = _role_campaign(
        session=session, owner_id=owner_id, products_dir=products_dir, role="transfer_e", campaign_id=pure_e_id,
        field=roles[0],
    )
    pure_b = _role_campaign(
        session=session, owner_id=owner_id, products_dir=products_dir, role="transfer_b", campaign_id=pure_b_id,
        field=roles[1],
    )
    differences = _differences(pure_e, pure_b)
    if differences:
        raise InvalidField(
            ("query", roles[1]),
            f"campaign {pure_b_id} differs from the pure-E campaign {pure_e_id} in {'; '.join(differences)}: "
            "the two need the same coupling key (scan, ranks, solver.rcond_min, products settings)",
        )
    e, b = pure_e.bandpowers, pure_b.bandpowers
    assert e.model is not None and b.model is not None  # transfer_available, checked by _role_campaign
    matrix = montecarlo.transfer_matrix(
        e_mean=e.mean, e_covariance=e.covariance, e_n=e.n, e_model=e.model,
        b_mean=b.mean, b_covariance=b.covariance, b_n=b.n, b_model=b.model,
    )
    return MatrixPair(pure_e, pure_b, matrix)


def _matrix_values(values: np.ndarray) -> list[list[list[float | None]]]:
    return [[_finite(row) for row in block] for block in values]


def transfer_matrix_product(pair: MatrixPair) -> TransferMatrix:
    """The API's view of a :class:`MatrixPair` (:class:`schemas.products.TransferMatrix`)."""
    bandpowers = pair.pure_e.bandpowers
    return TransferMatrix(
        campaigns=TransferMatrixCampaigns(pure_e=pair.pure_e.campaign.id, pure_b=pair.pure_b.campaign.id),
        n_e=pair.matrix.n_e,
        n_b=pair.matrix.n_b,
        generations=[pair.pure_e.state.generation, pair.pure_b.state.generation],
        scan_key=pair.pure_e.campaign.scan_key,
        mask_sha256=bandpowers.mask_sha256,
        purify_b=bandpowers.purify_b,
        bins=_bins(bandpowers),
        spectra=list(montecarlo.MATRIX_SPECTRA),
        matrix=_matrix_values(pair.matrix.matrix),
        error=_matrix_values(pair.matrix.error),
    )


def transfer_matrix_npz(pair: MatrixPair) -> bytes:
    """The matrix as an npz of arrays: ``matrix`` and ``error`` [n_bins, 3, 3] (out, in: ``spectra``), the bins,
    ``reliable``, ``n_e``, ``n_b``, the campaigns and the definition."""
    bandpowers = pair.pure_e.bandpowers
    buffer = io.BytesIO()
    np.savez(
        buffer,
        matrix=pair.matrix.matrix,
        error=pair.matrix.error,
        spectra=np.array(montecarlo.MATRIX_SPECTRA),
        ell_lo=bandpowers.ell_lo,
        ell_hi=bandpowers.ell_hi,
        ell_center=bandpowers.ell_center,
        reliable=bandpowers.reliable,
        n_e=np.int64(pair.matrix.n_e),
        n_b=np.int64(pair.matrix.n_b),
        pure_e=np.int64(pair.pure_e.campaign.id),
        pure_b=np.int64(pair.pure_b.campaign.id),
        definition=np.str_(TRANSFER_MATRIX_DEFINITION),
    )
    return buffer.getvalue()


def _bins(bandpowers: BandpowerAggregates) -> BandpowerBins:
    return BandpowerBins(
        ell_lo=[int(v) for v in bandpowers.ell_lo],
        ell_hi=[int(v) for v in bandpowers.ell_hi],
        ell_center=[float(v) for v in bandpowers.ell_center],
        lmax=bandpowers.lmax,
        bin_width=bandpowers.bin_width,
        reliable=[bool(v) for v in bandpowers.reliable],
    )


def _estimates(value: np.ndarray, error: np.ndarray) -> dict[str, BandpowerEstimate]:
    return {
        name: BandpowerEstimate(value=_finite(value[row]), error=_finite(error[row]))
        for row, name in enumerate(SPECTRA)
    }


def _finite(values: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64)]


def _map_bandpowers(transfer: RoleCampaign, map_bytes: bytes, work_dir: Path) -> MapBandpowers:
    """The data map's decoupled bandpowers on the transfer campaign's mask, from ``python -m mapmaker bandpowers``."""
    if transfer.state.mask is None:
        raise ProductsNotReady(f"campaign {transfer.campaign.id} has no stored mask yet")
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="spectrum-") as folder:
        map_file, out = Path(folder) / "map.fits", Path(folder) / "bandpowers.json"
        map_file.write_bytes(map_bytes)
        bandpowers = transfer.bandpowers
        command = mapmaker_bandpowers_args(
            sys.executable,
            map_file=map_file,
            mask_file=transfer.files.mask_path,
            mask_sha256=bandpowers.mask_sha256,
            bin_width=bandpowers.bin_width,
            lmax=bandpowers.lmax,
            purify_b=bandpowers.purify_b,
            out=out,
        )
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=BANDPOWERS_TIMEOUT_S, env=environment, check=False
        )
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1].removeprefix("mapmaker bandpowers: ")
        if done.returncode == MapmakerExit.BAD_INPUT:
            raise InvalidField(("body",), reason)
        if done.returncode == MapmakerExit.COUPLING_REFUSED:
            raise InvalidField(("query", "transfer"), f"campaign {transfer.campaign.id}'s stored mask: {reason}")
        if done.returncode != 0:
            raise RuntimeError(f"mapmaker bandpowers exited {done.returncode}: {done.stderr[-2000:]}")
        return MapBandpowers.model_validate_json(out.read_text())


def data_spectrum(
    *,
    session: Session,
    owner_id: int,
    products_dir: Path,
    work_dir: Path,
    map_bytes: bytes,
    transfer_id: int | None,
    noise_id: int,
    covariance_id: int | None,
    transfer_e_id: int | None = None,
    transfer_b_id: int | None = None,
) -> DataSpectrum:
    """Unbiased bandpowers of the map in ``map_bytes`` (HEALPix FITS, I Q U in K) with Monte Carlo errors.

    The correction is the per-bin F_b of the ``transfer`` campaign, or the E/B transfer matrix of the
    ``transfer_e`` (pure-E) and ``transfer_b`` (pure-B) pair for EE, EB, BB with F_b of the pure-E campaign
    for TT, TE, TB: one or the other, else 422. Refused (422, naming the query field) when a campaign is of
    a kind (or sky polarisation) that cannot give its part, or differs from the transfer (pure-E) campaign
    in scan key, mask, binning or estimator; the map is refused (422 on the body) when it is not an I/Q/U
    map of the campaigns' nside with values inside the mask. Another user's campaign is 404; a campaign
    without bandpowers yet is 404 ``products_not_ready``.
    """
    if not map_bytes.startswith(b"SIMPLE  ="):  # every FITS file starts so: refused before starting the program
        raise InvalidField(("body",), "the map is not a HEALPix FITS map: a FITS file starts with 'SIMPLE  ='")
    pair_given = (transfer_e_id is not None, transfer_b_id is not None)
    if transfer_id is not None and any(pair_given):
        raise InvalidField(
            ("query", "transfer"), "give a transfer campaign (F_b) or a transfer_e and transfer_b pair (the matrix), not both"
        )
    if transfer_id is None and not all(pair_given):
        missing = "transfer_b" if pair_given[0] else "transfer_e" if pair_given[1] else "transfer"
        raise InvalidField(
            ("query", missing),
            "a transfer campaign (F_b) or a transfer_e and transfer_b pair (the E/B transfer matrix) is required",
        )
    pair = None
    if transfer_id is None:
        assert transfer_e_id is not None and transfer_b_id is not None
        pair = transfer_matrix_pair(
            session=session, owner_id=owner_id, products_dir=products_dir, pure_e_id=transfer_e_id,
            pure_b_id=transfer_b_id,
        )
        transfer = pair.pure_e
    else:
        transfer = _role_campaign(
            session=session, owner_id=owner_id, products_dir=products_dir, role="transfer", campaign_id=transfer_id
        )
    wanted = {"noise": noise_id, "covariance": covariance_id}
    roles = {
        role: _role_campaign(
            session=session, owner_id=owner_id, products_dir=products_dir, role=role, campaign_id=campaign_id
        )
        for role, campaign_id in wanted.items()
        if campaign_id is not None
    }
    for role in ("noise", "covariance"):
        if role in roles:
            differences = _differences(transfer, roles[role])
            if differences:
                raise InvalidField(
                    ("query", role),
                    f"campaign {roles[role].campaign.id} differs from the transfer campaign {transfer.campaign.id} "
                    f"in {'; '.join(differences)}",
                )
    measured = _map_bandpowers(transfer, map_bytes, work_dir)
    data_cb = np.array([measured.cb[name] for name in SPECTRA])
    transfer_b, transfer_error = transfer.bandpowers.transfer_function()
    noise_b, noise_error = roles["noise"].bandpowers.noise_bias()
    covariance = roles["covariance"].bandpowers if "covariance" in roles else None
    covariance_matrix = None if covariance is None else covariance.covariance
    matrix_error = None
    if pair is None:
        cb, sigma = montecarlo.debiased_bandpowers(
            data_cb, noise_bias_cb=noise_b, transfer_b=transfer_b, covariance=covariance_matrix
        )
    else:
        corrected = montecarlo.matrix_debiased_bandpowers(
            data_cb, noise_bias_cb=noise_b, matrix=pair.matrix, transfer_b=transfer_b, covariance=covariance_matrix
        )
        cb, sigma, matrix_error = corrected.cb, corrected.sigma_data, corrected.sigma_matrix
    bandpowers = transfer.bandpowers
    model = bandpowers.model
    hartlap = None if covariance is None else covariance.hartlap
    return DataSpectrum(
        campaigns=SpectrumCampaigns(
            transfer=transfer_id, transfer_e=transfer_e_id, transfer_b=transfer_b_id, noise=noise_id,
            covariance=covariance_id,
        ),
        scan_key=transfer.campaign.scan_key,
        mask_sha256=bandpowers.mask_sha256,
        purify_b=bandpowers.purify_b,
        nside=measured.nside,
        bins=_bins(bandpowers),
        cb={name: _finite(cb[row]) for row, name in enumerate(SPECTRA)},
        error=None if sigma is None else {name: _finite(sigma[row]) for row, name in enumerate(SPECTRA)},
        data_cb=measured.cb,
        noise_bias=_estimates(noise_b, noise_error),
        transfer_function=_estimates(transfer_b, transfer_error),
        model=None if model is None else {name: [float(v) for v in model[row]] for row, name in enumerate(SPECTRA)},
        correction="transfer-function" if pair is None else "transfer-matrix",
        transfer_matrix=None if pair is None else transfer_matrix_product(pair),
        error_matrix=None
        if matrix_error is None
        else {name: _finite(matrix_error[row]) for row, name in enumerate(SPECTRA)},
        covariance_n=None if covariance is None else covariance.n,
        hartlap=hartlap if hartlap is not None and math.isfinite(hartlap) else None,
        monopole_k=measured.monopole_k,
        dipole_k=measured.dipole_k,
    )
