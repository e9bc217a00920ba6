"""Static checks run with the tests: ruff over the whole tree, mypy over the contracts, deployables and map-maker.

Both tools are pinned in the test extras (pyproject.toml), so a new release's new rules cannot fail a clean
checkout; their settings are in pyproject.toml.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, check=False, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing_anywhere():
    done = run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr


def test_mypy_is_clean_on_the_configured_packages():
    done = run("mypy", "--no-incremental", "--cache-dir", "/dev/null")  # files and plugins from [tool.mypy]
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr
    assert "no issues found" in done.stdout
