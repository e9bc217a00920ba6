"""Benchmark of the campaign service through its real HTTP API (a live ``mapcampaign serve``).

    .venv/bin/python benchmarks/bench_service.py --database postgresql
    .venv/bin/python benchmarks/bench_service.py --database postgresql --batches 1,10,50 --api-workers 2
    .venv/bin/python benchmarks/bench_service.py --database sqlite --realizations 10000 --claimers 4

Prints:
  * p50/p99 latency of campaign status reads (GET /campaigns/{id}: counts per state,
    throughput, ETA) on a campaign of N realisations, all queued and then all claimed;
  * claims per second for each batch size (``max_tasks`` of each claim request): several
    claiming processes draining a campaign of N realisations, each handed out once (checked),
    one campaign per batch size, side by side.

PostgreSQL: a fresh database on 127.0.0.1:5432 (user postgres), dropped at the end.
Figures include the Python HTTP client; one machine runs client and server.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._support import (
    DRAIN_LEASE_S,
    add_json_option,
    create_pg_database,
    drop_pg_database,
    spec_data,
    start_live_service,
    write_json,
)


def claimer(args: tuple[str, str, str, int]) -> list[int]:
    api_url, token, name, batch = args
    claimed: list[int] = []
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        worker = client.post("/workers", json={"name": name, "site": "local", "host": name}).json()["id"]
        while True:
            tasks = client.post(f"/workers/{worker}/claim", json={"max_tasks": batch}).json()["tasks"]
            if not tasks:
                return claimed
            claimed += [task["realization"] for task in tasks]


def read_latencies(client: httpx.Client, campaign_id: int, reads: int) -> tuple[float, float]:
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        answer = client.get(f"/campaigns/{campaign_id}")
        times.append(time.perf_counter() - start)
        answer.raise_for_status()
    times.sort()
    return statistics.median(times) * 1e3, times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3


def drain(api_url: str, token: str, claimers: int, batch: int, expected: int) -> tuple[int, float]:
    """Claim every queued realisation with ``claimers`` processes asking ``batch`` at a time: (claims, seconds)."""
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(claimers) as pool:
        results = pool.map(claimer, [(api_url, token, f"bench-{batch}-{n}", batch) for n in range(claimers)])
    seconds = time.perf_counter() - start
    handed_out = [index for result in results for index in result]
    if sorted(handed_out) != list(range(expected)):
        twice = len(handed_out) - len(set(handed_out))
        missing = len(set(range(expected)) - set(handed_out))
        raise SystemExit(f"max_tasks={batch}: {twice} realisations handed out twice, {missing} not at all")
    return len(handed_out), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--realizations", type=int, default=10_000)
    parser.add_argument("--claimers", type=int, default=4)
    parser.add_argument("--batches", default="1,10,50", help="claim sizes (max_tasks) to measure, comma-separated")
    parser.add_argument("--api-workers", type=int, default=1, help="API processes (mapcampaign serve --workers)")
    parser.add_argument("--reads", type=int, default=500)
    add_json_option(parser)
    options = parser.parse_args()
    batches = [int(value) for value in options.batches.split(",")]

    pg_url = create_pg_database("mapcampaign_bench") if options.database == "postgresql" else None
    rates: dict[int, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="mapcampaign-bench-") as folder:
        service = start_live_service(
            Path(folder) / "service",
            pg_url,
            serve_args=("--workers", str(options.api_workers)),
            env={"MAPCAMPAIGN_LEASE_S": str(DRAIN_LEASE_S)},
        )
        try:
            with service.client(service.user_token) as user, service.client(service.worker_token) as worker:
                start = time.perf_counter()
                campaign = user.post("/campaigns", json=spec_data(realizations=options.realizations)).json()
                create_s = time.perf_counter() - start
                builder = worker.post("/workers", json={"name": "builder", "site": "local", "host": "h"}).json()["id"]
                task = worker.post(f"/workers/{builder}/claim", json={"max_tasks": 1}).json()["tasks"][0]
                worker.post(
                    f"/tasks/{task['task_id']}/plan-built",
                    json={"path": "/p", "checksum": "c", "size_bytes": 1, "build_time_s": 1},
                ).raise_for_status()
                user.get(f"/campaigns/{campaign['id']}")  # warm up
                queued = read_latencies(user, campaign["id"], options.reads)
                for number, batch in enumerate(batches):
                    if number:  # a fresh campaign of the same size (same scan key: the plan is ready)
                        user.post(
                            "/campaigns", json=spec_data(name=f"batch {batch}", realizations=options.realizations)
                        ).raise_for_status()
                    rates[batch] = drain(
                        service.api_url, service.worker_token, options.claimers, batch, options.realizations
                    )
                claimed = read_latencies(user, campaign["id"], options.reads)
        finally:
            service.stop()
            if pg_url:
                drop_pg_database(pg_url)

    print(
        f"database: {options.database}; realisations: {options.realizations}; claimers: {options.claimers}; "
        f"API processes: {options.api_workers}"
    )
    print(f"create campaign ({options.realizations} realisations): {create_s * 1e3:.0f} ms")
    print(f"status read, all queued:  p50 {queued[0]:.1f} ms  p99 {queued[1]:.1f} ms  ({options.reads} reads)")
    print(f"status read, all claimed: p50 {claimed[0]:.1f} ms  p99 {claimed[1]:.1f} ms  ({options.reads} reads)")
    for batch, (count, seconds) in rates.items():
        print(
            f"claims, max_tasks={batch}: {count} in {seconds:.1f} s = {count / seconds:.0f} claims/s "
            f"({options.claimers} processes, each realisation handed out once)"
        )
    write_json(options.json, {
        "database": options.database,
        "realizations": options.realizations,
        "claimers": options.claimers,
        "api_workers": options.api_workers,
        "create_campaign_ms": create_s * 1e3,
        "status_read_queued": {"p50_ms": queued[0], "p99_ms": queued[1], "reads": options.reads},
        "status_read_claimed": {"p50_ms": claimed[0], "p99_ms": claimed[1], "reads": options.reads},
        "claims": {str(batch): {"claims": count, "seconds": seconds, "claims_per_s": count / seconds}
                   for batch, (count, seconds) in rates.items()},
    })  # fmt: skip


if __name__ == "__main__":
    main()
