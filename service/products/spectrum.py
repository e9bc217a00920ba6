"""The spectrum of a user's data map from three campaigns: ``(C_b - N_b) / F_b`` with Monte Carlo errors.

The transfer function comes from a signal-only campaign, the noise bias from a noise-only one, and
the errors from the bandpower covariance of a signal+noise one; all must share the data's pointing
(scan key), mask and binning, else the request is refused naming what differs (422). The data
map's own bandpowers need the harmonic transforms and the mode coupling of ``mapmaker``, which the
service may not import (``tests/unit/test_architecture.py``): they come from the map-maker's
program ``python -m mapmaker bandpowers``, started here as the worker starts ``realize``. Running it
as a program also keeps pspy's spin-waiting OpenMP threads and healpy's import out of the API
process. The debiasing itself is :func:`schemas.montecarlo.debiased_bandpowers`.

Or, with a pure-E and a pure-B campaign in place of the transfer campaign, ``T_b^-1 (C_b - N_b)`` for EE, EB,
BB with their E/B transfer matrix (:func:`transfer_matrix_pair`, also served as a product of its own,
``GET /api/v1/transfer-matrix``) and :func:`schemas.montecarlo.matrix_debiased_bandpowers`; the pure-E
campaign then plays the transfer campaign's part (its mask, its F_b for TT and TE).

The costly part is the map's bandpowers, and in them the mode coupling of the campaigns' mask. The
coupling lives at the sites (their coupling files, ``service.queue.couplings``), not at the service: the
service keeps its own, one file per coupling key and mask under ``<data_dir>/couplings`` (written by the
first request that needs it, read by the next ones). A request runs in three steps, none holding a
database session across the next: the campaigns are looked up and compared in one brief read session
(before the body is read), the body is streamed to a file, the program runs. Each user runs at most
``spectrum_per_user`` requests at once (:class:`PerUserSlots`; more: 429 with ``Retry-After``).
"""

from __future__ import annotations

import io
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import numpy as np
from sqlalchemy import select
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
from schemas.spec import CampaignSpec, coupling_key
from service.campaigns import reads as campaigns
from service.campaigns.models import Campaign
from service.errors import InvalidField, TooManyRequests
from service.products.aggregates import AggregateState, BandpowerAggregates, bandpower_aggregates
from service.products.service import ProductsNotReady, snapshot
from service.storage import CampaignProducts

log = logging.getLogger("mapcampaign.service")

BANDPOWERS_TIMEOUT_S = 600.0  # the map-maker's bandpowers of one map: seconds at nside 256 (pure B, one thread)
RETRY_AFTER_S = 10  # a spectrum takes seconds to minutes: a client over its limit asks again after this
WORK_PATTERNS = (".upload-*", "spectrum-*")  # a request's map (service.limits.receive_to_file), older folders
STALE_WORK_AGE_S = 2 * 3_600.0  # older than any running request's folder (BANDPOWERS_TIMEOUT_S + the upload)

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
# Roles whose campaign's mask the data map's bandpowers are computed on.
MASK_ROLES = ("transfer", "transfer_e")


@dataclass(frozen=True)
class CampaignRef:
    """What a request needs of a campaign's row, read in its brief session."""

    id: int
    kind: str
    scan_key: str
    coupling_key: str


@dataclass(frozen=True)
class RoleCampaign:
    role: str
    campaign: CampaignRef
    files: CampaignProducts
    state: AggregateState
    bandpowers: BandpowerAggregates


def _role_campaign(
    *, session: Session, owner_id: int, products_dir: Path, role: str, campaign_id: int, field: str | None = None
) -> RoleCampaign:
    """The campaign ``campaign_id`` checked for ``role``; a refusal names the query ``field`` (default: the role)."""
    field = field or role
    row = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    campaign = CampaignRef(
        id=row.id,
        kind=row.kind,
        scan_key=row.scan_key,
        coupling_key=coupling_key(CampaignSpec.model_validate(row.spec)),
    )
    kind, gives = ROLES[role]
    if campaign.kind != kind:
        raise InvalidField(
            ("query", field), f"campaign {campaign_id} is {campaign.kind}: {gives} comes from a {kind} campaign"
        )
    wanted_polarization = POLARIZATION_OF_ROLE.get(role)
    if wanted_polarization is not None:
        polarization = sky_polarization(row.spec)
        if polarization != wanted_polarization:
            raise InvalidField(
                ("query", field),
                f"campaign {campaign_id} has sky.polarization {polarization!r}: {gives} comes from a signal-only "
                f"campaign with sky.polarization = {wanted_polarization!r}",
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
    if role in MASK_ROLES and state.mask is None:
        raise ProductsNotReady(f"campaign {campaign.id} has no stored mask yet")
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


def _pair(pure_e: RoleCampaign, pure_b: RoleCampaign, field: str) -> MatrixPair:
    """The matrix of two checked campaigns; 422 on ``field`` when they differ in what the matrix needs alike."""
    differences = _differences(pure_e, pure_b)
    if differences:
        raise InvalidField(
            ("query", field),
            f"campaign {pure_b.campaign.id} differs from the pure-E campaign {pure_e.campaign.id} in "
            f"{'; '.join(differences)}: the two need the same coupling key (scan, ranks, solver.rcond_min, "
            "products settings)",
        )
    e, b = pure_e.bandpowers, pure_b.bandpowers
    assert e.model is not None and b.model is not None  # transfer_available, checked by _role_campaign
    matrix = montecarlo.transfer_matrix(
        e_mean=e.mean, e_covariance=e.covariance, e_n=e.n, e_model=e.model,
        b_mean=b.mean, b_covariance=b.covariance, b_n=b.n, b_model=b.model,
    )
    return MatrixPair(pure_e, pure_b, matrix)


def transfer_matrix_pair(
    *, session: Session, owner_id: int, products_dir: Path, pure_e_id: int, pure_b_id: int,
    fields: tuple[str, str] = ("transfer_e", "transfer_b"),
) -> MatrixPair:
    """The E/B transfer matrix (:func:`schemas.montecarlo.transfer_matrix`) of the two campaigns' current aggregates.

    Each must be the caller's (else 404), signal-only with its ``sky.polarization`` (else 422 on its query
    field, ``fields``), with two realisations (404 ``products_not_ready`` before); the two must agree in scan
    key, mask, binning and estimator (422 on the pure-B field): the matrix needs one coupling.
    """
    pure_e = _role_campaign(
        session=session, owner_id=owner_id, products_dir=products_dir, role="transfer_e", campaign_id=pure_e_id,
        field=fields[0],
    )
    pure_b = _role_campaign(
        session=session, owner_id=owner_id, products_dir=products_dir, role="transfer_b", campaign_id=pure_b_id,
        field=fields[1],
    )
    return _pair(pure_e, pure_b, fields[1])


def sky_polarization(spec: dict) -> str | None:
    """A stored spec's ``sky.polarization`` ("both" when left out), None for a sky that is not a CMB draw."""
    sky = (spec or {}).get("sky") or {}
    return sky.get("polarization", "both") if sky.get("kind", "cmb") == "cmb" else None


def matrix_partner(*, session: Session, owner_id: int, campaign: Campaign) -> Campaign | None:
    """The owner's latest signal-only campaign of the other pure polarisation with ``campaign``'s coupling key
    (a pure-E campaign's pure-B partner, or the other way round), None when ``campaign`` is not pure or has none."""
    polarization = sky_polarization(campaign.spec)
    if campaign.kind != "signal-only" or polarization not in ("E-only", "B-only"):
        return None
    wanted = "B-only" if polarization == "E-only" else "E-only"
    key = coupling_key(CampaignSpec.model_validate(campaign.spec))
    candidates = session.scalars(
        select(Campaign)
        .where(
            Campaign.owner_id == owner_id,
            Campaign.kind == "signal-only",
            Campaign.scan_key == campaign.scan_key,
            Campaign.id != campaign.id,
        )
        .order_by(Campaign.id.desc())
    )
    for candidate in candidates:
        if sky_polarization(candidate.spec) == wanted and coupling_key(CampaignSpec.model_validate(candidate.spec)) == key:
            return candidate
    return None


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


class PerUserSlots:
    """How many spectrum requests each user runs in this process; one more than allowed is a 429.

    Used from the event loop only (the endpoint is async), so a plain dict is enough.
    """

    def __init__(self) -> None:
        self._running: dict[int, int] = {}

    @contextmanager
    def hold(self, user_id: int, limit: int) -> Iterator[None]:
        running = self._running.get(user_id, 0)
        if running >= limit:
            raise TooManyRequests(
                f"you already have {running} spectrum request(s) running, the most one user may "
                f"(MAPCAMPAIGN_SPECTRUM_PER_USER = {limit}); try again when one has finished",
                RETRY_AFTER_S,
            )
        self._running[user_id] = running + 1
        try:
            yield
        finally:
            left = self._running[user_id] - 1
            if left:
                self._running[user_id] = left
            else:
                del self._running[user_id]


def is_fits(start: bytes) -> bool:
    """Whether a file's first bytes are a FITS file's: every one starts with ``SIMPLE  =``."""
    return start.startswith(b"SIMPLE  =")


def coupling_file(coupling_dir: Path, transfer: RoleCampaign) -> Path:
    """The service's coupling file for the transfer campaign's coupling key and mask."""
    return coupling_dir / f"{transfer.campaign.coupling_key}-{transfer.bandpowers.mask_sha256}.npz"


async def map_bandpowers(transfer: RoleCampaign, map_file: Path, *, coupling_dir: Path) -> MapBandpowers:
    """The data map's decoupled bandpowers on the transfer campaign's mask, from ``python -m mapmaker bandpowers``
    with the service's coupling file of that mask (built and written by the program when missing). Holds no
    database session and no thread while the program runs."""
    coupling_dir.mkdir(parents=True, exist_ok=True)
    out = map_file.with_name(map_file.name + ".bandpowers.json")
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
        coupling_file=coupling_file(coupling_dir, transfer),
    )
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        with anyio.fail_after(BANDPOWERS_TIMEOUT_S):  # the program is killed when the request ends first
            done = await anyio.run_process(command, env=environment, check=False)
        stderr = done.stderr.decode(errors="replace")
        reason = (stderr.strip().splitlines() or ["no message"])[-1].removeprefix("mapmaker bandpowers: ")
        if done.returncode == MapmakerExit.BAD_INPUT:
            raise InvalidField(("body",), reason)
        if done.returncode == MapmakerExit.COUPLING_REFUSED:
            raise InvalidField(("query", "transfer"), f"campaign {transfer.campaign.id}'s stored mask: {reason}")
        if done.returncode != 0:
            raise RuntimeError(f"mapmaker bandpowers exited {done.returncode}: {stderr[-2000:]}")
        return MapBandpowers.model_validate_json(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def sweep_spectrum_work(work_dir: Path, *, now: float | None = None) -> int:
    """Remove maps and folders no running request uses (older than :data:`STALE_WORK_AGE_S`); return how many."""
    if not work_dir.is_dir():
        return 0
    now = time.time() if now is None else now
    removed = 0
    for path in (path for pattern in WORK_PATTERNS for path in work_dir.glob(pattern)):
        try:
            if now - path.stat().st_mtime > STALE_WORK_AGE_S:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed += 1
        except OSError:
            continue
    if removed:
        log.info("removed %d stale spectrum work folder(s) from %s", removed, work_dir)
    return removed


def resolve_campaigns(
    *,
    session: Session,
    owner_id: int,
    products_dir: Path,
    transfer_id: int | None,
    noise_id: int,
    covariance_id: int | None,
    transfer_e_id: int | None = None,
    transfer_b_id: int | None = None,
) -> dict[str, RoleCampaign]:
    """The request's campaigns by role, checked: the caller's (else 404), of the kind each role needs, with
    bandpowers, and agreeing with the transfer campaign in scan key, mask, binning and estimator (else 422
    naming the query field and what differs).

    The correction comes from a ``transfer`` campaign (F_b) or a ``transfer_e`` and ``transfer_b`` pair (the
    E/B transfer matrix), one or the other (else 422). With the pair, the pure-E campaign is the answer's
    ``"transfer"`` (its mask, its F_b for TT and TE) and the pure-B one its ``"transfer_b"``.
    """
    pair_given = (transfer_e_id is not None, transfer_b_id is not None)
    if transfer_id is not None and any(pair_given):
        raise InvalidField(
            ("query", "transfer"),
            "give a transfer campaign (F_b) or a transfer_e and transfer_b pair (the matrix), not both",
        )
    if transfer_id is None and not all(pair_given):
        missing = "transfer_b" if pair_given[0] else "transfer_e" if pair_given[1] else "transfer"
        raise InvalidField(
            ("query", missing),
            "a transfer campaign (F_b) or a transfer_e and transfer_b pair (the E/B transfer matrix) is required",
        )
    if transfer_id is None:
        assert transfer_e_id is not None and transfer_b_id is not None
        pair = transfer_matrix_pair(
            session=session, owner_id=owner_id, products_dir=products_dir, pure_e_id=transfer_e_id,
            pure_b_id=transfer_b_id,
        )
        roles = {"transfer": pair.pure_e, "transfer_b": pair.pure_b}
    else:
        roles = {
            "transfer": _role_campaign(
                session=session, owner_id=owner_id, products_dir=products_dir, role="transfer", campaign_id=transfer_id
            )
        }
    wanted = {"noise": noise_id, "covariance": covariance_id}
    roles.update(
        {
            role: _role_campaign(
                session=session, owner_id=owner_id, products_dir=products_dir, role=role, campaign_id=campaign_id
            )
            for role, campaign_id in wanted.items()
            if campaign_id is not None
        }
    )
    transfer = roles["transfer"]
    for role in ("noise", "covariance"):
        if role in roles:
            differences = _differences(transfer, roles[role])
            if differences:
                raise InvalidField(
                    ("query", role),
                    f"campaign {roles[role].campaign.id} differs from the transfer campaign {transfer.campaign.id} "
                    f"in {'; '.join(differences)}",
                )
    return roles


def data_spectrum(roles: dict[str, RoleCampaign], measured: MapBandpowers) -> DataSpectrum:
    """Unbiased bandpowers of a map whose bandpowers are ``measured``, with Monte Carlo errors from the covariance
    campaign when there is one (``roles`` from :func:`resolve_campaigns`): ``(C_b - N_b) / F_b``, or with a
    pure-B campaign among the roles ``T_b^-1 (C_b - N_b)`` for EE, EB, BB and the matrix's own error apart."""
    transfer = roles["transfer"]
    pair = _pair(transfer, roles["transfer_b"], "transfer_b") if "transfer_b" in roles else None
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
            transfer=transfer.campaign.id if pair is None else None,
            transfer_e=None if pair is None else pair.pure_e.campaign.id,
            transfer_b=None if pair is None else pair.pure_b.campaign.id,
            noise=roles["noise"].campaign.id,
            covariance=roles["covariance"].campaign.id if "covariance" in roles else None,
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
