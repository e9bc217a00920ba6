"""The command line: help, usage errors, and a tiny bench run (a smoke test, no timing asserted)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mapmaker.solve.local_data import VISIT_ORDER_MIN_LOCAL_PIXELS

REPO = Path(__file__).resolve().parents[2]


def run(*args):
    return subprocess.run([sys.executable, "-m", "mapmaker", *args], capture_output=True, text=True, cwd=REPO, timeout=300, check=False)


def test_help_lists_the_commands():
    completed = run("--help")
    assert completed.returncode == 0
    for command in ("realize", "preprocess", "calibrate", "model", "bench"):
        assert command in completed.stdout
    realize_help = run("realize", "--help").stdout
    for option in ("--spec", "--realization", "--out", "--threads", "--kernels", "--sky-root", "--plan"):
        assert option in realize_help
    preprocess_help = run("preprocess", "--help").stdout
    for option in ("--spec", "--out", "--report", "--quiet"):
        assert option in preprocess_help


def test_usage_errors_exit_2():
    assert run().returncode == 2
    assert run("realize", "--spec", "x.toml", "--realization", "-1", "--out", "o").returncode == 2
    assert run("realize", "--spec", "x.toml", "--realization", "0", "--out", "o", "--threads", "0").returncode == 2


def test_missing_spec_file_exits_2(tmp_path):
    completed = run("realize", "--spec", str(tmp_path / "none.toml"), "--realization", "0", "--out", str(tmp_path / "o"))
    assert completed.returncode == 2 and "cannot read the file" in completed.stderr


def test_bench_runs_and_prints_json():
    completed = run("bench", "--samples", "20000", "--nside", "16", "--repeat", "1", "--rounds", "3", "--json")
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(completed.stdout)
    assert set(report["operations"]) == {"pointing", "P", "P^T", "N^-1", "PCG iteration"}
    for row in report["operations"].values():
        assert set(row) == {"numpy", "fast"}
        for figures in row.values():
            assert figures["samples_per_second_per_core"] > 0 and figures["times_floor"] > 0
            assert figures["bytes_per_sample"] in (16, 24)  # the float32 cache: 16; P and P^T 24; N^-1 16
            # both floors: the same bytes over the triad's and over the copy's bandwidth
            assert figures["times_copy_floor"] / figures["times_floor"] == pytest.approx(
                report["copy_bytes_per_second_per_rank"] / report["stream_triad_bytes_per_second_per_rank"]
            )
            assert figures["bytes_per_second"] == pytest.approx(
                figures["bytes_per_sample"] * report["samples_per_rank"] / figures["seconds"]
            )
    assert report["stream_triad_bytes_per_second_per_rank"] > 0 and report["copy_bytes_per_second_per_rank"] > 0
    assert set(report["pcg_split_seconds_per_iteration"]["fast"]) == {"calc", "comm"}
    assert report["ranks"] == 1 and report["samples_per_rank"] > 0
    # P and P^T on the rows a solve would use: visit order with compiled kernels and a map beyond the caches
    large = report["local_pixels_rank0"] > VISIT_ORDER_MIN_LOCAL_PIXELS
    assert report["pixel_rows"] == {"numpy": "sorted", "fast": "visit" if large else "sorted"}
    rounds = report["pcg_rounds"]
    for name in ("numpy", "fast"):  # the table's PCG row is the best of the interleaved rounds
        assert len(rounds["seconds_per_iteration"][name]) == 3
        assert report["operations"]["PCG iteration"][name]["seconds"] == min(rounds["seconds_per_iteration"][name])
    speedup = rounds["speedup"]
    assert speedup["per_round"] == pytest.approx(
        [n / f for n, f in zip(rounds["seconds_per_iteration"]["numpy"], rounds["seconds_per_iteration"]["fast"])]
    )
    assert speedup["min"] <= speedup["median"] <= speedup["max"]


def test_bench_rejects_unknown_kernels():
    assert run("bench", "--kernels", "cuda").returncode == 2


def test_bench_refuses_bad_input_with_exit_2(tmp_path):
    """Found by review: a bad --spec or --nside ended in a traceback and exit 1."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[x]\n")
    completed = run("bench", "--spec", str(bad))
    assert completed.returncode == 2 and "--spec: invalid spec" in completed.stderr and "Traceback" not in completed.stderr
    for nside in ("3", "16384"):
        completed = run("bench", "--nside", nside)
        assert completed.returncode == 2 and "--nside: must be a power of two" in completed.stderr


def test_a_bad_calibration_file_is_named_with_its_field(tmp_path):
    missing = tmp_path / "empty.json"
    missing.write_text("{}")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    spec = str(REPO / "schemas" / "examples" / "demo.toml")
    completed = run("model", "--spec", spec, "--ranks", "2", "--calibration", str(missing))
    assert completed.returncode == 2 and "not a calibration file: created: Field required" in completed.stderr
    completed = run("model", "--spec", spec, "--ranks", "2", "--calibration", str(binary))
    assert completed.returncode == 2 and "--calibration" in completed.stderr and "not UTF-8" in completed.stderr


def test_bench_rounds_take_turns_and_reverse_the_order_each_round():
    from mapmaker.programs.bench import interleaved_rounds

    order = []

    class Block:
        def __init__(self, name):
            self.name = name

        def run(self):
            order.append(self.name)
            return float(len(order)), {"calc": 0.0, "comm": 0.0}

    timings = interleaved_rounds({"numpy": Block("numpy"), "fast": Block("fast")}, 3)
    assert order == ["numpy", "fast", "fast", "numpy", "numpy", "fast"]
    assert [seconds for seconds, _ in timings["numpy"]] == [1.0, 4.0, 5.0]
    assert [seconds for seconds, _ in timings["fast"]] == [2.0, 3.0, 6.0]


def test_bench_hybrid_runs_every_split_under_mpiexec():
    completed = run("bench", "--hybrid", "2", "--samples", "20000", "--nside", "16", "--repeat", "1", "--rounds", "3",
                    "--json")
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = json.loads(completed.stdout)
    assert sorted((row["kernels"], row["ranks"], row["threads_per_rank"]) for row in rows) == [
        ("fast", 1, 2), ("fast", 2, 1), ("numpy", 1, 2), ("numpy", 2, 1)
    ]
    for row in rows:  # the best round can be no slower than the median one
        assert 0 < row["seconds_per_iteration"] <= row["median_seconds_per_iteration"]
        assert row["calc_core_seconds"] > 0


def test_bench_takes_a_spec_with_toast_files(tmp_path):
    """A spec whose focal plane and schedule are TOAST files: found under --instrument-root and benchmarked;
    without the root, refused with exit 2 naming the file."""
    from datetime import UTC, datetime, timedelta

    from tests.support.toast_files import hexagon_focal_plane, write_satellite_schedule

    start = datetime(2027, 3, 1, tzinfo=UTC)
    schedule = [{"name": "day1", "start": start, "stop": start + timedelta(minutes=30), "prec_period": 10.0, "spin_period": 2.0}]
    schedule_sha = write_satellite_schedule(tmp_path / "satellite.ecsv", schedule)
    focal_plane_sha = hexagon_focal_plane(tmp_path / "hex.h5", n_pix=7)
    spec = tmp_path / "files.json"
    spec.write_text(json.dumps({
        "name": "bench from files",
        "scan": {"kind": "satellite-schedule", "file": "satellite.ecsv", "sha256": schedule_sha, "chunk_s": 600.0},
        "focal_plane": {"sample_rate_hz": 5.0, "file": "hex.h5", "sha256": focal_plane_sha, "select": {"first": 4}},
        "pixelization": {"nside": 16},
    }))  # fmt: skip
    completed = run("bench", "--spec", str(spec), "--instrument-root", str(tmp_path), "--repeat", "1", "--rounds", "1",
                    "--kernels", "numpy", "--json")  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["nside"] == 16 and report["samples_per_rank"] == 4 * 3 * 600 * 5  # 4 detectors, 3 chunks of 600 s
    completed = run("bench", "--spec", str(spec))
    assert completed.returncode == 2 and "'hex.h5'" in completed.stderr and "Traceback" not in completed.stderr
