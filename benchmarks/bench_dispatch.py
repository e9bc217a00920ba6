"""Dispatch overhead of the site worker against the map-making it dispatches.

    .venv/bin/python benchmarks/bench_dispatch.py                          # 12 tiny realisations, 1 at a time
    .venv/bin/python benchmarks/bench_dispatch.py --spec long --realizations 6 --max-tasks 2

Starts a live ``mapcampaign serve`` (embedded SQLite, or a fresh PostgreSQL database) and one
``mapcampaign worker`` on the local site (Parsl LocalProvider + MPIExecutor + mpiexec), runs a
campaign of 2-rank realisations, and reads the timeline the worker keeps for every task
(``MAPCAMPAIGN_WORKER_KEEP_WORK=true``):

  claimed    the claim answer is in the worker
  launched   the task runner started ``mpiexec`` (on the node)
  exited     the runner saw the MPI job end
  stored     the service accepted the result (products uploaded, ``succeeded`` answered)

and prints, per realisation, median / 90th percentile / max of

  dispatch in   claimed -> launched   (work folder, Parsl submit, interchange, worker pool, bash, runner)
  MPI job       launched -> exited    (of which "in the map-maker": result.json's timing.total;
                                       the rest is mpiexec and Python start-up, imports, finalisation)
  dispatch out  exited -> stored      (Parsl result, classification, sha256, upload of 3 FITS files, result POST)

Wall-clock figures: run it on a quiet machine, or note the load average it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._support import (
    Api,
    add_json_option,
    create_pg_database,
    drop_pg_database,
    long_spec,
    start_live_service,
    start_worker,
    tiny_spec,
    write_json,
    write_site,
)


def spread(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
    return f"{statistics.median(values):7.2f} {p90:7.2f} {values[-1]:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--realizations", type=int, default=12)
    parser.add_argument("--max-tasks", type=int, default=1, help="tasks the worker runs at once (default 1)")
    parser.add_argument(
        "--spec", choices=("tiny", "long"), default="tiny", help="tiny: nside 8, 10 min; long: nside 16, 1 day"
    )
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    add_json_option(parser)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as folder:
        root = Path(folder)
        pg_url = create_pg_database("mapcampaign_bench") if args.database == "postgresql" else None
        service = start_live_service(root / "service", pg_url)
        worker = None
        try:
            api = Api(service)
            make = tiny_spec if args.spec == "tiny" else long_spec
            campaign = api.create(make(f"bench {args.spec}", realizations=args.realizations))
            site = write_site(root / "site.toml", max_tasks=args.max_tasks, kill_grace_s=5, liveness_timeout_s=60)
            started = time.monotonic()
            worker = start_worker(
                service, site, "bench", env={"MAPCAMPAIGN_WORKER_KEEP_WORK": "true", "MAPCAMPAIGN_WORKER_POLL_S": "0.2"}
            )
            final = api.wait_state(campaign["id"], {"succeeded", "failed"}, timeout=3_600, worker=worker)
            elapsed = time.monotonic() - started
            if final["state"] != "succeeded":
                raise SystemExit(f"campaign {final['state']}: {final.get('failure_cause')}\n{worker.log_tail()}")
            load = os.getloadavg()
            timelines = [
                json.loads(path.read_text()) for path in sorted((worker.site_data / "work").glob("*/timeline.json"))
            ]
        finally:
            if worker is not None:
                worker.stop(signal.SIGTERM, timeout=120)
            service.stop()
            if pg_url is not None:
                drop_pg_database(pg_url)

    realize = [t for t in timelines if t["kind"] == "realize" and t["outcome"] == "succeeded"]
    build = [t for t in timelines if t["kind"] == "preprocess"]
    phases = {
        "dispatch in (claimed -> launched)": [t["launched_at"] - t["claimed_at"] for t in realize],
        "MPI job (launched -> exited)": [t["exited_at"] - t["launched_at"] for t in realize],
        "  in the map-maker (timing.total)": [t["mapmaker_total_s"] for t in realize],
        "  mpiexec + Python start-up/exit": [
            t["exited_at"] - t["launched_at"] - t["mapmaker_total_s"] for t in realize
        ],
        "dispatch out (exited -> stored)": [t["reported_at"] - t["exited_at"] for t in realize],
        "claimed -> stored": [t["reported_at"] - t["claimed_at"] for t in realize],
    }
    summary = {
        "realizations": len(realize),
        "max_tasks": args.max_tasks,
        "spec": args.spec,
        "database": args.database,
        "campaign_wall_s": round(elapsed, 2),
        "load_average": [round(x, 2) for x in load],
        "phases_s": {name: {"median": statistics.median(v), "max": max(v)} for name, v in phases.items()},
        "plan_build": [{k: t.get(k) for k in ("claimed_at", "launched_at", "exited_at", "reported_at")} for t in build],
    }
    write_json(args.json, summary)
    if args.json == "-":
        return
    print(
        f"{len(realize)} realisations ({args.spec} spec, 2 ranks, {args.max_tasks} at a time, {args.database}): "
        f"campaign {elapsed:.1f} s from worker start; load average {load[0]:.1f}"
    )
    print(f"{'seconds per realisation':36s} {'median':>7s} {'p90':>7s} {'max':>7s}")
    for name, values in phases.items():
        print(f"{name:36s} {spread(values)}")
    dispatch = statistics.median(phases["dispatch in (claimed -> launched)"]) + statistics.median(
        phases["dispatch out (exited -> stored)"]
    )
    job = statistics.median(phases["MPI job (launched -> exited)"])
    print(
        f"dispatch overhead (in + out, medians): {dispatch:.2f} s per realisation = {dispatch / job:.0%} of the MPI job"
    )


if __name__ == "__main__":
    main()
