"""Realisations across nodes, and the faults of a cluster: the three-node Slurm of
``deploy/slurm/start-local-slurm --nodes 3`` (each node a network namespace with its own slurmd), the
site deploy/sites/slurm-multinode.toml (two nodes per block, ranks started with srun), a live service and
a real ``mapcampaign worker``.

* a campaign through Slurm: a 4-rank realisation runs 2 ranks on each of two nodes of a block Parsl
  submitted, says so in its result, and gives the map a single-node run gives (to 1e-10);
* a node of the block dies mid-solve (``deploy/slurm/local-slurm-node fail``): Slurm marks it down, the
  attempt fails ``node_failure``, the realisation succeeds in a new block on the two nodes left;
* Slurm requeues the block (``scontrol requeue``): the attempt fails ``lost_worker`` and is retried;
* the block's time limit ends a two-node realisation: every rank on both nodes is gone, ``walltime``.

The time from each fault to the realisation's success is printed (``-s`` shows it), not asserted.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import healpy as hp
import numpy as np
import pytest

from tests.support.local_slurm import (
    SLURM_WORKER_MARKS,
    LocalSlurm,
    fail_node,
    node_processes,
    node_state,
    restore_node,
    scontrol,
    scontrol_job,
    write_slurm_site,
)
from tests.support.worker_helpers import Api, long_spec, start_worker, tiny_spec, wait_for, wait_running_with_job

pytestmark = SLURM_WORKER_MARKS

FAST = {"MAPCAMPAIGN_LEASE_S": "30", "MAPCAMPAIGN_REAPER_INTERVAL_S": "0.5"}
VENV_BIN = Path(sys.executable).parent
TWO_NODES = {"resources.ranks": 4, "resources.ranks_per_node": 2}
SITE = "slurm-multinode.toml"


@pytest.fixture
def cluster(local_slurm: LocalSlurm) -> LocalSlurm:
    """The local Slurm, with the three nodes a two-node block needs after losing one."""
    if len(local_slurm.nodes) < 3:
        why = f"the partition has {len(local_slurm.nodes)} nodes ({local_slurm.nodes}); these tests need 3"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return local_slurm


def job_nodes(job_id: str) -> list[str]:
    """The nodes of a Slurm job (its NodeList expanded)."""
    node_list = scontrol_job(job_id).get("NodeList", "")
    done = subprocess.run(
        ["scontrol", "show", "hostnames", node_list], capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout.split()


def ranks_on(node: str) -> list[int]:
    """The map-maker's rank processes on a node: Pythons running ``-m mapmaker realize`` (not srun, not the runner)."""
    return sorted(
        pid
        for pid, arguments in node_processes(node).items()
        if Path(arguments[0]).name.startswith("python") and "worker.runner" not in arguments
        and "mapmaker" in arguments and "realize" in arguments
    )


def assert_one_success(api: Api, campaign_id: int) -> dict:
    """The realisation succeeded exactly once: one successful attempt, counted once by the campaign, the plan
    and the coupling."""
    campaign = api.campaign(campaign_id)
    assert campaign["state"] == "succeeded", campaign
    assert campaign["progress"]["counts"]["succeeded"] == 1 and campaign["progress"]["done"] == 1, campaign
    realization = api.realization(campaign_id, 0)
    successes = [a for a in realization["attempt_history"] if a["ended_at"] and a["failure_class"] is None]
    assert len(successes) == 1, realization["attempt_history"]
    # The site's overlap plan was built once and the coupling file once, and each counts one use.
    [plan] = api.plans()
    assert plan["state"] == "ready" and plan["build_attempts"] == 1 and plan["uses"] == 1, plan
    [coupling] = api.client.get("/couplings").json()["items"]
    assert coupling["uses"] == 1, coupling
    return realization


def test_a_realisation_spans_two_nodes_and_gives_the_single_node_map(
    cluster, make_live_service, tmp_path
):
    service = make_live_service(env=FAST)
    api = Api(service)
    spec = tiny_spec("two nodes", realizations=1, **{"pixelization.nside": 16, **TWO_NODES})
    campaign = api.create(spec)
    site = write_slurm_site(tmp_path / "site.toml", partition=cluster.partition, bundled=SITE)
    worker = start_worker(service, site, "w-two-nodes", site="slurm-test")
    try:
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, timeout=400, worker=worker)
        assert done["state"] == "succeeded", worker.log_tail()
        realization = assert_one_success(api, campaign["id"])
        [attempt] = realization["attempt_history"]
        result = realization["result"]
        hosts = result["rank_hosts"]
        assert result["ranks"] == 4 and len(hosts) == 4, result
        per_node = collections.Counter(hosts)
        assert len(per_node) == 2 and set(per_node.values()) == {2}, hosts  # 2 ranks on each of 2 nodes
        job_id = attempt["scheduler_job_id"]
        assert job_id and job_id.isdigit(), attempt
        assert scontrol_job(job_id).get("JobName", "").startswith("parsl."), job_id  # the block Parsl submitted
        assert set(hosts) == set(job_nodes(job_id)), (hosts, attempt)
        assert worker.stop() == 0, worker.log_tail()
    finally:
        worker.stop()
        api.close()

    # The same realisation on 4 ranks of this one machine, by Hydra's mpiexec outside Slurm.
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    single = tmp_path / "single-node"
    command = [str(VENV_BIN / "mpiexec"), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "mapmaker", "realize",
               "--spec", str(spec_file), "--realization", "0", "--out", str(single)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    across = hp.read_map(
        service.data_dir / "campaigns" / str(campaign["id"]) / "realizations" / "0" / "map_iqu.fits", field=(0, 1, 2)
    )
    reference = hp.read_map(single / "map_iqu.fits", field=(0, 1, 2))
    solved = reference[0] != hp.UNSEEN
    np.testing.assert_array_equal(across[0] != hp.UNSEEN, solved)
    for stokes in range(3):
        scale = np.abs(reference[stokes, solved]).max()
        np.testing.assert_allclose(across[stokes, solved], reference[stokes, solved], rtol=0, atol=1e-10 * scale)


def test_slurm_requeueing_the_block_retries_the_realisation(cluster, make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    campaign = api.create(long_spec("requeued", realizations=1, max_attempts=3, **TWO_NODES))
    # This cluster keeps Slurm's JobRequeue=0, so the block asks to be requeueable (most sites default to it).
    site = write_slurm_site(
        tmp_path / "site.toml", partition=cluster.partition, bundled=SITE, scheduler_options="#SBATCH --requeue"
    )
    worker = start_worker(service, site, "w-requeue", site="slurm-test")
    try:
        job_id = wait_running_with_job(api, campaign["id"], worker)
        nodes = job_nodes(job_id)
        wait_for(lambda: all(ranks_on(node) for node in nodes), 120, "ranks running on both nodes", worker=worker)
        fault = time.monotonic()
        scontrol("requeue", job_id)
        # Slurm holds a requeued batch job for about two minutes (Reason=BeginTime) before it may start
        # again; an operator releases it at once, which keeps the test short.
        wait_for(lambda: scontrol_job(job_id).get("JobState") == "PENDING", 60, "the requeued job pending", worker=worker)
        scontrol("update", f"JobId={job_id}", "StartTime=now")
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, timeout=400, worker=worker)
        print(f"\nrequeue of block {job_id} to success: {time.monotonic() - fault:.1f} s")
        assert done["state"] == "succeeded", worker.log_tail()
        realization = assert_one_success(api, campaign["id"])
        first, *rest = realization["attempt_history"]
        assert first["failure_class"] == "lost_worker" and first["scheduler_job_id"] == job_id, first
        assert rest and rest[-1]["failure_class"] is None, rest
        assert int(scontrol_job(job_id).get("Restarts", "0")) >= 1  # Slurm did requeue it
        assert worker.process.poll() is None
    finally:
        worker.stop()
        api.close()


def write_sleeping_python(path: Path) -> Path:
    """A stand-in for the nodes' Python whose map-maker ranks sleep: a realisation that outlives its block.

    The ranks keep "mapmaker realize" in their command line (as arguments of a Python that only sleeps),
    so they can be found on the nodes. Everything else runs the real Python.
    """
    python = VENV_BIN / "python"
    path.write_text(
        "#!/bin/sh\n"
        f'[ "$1 $2 $3 $4 $5" = "-m mpi4py -m mapmaker realize" ] && exec {python} -c "import time; time.sleep(900)" "$@"\n'
        f'exec {python} "$@"\n'
    )
    path.chmod(0o755)
    return path


def test_the_block_time_limit_ends_every_rank_on_both_nodes_as_walltime(cluster, make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    # The task's own limit is far away: only the block's (one minute, Slurm's smallest) can end it.
    spec = tiny_spec("block time limit", realizations=1, max_attempts=2, **{"resources.walltime_s": 3_000.0, **TWO_NODES})
    campaign = api.create(spec)
    (tmp_path / "bin").mkdir()
    python = write_sleeping_python(tmp_path / "bin" / "python")
    site = write_slurm_site(
        tmp_path / "site.toml", partition=cluster.partition, bundled=SITE, walltime="00:01:00", python=python
    )
    worker = start_worker(
        service, site, "w-timelimit", site="slurm-test", env={"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    )
    try:
        job_id = wait_running_with_job(api, campaign["id"], worker)
        nodes = job_nodes(job_id)
        assert len(nodes) == 2, nodes
        running = wait_for(
            lambda: (r := {node: ranks_on(node) for node in nodes}) and all(len(p) == 2 for p in r.values()) and r,
            120,
            "two ranks on each node of the block",
            worker=worker,
        )

        def first_attempt_ended() -> dict | None:
            history = api.realization(campaign["id"], 0)["attempt_history"]
            return history[0] if history[0]["ended_at"] else None

        first = wait_for(first_attempt_ended, 240, "the block's time limit to end attempt 1", worker=worker)
        assert first["failure_class"] == "walltime", (first, worker.log_tail())
        assert first["scheduler_job_id"] == job_id
        assert scontrol_job(job_id).get("JobState") == "TIMEOUT"
        for node, pids in running.items():  # the very ranks that ran are gone, on both nodes
            assert not set(pids) & set(ranks_on(node)), (node, pids)
        realization = api.realization(campaign["id"], 0)
        assert realization["state"] in {"queued", "claimed", "running"}, realization  # attempts remain
        api.client.post(f"/campaigns/{campaign['id']}/cancel", json={})
    finally:
        worker.stop()
        api.close()


def test_a_node_that_dies_mid_solve_fails_the_attempt_as_node_failure(cluster, make_live_service, tmp_path):
    service = make_live_service(env=FAST)
    api = Api(service)
    campaign = api.create(long_spec("node dies", realizations=1, max_attempts=3, **TWO_NODES))
    site = write_slurm_site(tmp_path / "site.toml", partition=cluster.partition, bundled=SITE)
    worker = start_worker(service, site, "w-node-dies", site="slurm-test")
    victim = None
    try:
        job_id = wait_running_with_job(api, campaign["id"], worker)
        nodes = job_nodes(job_id)
        # The node that is not the batch host: the task runner (on the batch host) lives to see it.
        victim = next(node for node in nodes if node != scontrol_job(job_id).get("BatchHost"))
        wait_for(lambda: ranks_on(victim), 120, f"ranks running on {victim}", worker=worker)
        fault = time.monotonic()
        fail_node(victim)
        wait_for(lambda: node_state(victim).startswith("down"), 60, f"Slurm to mark {victim} down", worker=worker)
        done = api.wait_state(campaign["id"], {"succeeded", "failed"}, timeout=400, worker=worker)
        print(f"\nnode {victim} failure to success: {time.monotonic() - fault:.1f} s")
        assert done["state"] == "succeeded", worker.log_tail()
        realization = assert_one_success(api, campaign["id"])
        first, *rest = realization["attempt_history"]
        assert first["failure_class"] == "node_failure" and first["scheduler_job_id"] == job_id, first
        assert scontrol_job(job_id).get("JobState") == "NODE_FAIL"
        last = rest[-1]
        assert last["scheduler_job_id"] != job_id, rest  # a new block ...
        hosts = realization["result"]["rank_hosts"]
        assert victim not in hosts and len(set(hosts)) == 2, hosts  # ... on the two nodes left
        assert worker.process.poll() is None
    finally:
        worker.stop()
        api.close()
        if victim is not None:
            restore_node(victim)
