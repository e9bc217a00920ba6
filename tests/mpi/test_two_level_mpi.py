"""The two-level preconditioner on real ranks: the block-diagonal map, fewer iterations (counts, never times);
every preconditioner, and each choice of the default ``auto``, solving to the default's map."""
import re

import pytest
from mpi_support import DRIVERS, run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(("ranks", "reduction"), [(1, "allreduce"), (2, "allreduce"), (4, "alltoallv")])
def test_two_level_solves_to_the_block_diagonal_map_in_fewer_iterations(ranks, reduction):
    completed = run_ranks(ranks, str(DRIVERS / "check_two_level.py"), reduction, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"two-level checks passed on {ranks} ranks" in completed.stdout
    found = re.search(r"iterations block-diagonal (\d+) two-level (\d+) columns 36", completed.stdout)
    assert found, completed.stdout
    block, two_level = int(found.group(1)), int(found.group(2))
    assert two_level < 0.75 * block, (block, two_level)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_preconditioner_and_each_auto_choice_give_the_default_map_on_a_masked_sky(ranks, tmp_path):
    completed = run_ranks(ranks, str(DRIVERS / "check_preconditioner_modes.py"), str(tmp_path), timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"preconditioner modes checks passed on {ranks} ranks" in completed.stdout
    found = re.search(r"default=block-diagonal:(\d+) .* auto-reads=two-level:(\d+)", completed.stdout)
    assert found, completed.stdout
    assert int(found.group(2)) < int(found.group(1))
