"""Decoupled bandpowers of real realisations under ``mpiexec -n 2``, and the coupling file they share.

A signal-only (noiseless) satellite patch at nside 64: one 90-minute drift of a 50 deg spin
circle (no precession), four co-located detectors at 0/45/90/135 deg so that every observed
pixel is solved. The patch covers fsky ~0.4 (after the 10 deg C2 apodisation, w2 ~0.3). Each
realisation draws its own CMB sky, so the map holds that sky exactly (a noiseless solve) and
its decoupled bandpowers scatter around the model bandpowers by the sky's cosmic variance.

Realisation 0 builds the coupling and writes ``--coupling``; the next ones read it (the file's
inode and mtime do not change, result.json says "file", stderr says "read from"). A coupling
file for another mask is refused after the solve (exit 3, no product folder), one for another
binning or a damaged one before the solve.

The runs use the numpy kernels: the fast ones compile for ~50 s on a cold cache, longer than
these solves take.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys

import healpy as hp
import numpy as np
import pytest
from mpi_support import realize

from mapmaker.model import bandpowers as bp
from schemas.programs import MapmakerExit, mapmaker_bandpowers_args
from schemas.result import RealizationResult

pytestmark = pytest.mark.mpi

NSIDE = 64
BIN_WIDTH = 16
REALIZATIONS = 4

SPEC = """
name = "bandpowers test"
kind = "signal-only"
realizations = 4
seed = 21

[scan]
kind = "satellite"
duration_s = 5400.0
chunk_s = 900.0
spin_period_s = 30.0
spin_angle_deg = 50.0
precession_period_s = 600.0
precession_angle_deg = 0.0
drift_deg_per_day = 1440.0

[focal_plane]
sample_rate_hz = 16.0
detectors = [
  { name = "A0", offset_x_deg = 0.5, pol_angle_deg = 0.0 },
  { name = "B0", offset_x_deg = 0.5, pol_angle_deg = 90.0 },
  { name = "A1", offset_x_deg = 0.5, pol_angle_deg = 45.0 },
  { name = "B1", offset_x_deg = 0.5, pol_angle_deg = 135.0 },
]

[pixelization]
nside = 64

[sky]
kind = "cmb"
seed = 5
fwhm_arcmin = 60.0

[noise]
enabled = false

[solver]
tol = 1e-10
rcond_min = 1e-2

[products]
ell_bin_width = 16
apodization_deg = 10.0
min_hits = 3

[resources]
ranks = 2
"""


def run(spec, realization, out, *extra):
    return realize(2, spec, realization, out, "--kernels", "numpy", *extra, timeout=300)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """Four realisations sharing one coupling file: the first builds it, the others read it."""
    folder = tmp_path_factory.mktemp("bandpowers")
    spec = folder / "spec.toml"
    spec.write_text(SPEC)
    coupling = folder / "coupling.npz"
    runs = []
    for realization in range(REALIZATIONS):
        out = folder / f"r{realization:04d}"
        completed = run(spec, realization, out, "--coupling", str(coupling))
        assert completed.returncode == 0, completed.stderr[-3000:]
        stat = coupling.stat()
        runs.append({"out": out, "stderr": completed.stderr, "ino": stat.st_ino, "mtime_ns": stat.st_mtime_ns})
    return {"folder": folder, "spec": spec, "coupling": coupling, "runs": runs}


def load_bandpowers(out):
    with np.load(out / "spectra.npz") as stored:
        return {name: stored[name] for name in stored.files}


def test_bandpowers_agree_with_the_model_within_the_monte_carlo_error(campaign):
    """The mean of 4 realisations' decoupled TT EE BB TE EB TB against model_bandpowers of the input.

    Judged bins: from 2 bin widths (ell >= 34) to 2 nside (the reliable bins), 5 bins of 16.
    MC error of the mean: Knox's per-realisation sigma with the mask's effective fsky
    (w2^2 / w4), divided by sqrt(4): sigma^2 = 2 C_b^2 / nu for TT EE BB,
    (C_TT C_EE + C_TE^2) / nu for TE, C_EE C_BB / nu for EB and C_TT C_BB / nu for TB, with
    nu = (2 ell + 1) bin_width fsky_eff (4-7% of the model per bin here). Knox's formula
    underestimates a cut sky's variance (the pure estimator's more so), so the z scores spread
    a little wider than 1 (about 1.3 here). Every bin must lie within 4 sigma, and the mean
    over the 5 bins of (C_b - model) / sigma within 3 / sqrt(5) (3 sigma of that mean for
    independent bins). BB is the lensing BB through the pure-B estimator; at nside 64 with 10 deg
    apodisation the E -> B leakage left is below 0.5% of it (mapmaker.model.bandpowers), at
    nside 32 it was 10-20%, a bias of 1.5 sigma per bin that this test caught.
    """
    stored = [load_bandpowers(run["out"]) for run in campaign["runs"]]
    first = stored[0]
    assert first["bandpowers"].shape == (6, first["bandpower_ell"].size)
    n_bins = first["bandpower_ell"].size
    # The windows are the coupling's, the same for every realisation: kept in the coupling file and named by its
    # sha256 from each realisation's spectra, not copied into them.
    assert "bandpower_windows" not in first
    coupling_bytes = campaign["coupling"].read_bytes()
    assert all(str(one["bandpower_coupling_sha256"]) == hashlib.sha256(coupling_bytes).hexdigest() for one in stored)
    windows = bp.Coupling.read_npz(str(campaign["coupling"])).bandpower_windows
    assert windows.shape == (6, n_bins, 6, 3 * NSIDE + 1)
    assert bool(first["bandpower_purify_b"])
    cb = np.array([one["bandpowers"] for one in stored])  # [n_sims, 6, n_bins]
    assert not np.allclose(cb[0], cb[1], rtol=1e-3, atol=0), "each realisation draws its own sky"
    model = first["model_bandpowers"]
    np.testing.assert_array_equal(model, stored[-1]["model_bandpowers"])

    mask = hp.read_map(campaign["runs"][0]["out"] / "mask.fits")
    fsky_eff = bp.effective_fsky(mask)
    assert 0.2 < np.mean(mask > 0) < 0.8
    ell_lo, ell_hi = first["bandpower_ell_lo"], first["bandpower_ell_hi"]
    judged = first["bandpower_reliable"] & (ell_lo >= 2 + 2 * BIN_WIDTH)
    assert judged.sum() == 5
    modes = (2 * first["bandpower_ell"] + 1) * (ell_hi - ell_lo + 1) * fsky_eff
    tt, ee, bb, te = (model[bp.SPECTRA.index(name)] for name in ("TT", "EE", "BB", "TE"))
    variance = np.array([2 * tt**2, 2 * ee**2, 2 * bb**2, tt * ee + te**2, ee * bb, tt * bb]) / modes  # rows SPECTRA
    sigma_of_mean = np.sqrt(np.abs(variance)) / math.sqrt(REALIZATIONS)
    z = (cb.mean(axis=0) - model) / sigma_of_mean
    print("\n(mean C_b - model) / MC error, judged bins", ell_lo[judged].tolist())
    for row, name in enumerate(bp.SPECTRA):
        print(f"  {name}: {np.round(z[row, judged], 2).tolist()}")
    for row, name in enumerate(bp.SPECTRA):
        assert np.all(np.abs(z[row, judged]) < 4), f"{name}: z = {z[row, judged]}"
        assert abs(z[row, judged].mean()) < 3 / math.sqrt(judged.sum()), f"{name}: mean z = {z[row, judged].mean()}"


def test_result_records_the_bandpowers_the_offset_and_the_coupling_source(campaign):
    results = [RealizationResult.model_validate_json((run["out"] / "result.json").read_text()) for run in campaign["runs"]]
    sources = [result.spectra.bandpowers.coupling_source for result in results]
    assert sources == ["built"] + ["file"] * (REALIZATIONS - 1)
    assert results[0].spectra.bandpowers.coupling_build_s > 0
    assert all(result.spectra.bandpowers.coupling_build_s is None for result in results[1:])
    stored = load_bandpowers(campaign["runs"][0]["out"])
    first = results[0].spectra
    np.testing.assert_allclose(first.bandpowers.cb["BB"], stored["bandpowers"][2], rtol=1e-15)
    assert first.bandpowers.purify_b and first.monopole_k == pytest.approx(float(stored["monopole"]), rel=1e-15)
    # a noiseless CMB patch: the fitted offset is the sky's own projection, tens of uK at most
    assert abs(first.monopole_k) < 1e-4 and len(first.dipole_k) == 3
    mask_sha256 = {result.spectra.bandpowers.mask_sha256 for result in results}
    with np.load(campaign["coupling"]) as coupling:
        assert mask_sha256 == {str(coupling["mask_sha256"])}
    # the file's identity the service records: every run, builder and readers, reports the same bytes
    file_sha256 = hashlib.sha256(campaign["coupling"].read_bytes()).hexdigest()
    assert {result.spectra.bandpowers.coupling_sha256 for result in results} == {file_sha256}
    assert {result.spectra.bandpowers.coupling_bytes for result in results} == {campaign["coupling"].stat().st_size}


def test_the_coupling_file_is_written_once_and_reused(campaign):
    runs = campaign["runs"]
    assert {(run["ino"], run["mtime_ns"]) for run in runs} == {(runs[0]["ino"], runs[0]["mtime_ns"])}
    assert "coupling: built in" in runs[0]["stderr"] and f"written to {campaign['coupling']}" in runs[0]["stderr"]
    for run in runs[1:]:
        assert f"coupling: read from {campaign['coupling']}" in run["stderr"] and "built in" not in run["stderr"]
    assert not list(campaign["folder"].glob(".*partial*")), "no temporary file left beside the coupling"


def test_a_coupling_for_another_mask_is_refused_after_the_solve(campaign, tmp_path):
    """Same binning and purification, another mask: the mask is known only once the map is, so the solve runs."""
    other_mask = bp.analysis_mask(hp.read_map(campaign["runs"][0]["out"] / "hits.fits") >= 20, apodisation_deg=10.0)
    other = bp.build_coupling(other_mask, bp.Binning.for_nside(NSIDE, BIN_WIDTH), purify_b=True)
    path = tmp_path / "other.npz"
    with open(path, "wb") as handle:
        other.write_npz(handle)
    before = path.stat().st_mtime_ns
    out = tmp_path / "refused"
    completed = run(campaign["spec"], 1, out, "--coupling", str(path))
    assert completed.returncode == MapmakerExit.COUPLING_REFUSED, completed.stderr[-3000:]
    assert "coupling refused" in completed.stderr and f"built for the mask with sha256 {other.mask_sha256}" in completed.stderr
    assert "iteration" in completed.stderr  # refused after the solve, not before
    assert not out.exists() and path.stat().st_mtime_ns == before  # no products, and the file is not rebuilt


@pytest.mark.parametrize("problem", ["binning", "purification", "damaged"])
def test_a_coupling_for_other_settings_is_refused_before_the_solve(campaign, tmp_path, problem):
    path = tmp_path / "coupling.npz"
    if problem == "damaged":
        path.write_bytes(b"not a coupling")
        expected = "is not a readable coupling file"
    else:
        with np.load(campaign["coupling"]) as stored:
            arrays = {name: stored[name] for name in stored.files}
        if problem == "binning":
            arrays["bin_width"] = np.int64(BIN_WIDTH // 2)
            expected = f"bin_width={BIN_WIDTH // 2}"
        else:
            arrays["purify_b"] = np.bool_(False)
            expected = "built with purify_b=False, not purify_b=True"
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)
    out = tmp_path / "refused"
    completed = run(campaign["spec"], 1, out, "--coupling", str(path))
    assert completed.returncode == MapmakerExit.COUPLING_REFUSED, completed.stderr[-3000:]
    assert expected in completed.stderr and "iteration" not in completed.stderr
    assert not out.exists()


def test_without_a_coupling_file_every_run_builds_its_own(campaign, tmp_path):
    """--coupling is optional: the run builds the coupling in memory and gets the same bandpowers."""
    out = tmp_path / "alone"
    completed = run(campaign["spec"], 2, out, "--quiet")
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["spectra"]["bandpowers"]["coupling_source"] == "built"
    assert result["spectra"]["bandpowers"]["coupling_sha256"] is None
    assert result["spectra"]["bandpowers"]["coupling_bytes"] is None
    np.testing.assert_allclose(
        load_bandpowers(out)["bandpowers"], load_bandpowers(campaign["runs"][2]["out"])["bandpowers"], rtol=1e-10
    )


def test_a_coupling_file_that_cannot_be_written_is_refused_before_the_solve(campaign, tmp_path):
    not_a_folder = tmp_path / "plain-file"
    not_a_folder.write_text("")
    out = tmp_path / "refused"
    completed = run(campaign["spec"], 1, out, "--coupling", str(not_a_folder / "coupling.npz"))
    assert completed.returncode == MapmakerExit.BAD_INPUT, completed.stderr[-3000:]
    assert "--coupling" in completed.stderr and "is not a folder" in completed.stderr
    assert "iteration" not in completed.stderr and not out.exists()


def test_the_bandpowers_of_a_map_refuse_a_mask_that_is_not_the_named_one(campaign, tmp_path):
    """``mapmaker bandpowers`` (the service's spectrum of a data map) exits COUPLING_REFUSED, not PLAN_REFUSED."""
    realisation = campaign["runs"][0]["out"]
    command = mapmaker_bandpowers_args(
        sys.executable,
        map_file=realisation / "map_iqu.fits",
        mask_file=realisation / "mask.fits",
        mask_sha256="0" * 64,
        bin_width=BIN_WIDTH,
        lmax=3 * NSIDE - 1,
        purify_b=True,
        out=tmp_path / "bandpowers.json",
    )
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == MapmakerExit.COUPLING_REFUSED, completed.stderr[-3000:]
    assert "0" * 64 in completed.stderr and not (tmp_path / "bandpowers.json").exists()
