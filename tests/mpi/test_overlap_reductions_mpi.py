"""The reduction strategies on real ranks: exact sums, counted bytes = modeled bytes, maps equal across strategies."""
import healpy as hp
import numpy as np
import pytest
from mpi_support import DRIVERS, realize, run_ranks
from overlap_support import preprocess, write_spec

from schemas.result import RealizationResult

pytestmark = pytest.mark.mpi

STRATEGIES = ("alltoallv", "butterfly", "hybrid")
# The strategies of issue 24, run on 2 and 4 ranks (3 ranks: the driver's exact sums); each overlap variant's twin.
NEW_STRATEGIES = ("neighbor", "pairwise", "alltoallv-overlap", "neighbor-overlap")
TWINS = {"alltoallv-overlap": "alltoallv", "neighbor-overlap": "neighbor"}


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_strategy_sums_exactly(ranks, tmp_path):
    completed = run_ranks(ranks, str(DRIVERS / "check_reductions.py"), str(tmp_path), timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"reduction checks passed on {ranks} ranks" in completed.stdout


def read_iqu(out):
    return hp.read_map(out / "map_iqu.fits", field=(0, 1, 2))


def read_result(out) -> RealizationResult:
    return RealizationResult.model_validate_json((out / "result.json").read_text())


@pytest.fixture(scope="module")
def maps(tmp_path_factory):
    """Realisation 0 with allreduce on 1 rank (the reference), every strategy on 2-4 ranks, auto on 4.

    The reference goes through ``mapmaker realize``; the strategies of one rank count run in one process
    start (the driver runs ``realize_to_folder`` once per strategy, as ``realize`` does). On 4 ranks the
    plan of STRATEGIES and auto comes from ``preprocess`` (``--plan``); on 2 and 3, and for the new
    strategies, it is built in memory.
    """
    folder = tmp_path_factory.mktemp("strategies")
    plan4 = folder / "plan4.bin"
    spec = write_spec(folder)
    assert preprocess(4, spec, plan4, "--quiet").returncode == 0
    reference = folder / "allreduce-1"
    completed = realize(1, write_spec(folder, "allreduce.toml"), 0, reference, "--quiet")
    assert completed.returncode == 0, completed.stderr[-3000:]
    runs = {(1, "allreduce"): reference}
    in_memory = {2: STRATEGIES + NEW_STRATEGIES, 3: STRATEGIES, 4: NEW_STRATEGIES}
    from_file = {4: (*STRATEGIES, "auto")}
    for ranks in (2, 3, 4):
        out = folder / f"ranks-{ranks}"
        plan = ("--plan", str(plan4), *from_file[ranks]) if ranks in from_file else ()
        completed = run_ranks(
            ranks, str(DRIVERS / "run_strategies.py"), str(spec), str(out), *in_memory[ranks], *plan, timeout=300
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        runs.update({(ranks, strategy): out / strategy for strategy in in_memory[ranks] + from_file.get(ranks, ())})
    return runs


def test_maps_agree_across_strategies_and_rank_counts(maps):
    """|m - m_ref| <= 1e-10 max |m_ref| for I, Q, U; the same pixels solved; the same iterations."""
    reference = read_iqu(maps[1, "allreduce"])
    solved = reference[0] != hp.UNSEEN
    iterations = read_result(maps[1, "allreduce"]).iterations
    for key, out in maps.items():
        iqu = read_iqu(out)
        np.testing.assert_array_equal(iqu[0] != hp.UNSEEN, solved, err_msg=str(key))
        for stokes in range(3):
            scale = np.abs(reference[stokes, solved]).max()
            np.testing.assert_allclose(iqu[stokes, solved], reference[stokes, solved], rtol=0, atol=1e-10 * scale, err_msg=str(key))
        assert read_result(out).iterations == iterations, key


def test_result_reports_each_strategy(maps):
    for (ranks, strategy), out in maps.items():
        communication = read_result(out).communication
        assert communication.requested == strategy
        if strategy != "auto":
            assert communication.strategy == strategy
        if ranks == 1:
            continue
        assert communication.plan == ("file" if ranks == 4 and strategy not in NEW_STRATEGIES else "memory")
        assert communication.bytes_per_iteration.max > 0 and communication.messages_per_iteration.max > 0
        if strategy == "alltoallv":
            assert communication.messages_per_iteration.max <= ranks - 1
        if strategy in ("neighbor", "neighbor-overlap", "pairwise", "alltoallv-overlap"):
            assert communication.messages_per_iteration.max <= ranks - 1
        if strategy.startswith("neighbor"):  # the mpich wheel is MPI-4: the persistent collective ran
            assert communication.details == {"persistent": 1.0}
        if strategy == "butterfly":
            assert communication.messages_per_iteration.max <= 2  # one step (2-3 ranks) or two (4), folds on 3
        if strategy == "hybrid":
            assert communication.details["threshold"] >= 2
            assert communication.selection.chosen == "hybrid" and "threshold" in communication.selection.reason


def test_auto_records_its_choice(maps):
    communication = read_result(maps[4, "auto"]).communication
    selection = communication.selection
    assert selection.requested == "auto" and selection.chosen == communication.strategy
    assert set(selection.modeled) == {"allreduce", *STRATEGIES, *NEW_STRATEGIES}
    chosen = selection.modeled[selection.chosen]
    assert all(chosen.campaign_s <= other.campaign_s for other in selection.modeled.values())
    assert selection.realizations == 3 and selection.iterations == 50 and "Franklin" in selection.machine
    # The counted traffic is the modeled traffic.
    assert communication.bytes_per_iteration.max == chosen.bytes_per_iteration
    assert communication.messages_per_iteration.max == chosen.messages_per_iteration
    assert selection.modeled["allreduce"].preprocessing_s == 0 < selection.modeled["alltoallv"].preprocessing_s


def test_model_bytes_equal_the_bytes_a_run_counted(maps):
    """``model`` at 2 and 4 ranks: per-iteration bytes and messages of every strategy = what realize counted."""
    import json
    import subprocess
    import sys

    from mpi_support import REPO

    spec = write_spec(maps[1, "allreduce"].parent, "alltoallv.toml", **{'reduction = "allreduce"': 'reduction = "alltoallv"'})
    completed = subprocess.run(
        [sys.executable, "-m", "mapmaker", "model", "--spec", str(spec), "--ranks", "2,4", "--json"],
        check=False, capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout)
    assert [p["ranks"] for p in report["projections"]] == [2, 4]
    for projection in report["projections"]:
        ranks = projection["ranks"]
        for strategy in STRATEGIES + NEW_STRATEGIES:
            counted = read_result(maps[ranks, strategy]).communication
            modeled = projection["strategies"][strategy]
            assert counted.bytes_per_iteration.max == modeled["bytes_per_iteration_max"], (ranks, strategy)
            assert counted.bytes_per_iteration.mean == pytest.approx(modeled["bytes_per_iteration_mean"], rel=1e-12)
            assert counted.messages_per_iteration.max == modeled["messages_per_iteration_max"], (ranks, strategy)
        assert projection["overlap"]["neighbours_exact"]
        # allreduce: the Rabenseifner volume of the whole map, by construction.
        npix = report["npix"]
        assert projection["strategies"]["allreduce"]["bytes_per_iteration_max"] == round(2 * npix * 3 * (ranks - 1) / ranks * 8)
        if ranks == 4:  # the same figures and machine: the same choice as the run's auto
            assert projection["chosen"] == read_result(maps[4, "auto"]).communication.strategy


def test_overlap_variant_solves_as_its_blocking_twin(maps):
    """The same iterations and residual history (to round-off: P^T runs in two parts), the same traffic."""
    for ranks in (2, 4):
        for overlap, twin in TWINS.items():
            a, b = read_result(maps[ranks, overlap]), read_result(maps[ranks, twin])
            assert a.iterations == b.iterations, (ranks, overlap)
            np.testing.assert_allclose(a.residual_history, b.residual_history, rtol=1e-8, atol=0, err_msg=overlap)
            assert a.communication.bytes_per_iteration == b.communication.bytes_per_iteration
            assert a.communication.messages_per_iteration == b.communication.messages_per_iteration
            assert a.communication.reductions == b.communication.reductions
