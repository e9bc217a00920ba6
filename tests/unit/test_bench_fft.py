"""benchmarks/bench_fft.py on tiny inputs: what it prints adds up, and bad lengths exit 2 (figures: README)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_fft

ROOT = Path(__file__).resolve().parents[2]


def test_both_paths_are_timed_per_length():
    result = bench_fft.time_length(1000, samples=5000, rounds=3)
    assert result["intervals"] == 5 and result["split"] == (25, 20)
    low, high = result["ratio_range"]
    assert low <= result["ratio_median"] <= high
    assert set(result["median_seconds"]) == {"one FFT", "four-step"}
    assert all(seconds > 0 for seconds in result["median_seconds"].values())
    with pytest.raises(ValueError, match="even length"):
        bench_fft.time_length(999, samples=5000, rounds=1)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/bench_fft.py", *args], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_json_names_every_length_and_the_threshold():
    completed = run("--lengths", "64,404", "--samples", "4000", "--rounds", "2", "--json")
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["four_step_min_samples"] == 1 << 18
    assert [entry["length"] for entry in report["lengths"]] == [64, 404]
    assert report["lengths"][0]["split"] == [8, 4]
    assert report["lengths"][1]["split"] is None  # 202 = 2 x 101: no balanced split, both paths one FFT


@pytest.mark.parametrize("lengths", ["63", "2", "x"])
def test_bad_lengths_exit_2_naming_the_option(lengths):
    completed = run("--lengths", lengths, "--samples", "1000", "--rounds", "1")
    assert completed.returncode == 2
    assert "--lengths" in completed.stderr
