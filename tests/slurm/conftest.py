"""Session fixture ``local_slurm``: the single-node Slurm these tests submit to (tests/support/local_slurm.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.local_slurm import LocalSlurm, SlurmUnavailable, start_local_slurm, stop_local_slurm


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[LocalSlurm]:
    try:
        slurm = start_local_slurm()
    except SlurmUnavailable as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and no local Slurm: {error}", pytrace=False)
        pytest.skip(f"no local Slurm: {error}")
    try:
        yield slurm
    finally:
        if slurm.started_here:  # leave a Slurm someone else started running
            stop_local_slurm()
