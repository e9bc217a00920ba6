"""The service at collaboration scale: many campaigns, a million realisations, on PostgreSQL.

    .venv/bin/python benchmarks/bench_scale.py                                  # 100 campaigns, 1,000,000 realisations
    .venv/bin/python benchmarks/bench_scale.py --campaigns 10 --total 20000 --big 5000   # a small run

A real ``mapcampaign serve`` on a fresh PostgreSQL database on 127.0.0.1:5432 (dropped at the end).
Every figure goes through the HTTP API or the dashboard, as a user or a worker sees it:

  * submit: ``POST /campaigns`` of the big campaign (``--big`` realisations), then of the others
    (``--campaigns - 1`` of them, ``--total - --big`` realisations between them), rows per second;
  * reads while the table holds ``--total`` realisations: the campaign list, the big campaign's status,
    its realisation list (first page and a page deep in it, by cursor), the dashboard's campaign page;
    p50/p99 of ``--reads`` each;
  * claims: ``--claimers`` processes claiming ``--claims`` realisations (``max_tasks`` 1, then 10);
  * cancel and delete of the big campaign (some of it claimed, the rest queued).

After the bulk submission the database's statistics are refreshed (``ANALYZE``), as autovacuum does
after a large load; without it the planner's estimates are of an empty table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
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


def timed_reads(client: httpx.Client, path: str, reads: int, **kwargs: Any) -> dict[str, float]:
    """p50 and p99 in ms of ``reads`` GETs of ``path`` (each must answer 200)."""
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        answer = client.get(path, **kwargs)
        times.append(time.perf_counter() - start)
        answer.raise_for_status()
    times.sort()
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3,
        "reads": reads,
    }


def claimer(args: tuple[str, str, str, int, int]) -> int:
    """Claim ``count`` realisations ``batch`` at a time (or until none is left); return how many."""
    api_url, token, name, batch, count = args
    claimed = 0
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:
        worker = client.post("/workers", json={"name": name, "site": "local", "host": name}).json()["id"]
        while claimed < count:
            answer = client.post(f"/workers/{worker}/claim", json={"max_tasks": min(batch, count - claimed)})
            answer.raise_for_status()
            tasks = answer.json()["tasks"]
            if not tasks:
                break
            claimed += len(tasks)
    return claimed


def claim_rate(api_url: str, token: str, claimers: int, batch: int, claims: int) -> dict[str, float]:
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(claimers) as pool:
        counts = pool.map(
            claimer, [(api_url, token, f"scale-{batch}-{n}", batch, claims // claimers) for n in range(claimers)]
        )
    seconds = time.perf_counter() - start
    return {"claims": sum(counts), "seconds": seconds, "claims_per_s": sum(counts) / seconds, "max_tasks": batch}


def dashboard_login(url: str, token: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=120)
    answer = client.post("/login", data={"token": token, "next": "/"}, headers={"Origin": url}, follow_redirects=False)
    if answer.status_code != 303:
        raise SystemExit(f"dashboard login failed: {answer.status_code} {answer.text[:200]}")
    return client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--campaigns", type=int, default=100)
    parser.add_argument("--total", type=int, default=1_000_000, help="realisations over all campaigns")
    parser.add_argument("--big", type=int, default=100_000, help="realisations of the campaign cancelled and deleted")
    parser.add_argument("--reads", type=int, default=100, help="reads of each kind")
    parser.add_argument("--claimers", type=int, default=4)
    parser.add_argument("--claims", type=int, default=2_000, help="realisations claimed for each claim size")
    parser.add_argument("--api-workers", type=int, default=1, help="API processes (mapcampaign serve --workers)")
    add_json_option(parser)
    options = parser.parse_args()
    others = options.campaigns - 1
    if others < 1 or options.total - options.big < others:
        parser.error("need --campaigns >= 2 and at least one realisation for each campaign besides the big one")

    figures: dict[str, Any] = {
        "campaigns": options.campaigns,
        "total_realizations": options.total,
        "big_campaign": options.big,
        "api_workers": options.api_workers,
    }
    pg_url = create_pg_database("mapcampaign_scale")
    try:
        with tempfile.TemporaryDirectory(prefix="mapcampaign-scale-") as folder:
            service = start_live_service(
                Path(folder) / "service",
                pg_url,
                serve_args=("--workers", str(options.api_workers)),
                env={"MAPCAMPAIGN_LEASE_S": str(DRAIN_LEASE_S)},
            )
            try:
                run(service, options, others, figures, pg_url)
            finally:
                service.stop()
    finally:
        drop_pg_database(pg_url)
    print_figures(figures)
    write_json(options.json, figures)


def run(service: Any, options: argparse.Namespace, others: int, figures: dict[str, Any], pg_url: str) -> None:
    with service.client(service.user_token, timeout=600) as user, service.client(service.worker_token) as worker:
        start = time.perf_counter()
        answer = user.post("/campaigns", json=spec_data(name="big", realizations=options.big))
        answer.raise_for_status()
        big = answer.json()["id"]
        figures["submit_big_s"] = time.perf_counter() - start

        rest = options.total - options.big
        sizes = [rest // others + (1 if n < rest % others else 0) for n in range(others)]
        start = time.perf_counter()
        for number, size in enumerate(sizes):
            user.post("/campaigns", json=spec_data(name=f"scale {number}", realizations=size)).raise_for_status()
        seconds = time.perf_counter() - start
        figures["submit_others"] = {"campaigns": others, "realizations": rest, "seconds": seconds,
                                    "realizations_per_s": rest / seconds}  # fmt: skip
        with psycopg.connect(pg_url, autocommit=True) as connection:
            start = time.perf_counter()
            connection.execute("ANALYZE")
            figures["analyze_s"] = time.perf_counter() - start

        builder = worker.post("/workers", json={"name": "builder", "site": "local", "host": "h"}).json()["id"]
        build = worker.post(f"/workers/{builder}/claim", json={"max_tasks": 1}).json()["tasks"][0]
        worker.post(
            f"/tasks/{build['task_id']}/plan-built",
            json={"path": "/plans/p.plan", "checksum": "c", "size_bytes": 1, "build_time_s": 1},
        ).raise_for_status()

        reads = options.reads
        figures["list_campaigns"] = timed_reads(user, "/campaigns", reads, params={"limit": 50})
        figures["status_big"] = timed_reads(user, f"/campaigns/{big}", reads)
        figures["realizations_first_page"] = timed_reads(user, f"/campaigns/{big}/realizations", reads,
                                                         params={"limit": 100})  # fmt: skip
        cursor = None
        for _ in range(5):  # five pages in: a cursor deep in the campaign
            page = user.get(f"/campaigns/{big}/realizations", params={"limit": 500, "cursor": cursor}).json()
            cursor = page["next_cursor"]
        figures["realizations_deep_page"] = timed_reads(user, f"/campaigns/{big}/realizations", reads,
                                                        params={"limit": 100, "cursor": cursor})  # fmt: skip
        browser = dashboard_login(service.url, service.user_token)
        try:
            figures["dashboard_campaign_page"] = timed_reads(browser, f"/campaigns/{big}", max(reads // 4, 5))
        finally:
            browser.close()

        # The big campaign was made first: with equal priorities the claims take its realisations.
        figures["claims"] = [
            claim_rate(service.api_url, service.worker_token, options.claimers, batch, options.claims)
            for batch in (1, 10)
        ]

        start = time.perf_counter()
        answer = user.post(f"/campaigns/{big}/cancel", json={"reason": "scale benchmark"})
        answer.raise_for_status()
        figures["cancel_big_s"] = time.perf_counter() - start
        counts = answer.json()["progress"]["counts"]
        unfinished = sum(counts[state] for state in ("queued", "claimed", "running"))
        start = time.perf_counter()
        user.delete(f"/campaigns/{big}").raise_for_status()
        figures["delete_big_s"] = time.perf_counter() - start
        figures["unfinished_after_cancel"] = unfinished
        if unfinished:
            raise SystemExit(f"{unfinished} realisations of the cancelled campaign are still unfinished")


def print_figures(figures: dict[str, Any]) -> None:
    def reads(name: str) -> str:
        value = figures[name]
        return f"p50 {value['p50_ms']:.1f} ms  p99 {value['p99_ms']:.1f} ms  ({value['reads']} reads)"

    others = figures["submit_others"]
    print(
        f"PostgreSQL, {figures['campaigns']} campaigns, {figures['total_realizations']:,} realisations, "
        f"API processes: {figures['api_workers']}"
    )
    print(f"submit the big campaign ({figures['big_campaign']:,} realisations): {figures['submit_big_s']:.2f} s")
    print(
        f"submit {others['campaigns']} more ({others['realizations']:,} realisations): {others['seconds']:.1f} s "
        f"= {others['realizations_per_s']:,.0f} realisations/s; ANALYZE {figures['analyze_s']:.1f} s"
    )
    print(f"list campaigns (50 a page):        {reads('list_campaigns')}")
    print(f"status of the big campaign:        {reads('status_big')}")
    print(f"realisations, first page of 100:   {reads('realizations_first_page')}")
    print(f"realisations, page 6 of 100:       {reads('realizations_deep_page')}")
    print(f"dashboard campaign page:           {reads('dashboard_campaign_page')}")
    for claims in figures["claims"]:
        print(
            f"claims, max_tasks={claims['max_tasks']}: {claims['claims']} in {claims['seconds']:.1f} s "
            f"= {claims['claims_per_s']:.0f} claims/s"
        )
    print(
        f"cancel the big campaign: {figures['cancel_big_s']:.2f} s (unfinished after: {figures['unfinished_after_cancel']})"
    )
    print(f"delete the big campaign: {figures['delete_big_s']:.2f} s")


if __name__ == "__main__":
    main()
