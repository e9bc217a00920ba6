"""The pixel reduction and the distributed pixel vectors on real ranks."""
import pytest
from mpi_support import DRIVERS, run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_reduction_and_distributed_pixels(ranks):
    completed = run_ranks(ranks, str(DRIVERS / "check_distributed.py"), timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"distributed checks passed on {ranks} ranks" in completed.stdout
