"""The spectrum of a user's data map from three campaigns: ``(C_b - N_b) / F_b`` with Monte Carlo errors.

The transfer function comes from a signal-only campaign, the noise bias from a noise-only one, and
the errors from the bandpower covariance of a signal+noise one; all must share the data's pointing
(scan key), mask and binning, else the request is refused naming what differs (422). The data
map's own bandpowers need the harmonic transforms and the mode coupling of ``mapmaker``, which the
service may not import (``tests/unit/test_architecture.py``): they come from the map-maker's
program ``python -m mapmaker bandpowers``, started here as the worker starts ``realize``. Running it
as a program also keeps pspy's spin-waiting OpenMP threads and healpy's import out of the API
process. The debiasing itself is :func:`schemas.montecarlo.debiased_bandpowers`.
"""

from __future__ import annotations

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
from schemas.products import BandpowerBins, BandpowerEstimate, DataSpectrum, SpectrumCampaigns
from schemas.programs import MapmakerExit, mapmaker_bandpowers_args
from schemas.result import SPECTRA, MapBandpowers
from service.campaigns import reads as campaigns
from service.campaigns.models import Campaign
from service.errors import InvalidField
from service.products.aggregates import AggregateState, BandpowerAggregates, bandpower_aggregates
from service.products.service import ProductsNotReady, snapshot
from service.storage import CampaignProducts

BANDPOWERS_TIMEOUT_S = 600.0  # the map-maker's bandpowers of one map: seconds at nside 256 (pure B, one thread)

# What each role needs: the campaign kind, and what it gives.
ROLES = {
    "transfer": ("signal-only", "the transfer function F_b"),
    "noise": ("noise-only", "the noise bias N_b"),
    "covariance": ("signal+noise", "the bandpower covariance"),
}


@dataclass(frozen=True)
class RoleCampaign:
    role: str
    campaign: Campaign
    files: CampaignProducts
    state: AggregateState
    bandpowers: BandpowerAggregates


def _role_campaign(*, session: Session, owner_id: int, products_dir: Path, role: str, campaign_id: int) -> RoleCampaign:
    campaign = campaigns.get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    kind, gives = ROLES[role]
    if campaign.kind != kind:
        raise InvalidField(
            ("query", role), f"campaign {campaign_id} is {campaign.kind}: {gives} comes from a {kind} campaign"
        )
    files = CampaignProducts(products_dir, campaign.id)

    def read(state: AggregateState) -> tuple[AggregateState, BandpowerAggregates | None]:
        return state, bandpower_aggregates(files, state)

    state, bandpowers = snapshot(files, read)
    if bandpowers is None:
        raise ProductsNotReady(f"campaign {campaign.id} has no decoupled bandpowers yet")
    if role == "transfer" and not bandpowers.transfer_available:
        raise InvalidField(("query", role), f"campaign {campaign_id} simulated no CMB sky: it has no input model")
    if role in ("transfer", "covariance") and bandpowers.n < 2:
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
    transfer_id: int,
    noise_id: int,
    covariance_id: int | None,
) -> DataSpectrum:
    """Unbiased bandpowers of the map in ``map_bytes`` (HEALPix FITS, I Q U in K) with Monte Carlo errors.

    Refused (422, naming the query field) when a campaign is of a kind that cannot give its part, or
    differs from the transfer campaign in scan key, mask, binning or estimator; the map is refused
    (422 on the body) when it is not an I/Q/U map of the campaigns' nside with values inside the mask.
    Another user's campaign is 404; a campaign without bandpowers yet is 404 ``products_not_ready``.
    """
    if not map_bytes.startswith(b"SIMPLE  ="):  # every FITS file starts so: refused before starting the program
        raise InvalidField(("body",), "the map is not a HEALPix FITS map: a FITS file starts with 'SIMPLE  ='")
    wanted = {"transfer": transfer_id, "noise": noise_id, "covariance": covariance_id}
    roles = {
        role: _role_campaign(
            session=session, owner_id=owner_id, products_dir=products_dir, role=role, campaign_id=campaign_id
        )
        for role, campaign_id in wanted.items()
        if campaign_id is not None
    }
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
    measured = _map_bandpowers(transfer, map_bytes, work_dir)
    data_cb = np.array([measured.cb[name] for name in SPECTRA])
    transfer_b, transfer_error = transfer.bandpowers.transfer_function()
    noise_b, noise_error = roles["noise"].bandpowers.noise_bias()
    covariance = roles["covariance"].bandpowers if "covariance" in roles else None
    cb, sigma = montecarlo.debiased_bandpowers(
        data_cb,
        noise_bias_cb=noise_b,
        transfer_b=transfer_b,
        covariance=None if covariance is None else covariance.covariance,
    )
    bandpowers = transfer.bandpowers
    model = bandpowers.model
    hartlap = None if covariance is None else covariance.hartlap
    return DataSpectrum(
        campaigns=SpectrumCampaigns(transfer=transfer_id, noise=noise_id, covariance=covariance_id),
        scan_key=transfer.campaign.scan_key,
        mask_sha256=bandpowers.mask_sha256,
        purify_b=bandpowers.purify_b,
        nside=measured.nside,
        bins=BandpowerBins(
            ell_lo=[int(v) for v in bandpowers.ell_lo],
            ell_hi=[int(v) for v in bandpowers.ell_hi],
            ell_center=[float(v) for v in bandpowers.ell_center],
            lmax=bandpowers.lmax,
            bin_width=bandpowers.bin_width,
            reliable=[bool(v) for v in bandpowers.reliable],
        ),
        cb={name: _finite(cb[row]) for row, name in enumerate(SPECTRA)},
        error=None if sigma is None else {name: _finite(sigma[row]) for row, name in enumerate(SPECTRA)},
        data_cb=measured.cb,
        noise_bias=_estimates(noise_b, noise_error),
        transfer_function=_estimates(transfer_b, transfer_error),
        model=None if model is None else {name: [float(v) for v in model[row]] for row, name in enumerate(SPECTRA)},
        covariance_n=None if covariance is None else covariance.n,
        hartlap=hartlap if hartlap is not None and math.isfinite(hartlap) else None,
        monopole_k=measured.monopole_k,
        dipole_k=measured.dipole_k,
    )
