"""``python -m mapmaker realize`` under mpiexec: decomposition independence, products, bad input."""
import hashlib
import os
import signal
import subprocess
import sys

import healpy as hp
import numpy as np
import pytest
from mpi_support import DRIVERS, REPO, SMALL_SATELLITE_SPEC, mpiexec, realize, run_ranks

from schemas.result import RealizationResult

pytestmark = pytest.mark.mpi

SPEC = SMALL_SATELLITE_SPEC

RANK_COUNTS = (1, 2, 4)


def write_spec(folder, text=SPEC, name="spec.toml", **replace):
    for old, new in replace.items():
        text = text.replace(old, new)
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same realisation on 1, 2 and 4 ranks."""
    folder = tmp_path_factory.mktemp("realize")
    spec = write_spec(folder)
    outputs = {}
    for ranks in RANK_COUNTS:
        out = folder / f"n{ranks}"
        completed = realize(ranks, spec, 1, out)
        assert completed.returncode == 0, completed.stderr[-3000:]
        outputs[ranks] = (out, completed)
    return outputs


def read_iqu(out):
    return hp.read_map(out / "map_iqu.fits", field=(0, 1, 2))


def read_result(out) -> RealizationResult:
    return RealizationResult.model_validate_json((out / "result.json").read_text())


def test_maps_do_not_depend_on_the_rank_count(runs):
    """|m_p - m_1| <= 1e-8 max|m_1| for each of I, Q, U; hits and the cut are identical."""
    reference = read_iqu(runs[1][0])
    solved = reference[0] != hp.UNSEEN
    reference_hits = read_hits(runs[1][0])
    for ranks in RANK_COUNTS[1:]:
        maps = read_iqu(runs[ranks][0])
        np.testing.assert_array_equal(maps[0] != hp.UNSEEN, solved)
        for stokes in range(3):
            scale = np.abs(reference[stokes, solved]).max()
            np.testing.assert_allclose(maps[stokes, solved], reference[stokes, solved], rtol=0, atol=1e-8 * scale)
        np.testing.assert_array_equal(read_hits(runs[ranks][0]), reference_hits)
    iterations = {read_result(runs[r][0]).iterations for r in RANK_COUNTS}
    assert len(iterations) == 1


def test_recomputed_pointing_maps_equal_the_cached_pointing_maps_on_every_rank_count(runs, tmp_path):
    """solver.pointing = "recomputed" (weights recomputed each iteration, float64) against the default cached
    float32 weights, on 1, 2 and 4 ranks: hits and cut identical, maps within the solve's tolerance."""
    spec = tmp_path / "recomputed.toml"
    # The default preconditioner (auto, no coarse cache): block-diagonal, as the cached-pointing runs
    spec.write_text(SPEC.replace("[solver]\n", '[solver]\npointing = "recomputed"\n', 1))
    assert 'pointing = "recomputed"' in spec.read_text()
    for ranks in RANK_COUNTS:
        out = tmp_path / f"n{ranks}"
        completed = realize(ranks, spec, 1, out, "--quiet")
        assert completed.returncode == 0, completed.stderr[-3000:]
        cached, recomputed = read_iqu(runs[ranks][0]), read_iqu(out)
        solved = cached[0] != hp.UNSEEN
        np.testing.assert_array_equal(recomputed[0] != hp.UNSEEN, solved)
        np.testing.assert_array_equal(hp.read_map(out / "hits.fits"), hp.read_map(runs[ranks][0] / "hits.fits"))
        for stokes in range(3):
            scale = np.abs(cached[stokes, solved]).max()
            # tol 1e-10 (SMALL_SATELLITE_SPEC): the float32 rounding of the cached weights (6e-8) is the difference
            np.testing.assert_allclose(recomputed[stokes, solved], cached[stokes, solved], rtol=0, atol=1e-6 * scale)
        assert read_result(out).converged


def test_result_json_describes_the_run(runs):
    npix = 12 * 16**2
    fingerprints = set()
    for ranks in RANK_COUNTS:
        out, _ = runs[ranks]
        result = read_result(out)
        assert result.ranks == ranks and result.realization == 1 and result.threads_per_rank == 1
        assert result.samples == 4 * 7200 * 5
        assert result.converged and result.residual_history[-1] < 1e-10
        assert len(result.residual_history) == result.iterations + 1
        assert result.observed_pixels > 0 and 0 <= result.cut_pixels < result.observed_pixels
        assert result.communication.strategy == "allreduce" and result.communication.requested == "allreduce"
        # The blocks, b, one per iteration: the default preconditioner (auto) with no coarse cache to share is
        # the block-diagonal one, with no set-up.
        assert result.coarse is None
        assert result.communication.reductions == result.iterations + 2
        # Rabenseifner volume per iteration: whole map x 3 values, buffers of 1000 pixels.
        expected_bytes = 2 * npix * 3 * (ranks - 1) / ranks * 8
        assert result.communication.bytes_per_iteration.max == pytest.approx(expected_bytes, abs=20)
        pieces = -(-npix // 1000)
        expected_messages = pieces * 2 * int(np.ceil(np.log2(ranks))) if ranks > 1 else 0
        assert result.communication.messages_per_iteration.max == expected_messages
        assert result.timing.calc.max >= result.timing.calc.mean > 0
        assert result.peak_memory_mb.max > 0
        # Every stage of this run timed; the products and their files are rank 0's alone
        assert set(result.stages) == {"sky", "pointing", "distribution", "simulate", "solve", "gather", "products",
                                      "write"}
        for stage in ("pointing", "simulate", "solve", "products", "write"):
            assert result.stages[stage].max >= result.stages[stage].mean > 0
        assert result.stages["products"].mean == pytest.approx(result.stages["products"].max / ranks)
        assert sum(s.max for s in result.stages.values()) <= ranks * result.timing.total
        assert result.rng_streams[0].stream == "sky"
        noise_streams = [s for s in result.rng_streams if s.stream == "noise"]
        assert noise_streams[0].detector == "A0" and noise_streams[0].interval == 0
        assert result.rng_streams_total == 1 + 4 * 24  # sky + 4 detectors x (8 chunks x 3 intervals)
        assert "Philox" in result.rng_scheme
        assert set(result.versions) >= {"numpy", "healpy", "mpi4py", "mpi", "python"}
        # Realisation 1 without --coupling: the mask comes with realisation 0 (or a built coupling file) only.
        assert {p.name for p in result.products} == {"iqu", "hits", "rcond", "spectra"}
        for product in result.products:
            data = (out / product.path).read_bytes()
            assert hashlib.sha256(data).hexdigest() == product.sha256 and len(data) == product.size_bytes
        fingerprints.add(result.decomposition)
    assert len(fingerprints) == len(RANK_COUNTS)
    assert len({read_result(runs[r][0]).spec_hash for r in RANK_COUNTS}) == 1


def read_hits(out):
    """Samples per pixel: the cut-sky file reads back with UNSEEN where unobserved, 0 here."""
    hits = hp.read_map(out / "hits.fits", dtype=np.float64)
    return np.where(hits == hp.UNSEEN, 0, hits)


def test_products_are_healpix_ring_maps(runs):
    out, _ = runs[2]
    hits = read_hits(out)
    rcond = hp.read_map(out / "rcond.fits")
    iqu = read_iqu(out)
    assert hits.sum() == 4 * 7200 * 5
    assert np.all((rcond == hp.UNSEEN) == (hits == 0))
    assert np.all(iqu[0][hits == 0] == hp.UNSEEN)
    header = dict(hp.read_map(out / "map_iqu.fits", h=True)[1])
    assert header["ORDERING"] == "RING" and header["NSIDE"] == 16 and header["COORDSYS"] == "E"
    assert header["INDXSCHM"] == "EXPLICIT" and header["OBJECT"] == "PARTIAL"


def test_files_take_at_most_48_bytes_per_observed_pixel_plus_1_mb(runs):
    """maps, hits, rcond and spectra of a satellite realisation; the windows are not in the spectra."""
    out, _ = runs[2]
    result = read_result(out)
    sizes = {p.name: p.size_bytes for p in result.products}
    observed = int(np.count_nonzero(read_hits(out)))
    assert observed == result.observed_pixels
    assert sum(sizes[name] for name in ("iqu", "hits", "rcond", "spectra")) <= 48 * observed + 2**20
    assert sum(sizes[name] for name in ("iqu", "hits", "rcond")) <= 44 * observed + 3 * 3 * 2880
    with np.load(out / "spectra.npz") as spectra:
        assert "bandpower_windows" in spectra.files  # no --coupling here: nothing else keeps them
        assert str(spectra["bandpower_mask_sha256"]) == result.spectra.bandpowers.mask_sha256


def test_progress_goes_to_stderr_from_rank_zero(runs):
    _, completed = runs[4]
    lines = completed.stderr.splitlines()
    iteration_lines = [line for line in lines if line.startswith("iteration")]
    assert len(iteration_lines) == read_result(runs[4][0]).iterations  # once, from rank 0 only
    assert "maps in" in lines[-1]
    assert completed.stdout == ""


def test_other_realisations_differ_and_reruns_are_identical(tmp_path, runs):
    spec = write_spec(tmp_path)
    again, other = tmp_path / "again", tmp_path / "other"
    assert realize(2, spec, 1, again, "--quiet").returncode == 0
    assert realize(2, spec, 2, other, "--quiet").returncode == 0
    assert (again / "map_iqu.fits").read_bytes() == (runs[2][0] / "map_iqu.fits").read_bytes()
    assert not np.allclose(read_iqu(other), read_iqu(again))


def test_user_map_noiseless_round_trip(tmp_path):
    """A user IQU map, no noise, 2 ranks: the map comes back in every solved pixel (rtol 1e-6)."""
    (tmp_path / "skies").mkdir()
    sky = np.random.default_rng(3).standard_normal((3, 12 * 16**2)) * 1e-4
    hp.write_map(tmp_path / "skies" / "input.fits", sky, dtype=np.float64)
    text = SPEC.replace('kind = "cmb"\nseed = 4\nfwhm_arcmin = 300.0', 'kind = "map"\npath = "skies/input.fits"')
    text = text.replace('kind = "signal+noise"', 'kind = "signal-only"')
    spec = write_spec(tmp_path, text)
    out = tmp_path / "out"
    completed = realize(2, spec, 0, out, "--sky-root", str(tmp_path))
    assert completed.returncode == 0, completed.stderr[-3000:]
    maps = read_iqu(out)
    solved = maps[0] != hp.UNSEEN
    assert solved.sum() > 2000
    np.testing.assert_allclose(maps[:, solved], sky[:, solved], rtol=1e-6)


# ----------------------------------------------------------------------------- bad input: exit 2, clear message


def test_invalid_spec_names_the_field(tmp_path):
    spec = write_spec(tmp_path, **{"sample_rate_hz = 5.0": "sample_rate_hz = -5.0"})
    completed = realize(2, spec, 0, tmp_path / "out")
    assert completed.returncode == 2
    assert "focal_plane.sample_rate_hz" in completed.stderr and "greater than 0" in completed.stderr
    assert completed.stderr.count("invalid spec") == 1  # said once, by rank 0
    assert not (tmp_path / "out").exists()


def test_existing_out_is_refused_and_left_alone(tmp_path):
    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    completed = realize(2, spec, 0, out)
    assert completed.returncode == 2 and "already exists" in completed.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_an_out_folder_that_cannot_be_made_is_refused_before_the_solve(tmp_path):
    """Found by review: --out under a file was found only when the products were written, after the
    whole solve (a traceback, MPI_Abort, exit 1: the worker retried it at full cost)."""
    spec = write_spec(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    completed = realize(2, spec, 0, tmp_path / "a-file" / "out")
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "--out" in completed.stderr and "is not a folder" in completed.stderr
    assert "solve:" not in completed.stderr and "Traceback" not in completed.stderr


def test_preprocess_report_that_cannot_be_written_ends_every_rank(tmp_path):
    """Found by review: preprocess hung for ever when rank 0 alone failed to write --report (the other
    ranks had returned; rank 0 waited in a barrier). Refused up front now, naming the option."""
    spec = write_spec(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    completed = run_ranks(
        2, "-m", "mapmaker", "preprocess", "--spec", str(spec), "--out", str(tmp_path / "plan.bin"),
        "--report", str(tmp_path / "a-file" / "report.json"), timeout=120,
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "--report" in completed.stderr and "is not a folder" in completed.stderr
    assert not (tmp_path / "plan.bin").exists()


def test_a_preprocess_failure_on_rank_0_alone_ends_every_rank(tmp_path):
    spec = write_spec(tmp_path)
    completed = run_ranks(2, str(DRIVERS / "check_preprocess_report_failure.py"), str(spec), str(tmp_path), timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "report failure reached 2 ranks" in completed.stdout


ALL_CUT_SPEC = """
name = "all-cut"
seed = 3
[scan]
kind = "satellite"
duration_s = 2.0
chunk_s = 1.0
drift_deg_per_day = 2880.0
precession_period_s = 600.0
[focal_plane]
sample_rate_hz = 2.0
detectors = [ { name = "A", pol_angle_deg = 0.0 }, { name = "B", pol_angle_deg = 90.0 } ]
[pixelization]
nside = 32
[noise]
f_knee_hz = 0.1
[resources]
ranks = 2
"""


def test_a_run_whose_every_pixel_is_cut_fails_with_the_reason(tmp_path):
    """Found by review: 4 seconds of 2 detectors at 0 and 90 degrees (Q only, no U anywhere) gave an
    all-UNSEEN map reported as converged, with w2 = 0 spectra that later divide 0 by 0."""
    spec = tmp_path / "spec.toml"
    spec.write_text(ALL_CUT_SPEC)
    completed = realize(2, spec, 0, tmp_path / "out")
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "nothing to solve" in completed.stderr and "are cut by rcond" in completed.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "change, realization, words",
    [
        ({}, 3, "out of range"),
        ({'kind = "cmb"\nseed = 4\nfwhm_arcmin = 300.0': 'kind = "map"\npath = "sky.fits"'}, 0, "--sky-root"),
    ],
)
def test_other_bad_input_exits_2(tmp_path, change, realization, words):
    spec = write_spec(tmp_path, **change)
    completed = realize(2, spec, realization, tmp_path / "out")
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert words in completed.stderr
    assert not (tmp_path / "out").exists()


def test_sky_map_escaping_the_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    hp.write_map(tmp_path / "secret.fits", np.zeros((3, 12 * 16**2)), dtype=np.float64)
    os.symlink(tmp_path / "secret.fits", root / "sky.fits")
    spec = write_spec(tmp_path, **{'kind = "cmb"\nseed = 4\nfwhm_arcmin = 300.0': 'kind = "map"\npath = "sky.fits"'})
    completed = realize(2, spec, 0, tmp_path / "out", "--sky-root", str(root))
    assert completed.returncode == 2 and "outside the sky root" in completed.stderr


def test_usage_errors_exit_2():
    completed = subprocess.run(
        [sys.executable, "-m", "mapmaker", "realize", "--spec", "x.toml"], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert completed.returncode == 2 and "--realization" in completed.stderr


def test_killed_run_leaves_no_complete_looking_folder(tmp_path):
    # A solve that cannot converge (tol far below round-off) runs until it is killed.
    spec = write_spec(tmp_path, **{"tol = 1e-10": "tol = 1e-300", "max_iter = 500": "max_iter = 10000"})
    out = tmp_path / "out"
    command = [str(mpiexec()), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "mapmaker", "realize",
               "--spec", str(spec), "--realization", "0", "--out", str(out)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
    seen = []
    try:
        for line in process.stderr:
            seen.append(line)
            if line.startswith("iteration"):
                break
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=60)
        process.stderr.close()
    assert seen and seen[-1].startswith("iteration"), "".join(seen)[-2000:]  # killed mid-solve
    assert not out.exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]
    assert all(not (tmp_path / name / "result.json").exists() for name in leftovers)
