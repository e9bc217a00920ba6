"""Running Monte Carlo aggregates of one campaign: spectra and map sums, with the ledger of what they include.

Where the state lives. Everything is in files in the campaign's aggregates
folder, beside the realisations' products (paths: :class:`service.storage.CampaignProducts`)::

    state.json                  ledger + spectra sums + pointers (the commit point)
    mapsums-<generation>.npz    per-pixel count, mean, M2 of I, Q, U
    bpsums-<generation>.npz     mean [p] and co-moment [p, p] of the decoupled bandpowers (p = 6 n_bins)
    mask.fits                   the analysis mask, stored once per campaign
    .lock                       per-campaign lock (flock)
    cache/                      downloads and images derived from one generation

Why files and not the database: the map sums are arrays of 3 x npix x 2
doubles (hundreds of MB at nside 2048) that belong on disk anyway; keeping
the small spectra sums and the ledger in the *same* file as the pointer to the
map sums makes every update a single atomic rename, so the aggregates and the
ledger can never disagree (a database row plus a file would need a two-phase
update). The database stays the truth about which realisations succeeded;
:mod:`service.products.reconcile` compares the two. Deleting a campaign
removes its folder and with it the aggregates. No migration is needed.

One update (:func:`include_realization`), under the campaign's lock:

1. read ``state.json``; a realisation already in the ledger is skipped
   (idempotent: the hook and the reconciler may both offer it);
2. add its binned spectra to the running sums, its decoupled bandpowers to
   the bandpower sums (mean and co-moment matrix: the covariance) and its
   map to the map sums (Welford: mean and M2 per value, so the variance
   stays accurate where the scatter is small against the mean); write the
   new sums to ``mapsums-<generation + 1>.npz`` and
   ``bpsums-<generation + 1>.npz`` (temporary file + rename);
3. store the mask if the campaign has none yet;
4. write ``state.json`` (temporary file + fsync + rename + fsync of the
   folder): this rename commits the update;
5. remove map-sum files of older generations.

A crash before step 4 leaves the old state, which does not include the
realisation: the reconciler adds it again later; a stray newer map-sum file
is ignored and removed by the next update. A crash after step 4 leaves only
stale files. Memory and state size do not grow with the number of
realisations: the ledger is a list of index ranges.

The lock is ``flock`` on ``.lock``: it serialises the API processes (and
threads) of one host that share the data folder, which the products already
require. Standard deviations are sample standard deviations (ddof = 1).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from campaignlib import montecarlo
from campaignlib.healpixfile import NotAHealpixMap, observed_columns, read_healpix_fields
from campaignlib.sitesums import ledger_add, ledger_contains, ledger_count
from schemas.files import atomic_write, atomic_write_bytes, sha256_file
from schemas.result import SPECTRA, SpectrumName
from service.storage import CampaignProducts

log = logging.getLogger("mapcampaign.products")

STATE_FORMAT = 1
MAX_WARNINGS = 20
UNSEEN = -1.6375e30  # healpy.UNSEEN, without importing healpy for every state read
MAP_UPDATE_PIXELS = 1 << 18  # pixels per slice of a map's update: 6 MiB of I/Q/U float64 temporaries


# --------------------------------------------------------------------------- files


@contextlib.contextmanager
def campaign_lock(files: CampaignProducts) -> Iterator[None]:
    """Exclusive per-campaign lock across processes and threads (``flock`` on a separate open file each time)."""
    files.root.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(files.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


# --------------------------------------------------------------------------- ledger: sorted [start, stop) ranges


def ledger_indexes(ranges: list[list[int]]) -> Iterator[int]:
    for start, stop in ranges:
        yield from range(start, stop)


# --------------------------------------------------------------------------- Welford


def welford_add(count: int | np.ndarray, mean: np.ndarray, m2: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Add one sample to a running (mean, M2) of ``count`` samples; returns the new (mean, M2)."""
    delta = value - mean
    mean = mean + delta / (count + 1)
    m2 = m2 + delta * (value - mean)
    return mean, m2


def sample_std(count: int, m2: np.ndarray) -> np.ndarray:
    """Standard deviation with ddof = 1 from Welford's sum of squared deviations ``m2``; needs two samples."""
    if count < 2:
        raise ValueError(f"a sample standard deviation needs two samples, not {count}")
    return np.sqrt(np.maximum(m2, 0.0) / (count - 1))


# --------------------------------------------------------------------------- state


@dataclass
class AggregateState:
    """What ``state.json`` holds (plain data; see the module doc)."""

    campaign_id: int
    generation: int = 0
    spec_hash: str | None = None
    included: list[list[int]] = field(default_factory=list)
    spectra: dict[str, Any] | None = None  # binning, mask moments, model, n, mean {name: [...]}, m2 {name: [...]}
    maps: dict[str, Any] | None = None  # {file, nside, n (realisations with a map)}
    mask: dict[str, Any] | None = None  # {file, sha256, realization}
    bandpowers: dict[str, Any] | None = None  # identity (BANDPOWER_IDENTITY), model, n, file (the bpsums npz)
    kept: dict[str, list[list[int]]] = field(default_factory=dict)  # site -> realisations whose map it keeps
    site_sums: dict[str, dict[str, Any]] = field(default_factory=dict)  # site -> {file, version, n, ledger}
    warnings: list[str] = field(default_factory=list)
    updated_at: str | None = None

    @property
    def n_included(self) -> int:
        return ledger_count(self.included)

    @property
    def n_spectra(self) -> int:
        return int(self.spectra["n"]) if self.spectra else 0

    @property
    def n_maps(self) -> int:
        """Realisations in the mean and variance maps: uploaded maps and the sites' partial sums."""
        uploaded = int(self.maps["n"]) if self.maps else 0
        return uploaded + sum(int(sums["n"]) for sums in self.site_sums.values())

    @property
    def n_bandpowers(self) -> int:
        return int(self.bandpowers["n"]) if self.bandpowers else 0

    @property
    def has_products(self) -> bool:
        return self.n_spectra > 0 or self.n_maps > 0 or self.n_bandpowers > 0

    def includes(self, index: int) -> bool:
        return ledger_contains(self.included, index)

    def warn(self, message: str) -> None:
        log.warning("campaign %d products: %s", self.campaign_id, message)
        self.warnings = [*self.warnings, message][-MAX_WARNINGS:]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "campaign_id": self.campaign_id,
            "generation": self.generation,
            "spec_hash": self.spec_hash,
            "included": self.included,
            "spectra": self.spectra,
            "maps": self.maps,
            "mask": self.mask,
            "bandpowers": self.bandpowers,
            "kept": self.kept,
            "site_sums": self.site_sums,
            "warnings": self.warnings,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AggregateState:
        if data.get("format") != STATE_FORMAT:
            raise ValueError(f"unknown state format {data.get('format')!r}")
        return cls(
            campaign_id=int(data["campaign_id"]),
            generation=int(data["generation"]),
            spec_hash=data.get("spec_hash"),
            included=[[int(a), int(b)] for a, b in data.get("included", [])],
            spectra=data.get("spectra"),
            maps=data.get("maps"),
            mask=data.get("mask"),
            bandpowers=data.get("bandpowers"),
            kept={str(site): [[int(a), int(b)] for a, b in ranges] for site, ranges in (data.get("kept") or {}).items()},
            site_sums=dict(data.get("site_sums") or {}),
            warnings=list(data.get("warnings", [])),
            updated_at=data.get("updated_at"),
        )


def load_state(files: CampaignProducts) -> AggregateState | None:
    """The committed state, or None when the campaign has none (or it cannot be read: logged, then rebuilt)."""
    try:
        data = json.loads(files.state_path.read_text())
        return AggregateState.from_json(data)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        # Atomic renames make this unexpected; the inputs are all kept, so start again from them.
        broken = files.unreadable_state_path()
        log.error(
            "campaign %d: aggregate state unreadable (%s); moved to %s and rebuilt", files.campaign_id, error, broken
        )
        with contextlib.suppress(OSError):
            os.replace(files.state_path, broken)
        return None


def save_state(files: CampaignProducts, state: AggregateState) -> None:
    payload = json.dumps(state.to_json(), separators=(",", ":"), allow_nan=False).encode()
    atomic_write_bytes(files.state_path, payload)


def load_map_sums(files: CampaignProducts, state: AggregateState) -> dict[str, np.ndarray] | None:
    """``count [npix]`` int64, ``mean`` and ``m2`` [3, npix] of the uploaded maps, of the state's generation
    (None before the first uploaded map; the sites' partial sums are apart: :mod:`service.products.mapsums`)."""
    if not state.maps or not state.maps.get("file"):
        return None
    with np.load(files.root / state.maps["file"]) as data:
        return {name: data[name] for name in ("count", "mean", "m2")}


def load_bandpower_sums(files: CampaignProducts, state: AggregateState) -> dict[str, np.ndarray] | None:
    """``mean [p]`` and ``comoment [p, p]`` of the state's generation (p = 6 n_bins, spectrum-major)."""
    if not state.bandpowers:
        return None
    with np.load(files.root / state.bandpowers["file"]) as data:
        return {name: data[name] for name in ("mean", "comoment")}


# --------------------------------------------------------------------------- one realisation


SPECTRA_IDENTITY = ("ell_min", "ell_max", "lmax", "ell_bin_width", "apodization_deg", "min_hits", "signal", "noise")


class RealizationUnusable(ValueError):
    """A part of a realisation's products cannot join the aggregates (recorded as a warning)."""


def _add_spectra(state: AggregateState, index: int, record: dict[str, Any]) -> None:
    cl = record.get("cl") or {}
    if set(cl) != set(SPECTRA):
        raise RealizationUnusable(f"realisation {index}: spectra without all of {', '.join(SPECTRA)}")
    bins = len(record["ell_min"])
    if any(len(cl[name]) != bins for name in SPECTRA) or len(record["ell_max"]) != bins:
        raise RealizationUnusable(f"realisation {index}: spectra of the wrong length")
    values = {name: np.asarray(cl[name], dtype=np.float64) for name in SPECTRA}
    if not all(np.all(np.isfinite(v)) for v in values.values()):
        raise RealizationUnusable(f"realisation {index}: spectra with non-finite values")
    if state.spectra is None:
        state.spectra = {key: record[key] for key in SPECTRA_IDENTITY}
        state.spectra.update(
            w2=float(record["w2"]),
            fsky=float(record["fsky"]),
            model=record.get("model"),
            beam_fwhm_arcmin=record.get("beam_fwhm_arcmin"),
            n=0,
            mean={name: [0.0] * bins for name in SPECTRA},
            m2={name: [0.0] * bins for name in SPECTRA},
        )
    else:
        different = [key for key in SPECTRA_IDENTITY if state.spectra[key] != record[key]]
        if different:
            raise RealizationUnusable(
                f"realisation {index}: spectra differ from the campaign's in {', '.join(different)}"
            )
        if not math.isclose(state.spectra["w2"], float(record["w2"]), rel_tol=1e-9):
            state.warn(f"realisation {index}: mask w2 {record['w2']:.6g} differs from {state.spectra['w2']:.6g}")
    count = int(state.spectra["n"])
    for name in SPECTRA:
        mean, m2 = welford_add(
            count,
            np.asarray(state.spectra["mean"][name]),
            np.asarray(state.spectra["m2"][name]),
            values[name],
        )
        state.spectra["mean"][name] = mean.tolist()
        state.spectra["m2"][name] = m2.tolist()
    state.spectra["n"] = count + 1


# What must agree between the realisations whose bandpowers are averaged (and between campaigns combined
# for a data map's spectrum): the bins, the estimator and the mask the coupling was built for.
BANDPOWER_IDENTITY = ("ell_lo", "ell_hi", "lmax", "bin_width", "purify_b", "mask_sha256", "signal", "noise")


def _add_bandpowers(
    state: AggregateState, index: int, record: dict[str, Any], current: dict[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """Add one realisation's decoupled bandpowers (``record``: its ``BinnedSpectra`` as data) to the sums."""
    bandpowers = record["bandpowers"]
    identity = {key: bandpowers[key] for key in BANDPOWER_IDENTITY if key in bandpowers}
    identity.update(signal=bool(record["signal"]), noise=bool(record["noise"]))
    n_bins = len(identity["ell_lo"])
    cb = bandpowers.get("cb") or {}
    if set(cb) != set(SPECTRA) or any(len(cb[name]) != n_bins for name in SPECTRA):
        raise RealizationUnusable(f"realisation {index}: bandpowers without {n_bins} bins of each of {', '.join(SPECTRA)}")
    value = np.array([cb[name] for name in SPECTRA], dtype=np.float64)
    if not np.all(np.isfinite(value)):
        raise RealizationUnusable(f"realisation {index}: bandpowers with non-finite values")
    if state.bandpowers is None or current is None:
        model = bandpowers.get("model")
        state.bandpowers = {
            **identity,
            "reliable": bandpowers.get("reliable"),
            "model": {name: list(model[name]) for name in SPECTRA} if model else None,
            "beam_fwhm_arcmin": record.get("beam_fwhm_arcmin"),
            "n": 0,
            "file": None,
        }
        p = value.size
        current = {"mean": np.zeros(p), "comoment": np.zeros((p, p))}
    else:
        different = [key for key in BANDPOWER_IDENTITY if state.bandpowers.get(key) != identity.get(key)]
        if different:
            raise RealizationUnusable(
                f"realisation {index}: bandpowers differ from the campaign's in {', '.join(different)}"
            )
    count = int(state.bandpowers["n"])
    mean, comoment = montecarlo.moments_add(count, current["mean"], current["comoment"], value)
    state.bandpowers["n"] = count + 1
    return {"mean": mean, "comoment": comoment}


def _read_iqu(path: Path) -> tuple[int, np.ndarray | None, np.ndarray]:
    """``(npix, pixels, iqu)`` of a realisation's map file, cut-sky or full-sky (:func:`campaignlib.healpixfile.read_healpix_fields`)."""
    try:
        return read_healpix_fields(path, 3)
    except NotAHealpixMap:
        raise RealizationUnusable(f"{path.name} is not a HEALPix I/Q/U map") from None


def _add_map(
    files: CampaignProducts, state: AggregateState, index: int, path: Path, current: dict[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """Add one realisation's map to the per-pixel sums, in place over its observed pixels only.

    Memory beyond the sums (count, mean and M2: 7 npix float64 words): the file's values
    (3 values and an index per listed pixel; a full-sky file: 3 npix) and their update.
    """
    npix, pixels, iqu = _read_iqu(path)
    if current is None:
        current = {"count": np.zeros(npix, dtype=np.int64), "mean": np.zeros((3, npix)), "m2": np.zeros((3, npix))}
    elif current["count"].size != npix:
        raise RealizationUnusable(
            f"realisation {index}: map of {npix} pixels, the campaign's have {current['count'].size}"
        )
    where, columns = observed_columns(pixels, iqu)
    # In slices of MAP_UPDATE_PIXELS, so that the update's temporaries stay a fraction of one map.
    for start in range(0, where.size, MAP_UPDATE_PIXELS):
        chunk = where[start : start + MAP_UPDATE_PIXELS]
        values = iqu[:, columns[start : start + MAP_UPDATE_PIXELS]]
        count = current["count"][chunk]
        mean, m2 = welford_add(count, current["mean"][:, chunk], current["m2"][:, chunk], values)
        current["mean"][:, chunk] = mean
        current["m2"][:, chunk] = m2
        current["count"][chunk] = count + 1
    return current


def _store_mask(files: CampaignProducts, state: AggregateState, index: int, path: Path) -> None:
    digest = sha256_file(path)
    if state.mask is None:
        atomic_write_bytes(files.mask_path, path.read_bytes())
        state.mask = {"file": files.mask_path.name, "sha256": digest, "realization": index}
    elif state.mask["sha256"] != digest:
        state.warn(
            f"realisation {index}: its mask differs from the campaign's (from realisation {state.mask['realization']})"
        )


def _kept_at(result: dict[str, Any], role: str) -> str | None:
    """The site that keeps the realisation's ``role`` file, or None when it was uploaded (or is absent)."""
    for product in result.get("products") or []:
        if product.get("name") == role and product.get("kept"):
            return str(product["kept"]["site"])
    return None


def _product_path(result: dict[str, Any], product_dir: Path, role: str) -> Path | None:
    for product in result.get("products") or []:
        if product.get("kept"):
            continue
        if product.get("name") == role and "/" not in product.get("path", "/"):
            path = product_dir / product["path"]
            return path if path.is_file() else None
    return None


def include_realization(
    files: CampaignProducts, index: int, result: dict[str, Any], product_dir: Path | None = None
) -> bool:
    """Add a succeeded realisation to the campaign's aggregates once; False when it was already included.

    ``result`` is the stored :class:`schemas.result.RealizationResult` (as
    JSON data), ``product_dir`` the folder of its accepted product files
    (default: the campaign's ``realizations/<index>``). Parts that cannot be
    used (no spectra, unreadable map, other binning) are left out with a
    warning in the state; the realisation still enters the ledger, so it is
    not offered again.
    """
    product_dir = product_dir or files.realization_dir(index)
    with campaign_lock(files):
        state = load_state(files) or AggregateState(campaign_id=files.campaign_id)
        spec_hash = result.get("spec_hash")
        if state.spec_hash is not None and spec_hash is not None and spec_hash != state.spec_hash:
            # Only a campaign id reused after a deletion gets here: that state is not this campaign's.
            log.warning("campaign %d: aggregates of another spec found; starting again", files.campaign_id)
            state = AggregateState(campaign_id=files.campaign_id)
        if state.includes(index):
            return False
        state.spec_hash = state.spec_hash or spec_hash
        map_sums = load_map_sums(files, state)
        new_map_file = None

        record = result.get("spectra")
        if record:
            try:
                _add_spectra(state, index, record)
            except (RealizationUnusable, KeyError, TypeError, ValueError) as error:
                state.warn(f"spectra left out: {error}")
        if record and record.get("bandpowers"):
            before = dict(state.bandpowers) if state.bandpowers else None
            try:
                bandpower_sums = _add_bandpowers(state, index, record, load_bandpower_sums(files, state))
            except (RealizationUnusable, KeyError, TypeError, ValueError) as error:
                state.bandpowers = before
                state.warn(f"bandpowers left out: {error}")
            else:
                bandpower_file = files.bandpower_sums_path(state.generation + 1)
                mean, comoment = bandpower_sums["mean"], bandpower_sums["comoment"]
                atomic_write(bandpower_file, lambda handle: np.savez(handle, mean=mean, comoment=comoment))
                state.bandpowers = {**(state.bandpowers or {}), "file": bandpower_file.name}
        iqu_path = _product_path(result, product_dir, "iqu")
        if iqu_path is not None:
            try:
                map_sums = _add_map(files, state, index, iqu_path, map_sums)
            except RealizationUnusable as error:
                state.warn(f"map left out: {error}")
            else:
                new_map_file = files.map_sums_path(state.generation + 1)
                sums = map_sums
                atomic_write(new_map_file, lambda handle: np.savez(handle, allow_pickle=True, **sums))
                state.maps = {
                    "file": new_map_file.name,
                    "nside": round(math.sqrt(sums["count"].size / 12)),
                    "n": (int(state.maps["n"]) if state.maps else 0) + 1,
                    "ledger": ledger_add((state.maps or {}).get("ledger") or [], index),
                }
        keeper = _kept_at(result, "iqu")
        if keeper is not None:
            # Its map joins the mean and variance through the site's partial sums (service.products.mapsums).
            state.kept[keeper] = ledger_add(state.kept.get(keeper, []), index)
        mask_path = _product_path(result, product_dir, "mask")
        if mask_path is not None:
            _store_mask(files, state, index, mask_path)

        state.included = ledger_add(state.included, index)
        state.generation += 1
        state.updated_at = datetime.now(UTC).isoformat()
        save_state(files, state)  # the commit point
        _remove_stale(files, state)
        return True


def _remove_stale(files: CampaignProducts, state: AggregateState) -> None:
    keep = {state.maps["file"] if state.maps else None, state.bandpowers["file"] if state.bandpowers else None}
    keep |= {sums["file"] for sums in state.site_sums.values()}
    for path in [*files.map_sums_files(), *files.bandpower_sums_files(), *files.site_sums_files()]:
        if path.name not in keep:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if files.cache_dir.is_dir():
        # Files of the previous generation stay: a request may be serving one right now.
        for path in files.cache_dir.iterdir():
            generation = files.cache_generation(path.name)
            if generation is None or generation < state.generation - 1:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- reading the aggregates


@dataclass(frozen=True)
class SpectraAggregates:
    """Mean and scatter per bin, and the corrections derived from them (arrays [n_bins])."""

    n: int
    ell_min: np.ndarray
    ell_max: np.ndarray
    lmax: int
    ell_bin_width: int
    w2: float
    fsky: float
    signal: bool
    noise: bool
    mean: dict[SpectrumName, np.ndarray]
    std: dict[SpectrumName, np.ndarray] | None
    model: dict[SpectrumName, np.ndarray] | None
    beam_fwhm_arcmin: float | None
    apodization_deg: float
    min_hits: int

    @property
    def ell_center(self) -> np.ndarray:
        return (self.ell_min + self.ell_max) / 2.0

    @property
    def noise_bias_available(self) -> bool:
        return self.noise and not self.signal and self.w2 > 0

    @property
    def transfer_available(self) -> bool:
        return self.signal and not self.noise and self.model is not None and self.w2 > 0

    def noise_bias(self) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """N_l = <C~_l> / w2 per spectrum, with its scatter std(C~_l) / w2 (one realisation's)."""
        return {
            name: (self.mean[name] / self.w2, None if self.std is None else self.std[name] / self.w2)
            for name in SPECTRA
        }

    def transfer_function(self) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """F_l = <C~_l> / (w2 C_l^in B_l^2) for TT, EE, BB (NaN where the model is 0), with its scatter."""
        out = {}
        if self.model is None:
            raise ValueError("no input model: the transfer function needs a campaign with a simulated sky")
        for name in ("TT", "EE", "BB"):
            denominator = self.w2 * self.model[name]
            with np.errstate(divide="ignore", invalid="ignore"):
                value = np.where(denominator > 0, self.mean[name] / denominator, np.nan)
                scatter = None if self.std is None else np.where(denominator > 0, self.std[name] / denominator, np.nan)
            out[name] = (value, scatter)
        return out


def spectra_aggregates(state: AggregateState) -> SpectraAggregates | None:
    spectra = state.spectra
    if not spectra or not spectra["n"]:
        return None
    n = int(spectra["n"])
    mean = {name: np.asarray(spectra["mean"][name], dtype=np.float64) for name in SPECTRA}
    std = None
    if n >= 2:
        std = {name: sample_std(n, np.asarray(spectra["m2"][name], dtype=np.float64)) for name in SPECTRA}
    model = spectra.get("model")
    return SpectraAggregates(
        n=n,
        ell_min=np.asarray(spectra["ell_min"], dtype=np.int64),
        ell_max=np.asarray(spectra["ell_max"], dtype=np.int64),
        lmax=int(spectra["lmax"]),
        ell_bin_width=int(spectra["ell_bin_width"]),
        w2=float(spectra["w2"]),
        fsky=float(spectra["fsky"]),
        signal=bool(spectra["signal"]),
        noise=bool(spectra["noise"]),
        mean=mean,
        std=std,
        model={name: np.asarray(model[name], dtype=np.float64) for name in SPECTRA} if model else None,
        beam_fwhm_arcmin=spectra.get("beam_fwhm_arcmin"),
        apodization_deg=float(spectra["apodization_deg"]),
        min_hits=int(spectra["min_hits"]),
    )


# --------------------------------------------------------------------------- decoupled bandpowers


@dataclass(frozen=True)
class BandpowerAggregates:
    """The campaign's decoupled bandpowers over its realisations (K^2; rows :data:`SPECTRA`, ``[6, n_bins]``).

    ``mean`` and its Monte Carlo ``error`` (``std / sqrt(n)``; NaN below 2), the ``covariance``
    ``[6 n_bins, 6 n_bins]`` of one realisation's bandpowers (spectrum-major; None below 2) with
    the Hartlap factor for its inverse, and the input ``model`` through the windows (signal
    campaigns with a CMB sky). The corrections follow :mod:`campaignlib.montecarlo`.
    """

    n: int
    ell_lo: np.ndarray  # [n_bins] int64
    ell_hi: np.ndarray  # [n_bins] int64
    lmax: int
    bin_width: int
    purify_b: bool
    mask_sha256: str
    reliable: np.ndarray  # [n_bins] bool
    signal: bool
    noise: bool
    mean: np.ndarray
    error: np.ndarray
    covariance: np.ndarray | None
    hartlap: float | None
    model: np.ndarray | None
    beam_fwhm_arcmin: float | None

    @property
    def ell_center(self) -> np.ndarray:
        return (self.ell_lo + self.ell_hi) / 2.0

    @property
    def transfer_available(self) -> bool:
        """Signal-only with an input model: ``<C_b> = F_b B_b^2 C_b^in`` gives F_b."""
        return self.signal and not self.noise and self.model is not None

    @property
    def noise_bias_available(self) -> bool:
        return self.noise and not self.signal

    @property
    def covariance_available(self) -> bool:
        """Signal+noise with two realisations: the covariance a data map's errors come from."""
        return self.signal and self.noise and self.covariance is not None

    def transfer_function(self) -> tuple[np.ndarray, np.ndarray]:
        """``(F_b, sigma_F_b)`` [6, n_bins] (NaN where the model is 0: EB, TB)."""
        if self.model is None:
            raise ValueError("no input model: the transfer function needs a campaign with a simulated CMB sky")
        return montecarlo.transfer_ratio(self.mean, self.error, self.model)

    def noise_bias(self) -> tuple[np.ndarray, np.ndarray]:
        """``(N_b, sigma_N_b)`` [6, n_bins] K^2: the mean noise-only bandpowers and their Monte Carlo error."""
        return self.mean, self.error


def bandpower_aggregates(files: CampaignProducts, state: AggregateState) -> BandpowerAggregates | None:
    """The campaign's bandpower aggregates of the state's generation, or None before the first."""
    record = state.bandpowers
    sums = load_bandpower_sums(files, state)
    if not record or sums is None or not record["n"]:
        return None
    n = int(record["n"])
    n_bins = len(record["ell_lo"])
    mean = sums["mean"].reshape(6, n_bins)
    covariance = hartlap = None
    error = np.full_like(mean, np.nan)
    if n >= 2:
        covariance, _, hartlap = montecarlo.covariance_from_moments(n, sums["comoment"])
        error = np.sqrt(np.maximum(np.diag(covariance), 0.0) / n).reshape(6, n_bins)
    model = record.get("model")
    reliable = record.get("reliable")
    return BandpowerAggregates(
        n=n,
        ell_lo=np.asarray(record["ell_lo"], dtype=np.int64),
        ell_hi=np.asarray(record["ell_hi"], dtype=np.int64),
        lmax=int(record["lmax"]),
        bin_width=int(record["bin_width"]),
        purify_b=bool(record["purify_b"]),
        mask_sha256=str(record["mask_sha256"]),
        reliable=np.asarray(reliable if reliable is not None else [True] * n_bins, dtype=bool),
        signal=bool(record["signal"]),
        noise=bool(record["noise"]),
        mean=mean,
        error=error,
        covariance=covariance,
        hartlap=hartlap,
        model=np.array([model[name] for name in SPECTRA], dtype=np.float64) if model else None,
        beam_fwhm_arcmin=record.get("beam_fwhm_arcmin"),
    )
