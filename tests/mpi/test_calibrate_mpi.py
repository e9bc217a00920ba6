"""``calibrate`` under mpiexec, and its file used by ``realize --calibration`` and ``model --calibration``."""
import json
import subprocess
import sys

import pytest
from mpi_support import REPO, realize, run_ranks
from overlap_support import write_spec

from schemas.calibration import SiteCalibration
from schemas.result import RealizationResult

pytestmark = pytest.mark.mpi


def model(*args):
    return subprocess.run(
        [sys.executable, "-m", "mapmaker", "model", *args], check=False, capture_output=True, text=True, cwd=REPO,
        timeout=300,
    )


def test_calibration_file_drives_auto_and_the_model(tmp_path):
    out = tmp_path / "site.json"
    completed = run_ranks(2, "-m", "mapmaker", "calibrate", "--out", str(out), "--repeat", "1", timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "p2p" in completed.stdout and "sift" in completed.stdout
    calibration = SiteCalibration.model_validate_json(out.read_text())
    assert calibration.ranks == 2 and calibration.sift_s_per_id > 0
    assert "neighbor" in completed.stdout and "pairwise" in completed.stdout
    fits = (calibration.p2p, calibration.allreduce, calibration.alltoallv, calibration.allgather, calibration.neighbor,
            calibration.pairwise)
    for fit in fits:
        assert fit is not None
        assert fit.alpha_s >= 0 and fit.beta_s_per_byte > 0 and len(fit.points) >= 5

    spec = write_spec(tmp_path, **{'reduction = "allreduce"': 'reduction = "auto"'})
    run = tmp_path / "run"
    completed = realize(2, spec, 0, run, "--calibration", str(out), "--quiet")
    assert completed.returncode == 0, completed.stderr[-3000:]
    selection = RealizationResult.model_validate_json((run / "result.json").read_text()).communication.selection
    assert selection.machine.startswith("calibration of local")
    assert {"neighbor", "pairwise", "alltoallv-overlap", "neighbor-overlap"} <= set(selection.modeled)

    completed = model("--spec", str(spec), "--ranks", "2,3", "--calibration", str(out), "--json")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(completed.stdout)["machine"].startswith("calibration of local")


def test_calibrate_needs_two_ranks_and_model_checks_its_options(tmp_path):
    completed = run_ranks(1, "-m", "mapmaker", "calibrate", timeout=60)
    assert completed.returncode == 2 and "at least 2 ranks" in completed.stderr
    spec = write_spec(tmp_path)
    assert model("--spec", str(spec), "--ranks", "4", "--alpha", "1e-6").returncode == 2
    assert model("--spec", str(spec), "--ranks", "4,x").returncode == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    completed = model("--spec", str(spec), "--ranks", "4", "--calibration", str(bad))
    assert completed.returncode == 2 and "not a calibration file" in completed.stderr
    completed = model("--spec", str(spec), "--ranks", "4", "--alpha", "8.15e-6", "--beta", "6.06e-10")
    assert completed.returncode == 0 and "4 ranks" in completed.stdout and "<- auto" in completed.stdout


def test_model_runs_ranks_x_threads(tmp_path):
    """--threads-per-rank T: the cores of --ranks on cores / T ranks; --cores-per-node: they share the interface."""
    spec = write_spec(tmp_path)
    plain = model("--spec", str(spec), "--ranks", "4", "--json")
    threaded = model("--spec", str(spec), "--ranks", "4", "--threads-per-rank", "2", "--cores-per-node", "4", "--json")
    assert plain.returncode == 0 and threaded.returncode == 0, threaded.stderr[-3000:]
    one, two = json.loads(plain.stdout), json.loads(threaded.stdout)
    assert two["threads_per_rank"] == 2 and "2 rank(s) per node" in two["machine"]
    assert two["projections"][0]["ranks"] == 2 and two["projections"][0]["cores"] == 4
    assert one["projections"][0]["ranks"] == 4
    # The same samples on fewer ranks: fewer pixels observed twice or more in all.
    assert two["projections"][0]["overlap"]["total_local_pixels"] <= one["projections"][0]["overlap"]["total_local_pixels"]
