"""Load on the live service: many clients read status and list realisations while workers claim and report.

    .venv/bin/python benchmarks/bench_load.py                       # the documented run: 200 clients, 4 workers, 60 s
    .venv/bin/python benchmarks/bench_load.py --duration 5 --clients 50
    .venv/bin/python benchmarks/bench_load.py --open-loop --period 4  # 200 users refreshing every 4 s: 50 reads/s
    .venv/bin/python benchmarks/bench_load.py --client wrk --workers 0 --clients 8  # the closed loop sent by wrk

A real ``mapcampaign serve`` on a fresh PostgreSQL database on 127.0.0.1:5432 (loopback).
The readers are asyncio tasks in this process (or wrk, below), each with its own HTTP connection,
asking a random campaign's ``GET /campaigns/{id}`` (status) or ``GET /campaigns/{id}/realizations?limit=50``,
half and half.

Closed loop (the default): each reader sends its next request as soon as the last is answered, so
the figures are the service's throughput under saturation. Open loop (``--open-loop``): each reader
is a user refreshing a page every ``--period`` seconds (first refresh at a random phase), whatever
the service's speed; a read's latency is counted from the time it was due, so a slow answer also
delays (and is charged to) the user's next refresh. That is the latency a user sees.
The workers are protocol-level (not Parsl or the map-maker):
separate processes that register, claim 1-3 tasks, report started, and report the plan built or a
fabricated result, as fast as the service answers. Every non-2xx answer or transport error counts
as an error. At the end the database is checked: every reported success is stored once, no
realisation succeeded twice.

The clock starts after a warm-up (``--warmup``, default 5 s) in which every reader and worker
already runs: the HTTP clients are made, the worker processes started and registered, the
service's caches warm; requests due in it are not counted. Without it the start-up itself was
measured: 200 clients made at once and 4 worker processes importing their modules held the
load generator's (and the machine's) CPU for seconds, and every refresh due meanwhile was
charged that delay (p99 of several seconds at 50 reads/s, all of it in the first 10 s).

``--workers 0 --clients 8``: the closed loop with readers only, the most reads per second the
service answers (what the clients can send limits it too: they share the machine). ``--floor``
makes every read ``GET /healthz`` (no token; one connection, on which Alembic reads the schema
revision): a reference for what a small request costs on this stack (uvicorn, FastAPI,
SQLAlchemy, PostgreSQL) on the machine.

Figures include the load generator, which shares the machine (and its cores) with the server.
The Python readers spend about 1-1.5 ms of CPU a request, as much as the service itself on a small
machine, so their closed loop measures the client as much as the server. ``--client wrk`` sends the
same reads (random campaign, status or page half and half; ``/healthz`` with ``--floor``) from wrk,
the C load generator (one thread, ``--clients`` connections, a Lua script made for the run), which
spends a few tens of microseconds a request. wrk runs a closed loop only (no ``--open-loop``), in
whole seconds: a first run of ``--warmup`` seconds is discarded, the second is counted; its summary
gives the reads and their p50/p95/p99, every answer with status > 399 or socket error counts as an
error (a 503 "busy" answer too: wrk cannot retry it). The load generator's CPU is then wrk's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import (
    add_json_option,
    create_pg_database,
    drop_pg_database,
    result_for,
    spec_data,
    start_live_service,
    write_json,
)


def latency_ms(values: list[float]) -> dict[str, float | None]:
    """Median, 95th and 99th percentiles of latencies given in seconds, in ms (None without any)."""
    if not values:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    ordered = sorted(values)

    def rank(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1e3

    return {"p50_ms": statistics.median(ordered) * 1e3, "p95_ms": rank(0.95), "p99_ms": rank(0.99)}


@dataclass
class LoadReport:
    duration_s: float
    clients: int
    workers: int
    open_loop_period_s: float | None = None  # None: closed loop
    warmup_s: float = 0.0
    client: str = "python"  # the readers: "python" (asyncio tasks in this process) or "wrk"
    server_cpu_s: float | None = None  # CPU time of the API processes in the measured window
    readers_cpu_s: float | None = None  # CPU time of the readers (this process, or wrk) in the measured window
    read_latencies_s: list[float] = field(default_factory=list)
    # --client wrk: count and p50/p95/p99 ms of the reads from wrk's summary (read_latencies_s stays empty)
    wrk_reads: dict[str, float | None] | None = None
    worker_latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    claims: int = 0
    busy: int = 0  # 503 answers with Retry-After (the pool was exhausted): retried, not errors
    floor_url: str | None = None  # --floor: every read is this URL (GET /healthz) instead of status and pages
    reported_successes: list[tuple[int, int]] = field(default_factory=list)

    @property
    def reads(self) -> dict[str, float | None]:
        """Count and p50/p95/p99 (ms) of the counted reads."""
        if self.wrk_reads is not None:
            return self.wrk_reads
        return {"count": len(self.read_latencies_s), **latency_ms(self.read_latencies_s)}

    @property
    def read_count(self) -> int:
        return int(self.reads["count"] or 0)

    @property
    def requests(self) -> int:
        return self.read_count + len(self.worker_latencies_s)

    def figures(self) -> dict:
        """The figures as one JSON object (latencies in ms, rates per second)."""
        return {
            "duration_s": self.duration_s,
            "mode": "closed" if self.open_loop_period_s is None else "open",
            "client": self.client,
            "open_loop_period_s": self.open_loop_period_s,
            "warmup_s": self.warmup_s,
            "clients": self.clients,
            "workers": self.workers,
            "reads_of": "GET /healthz (--floor)" if self.floor_url else "campaign status and realisation pages",
            "requests": self.requests,
            "requests_per_s": self.requests / self.duration_s,
            "errors": len(self.errors),
            "reads": {**self.reads, "per_s": self.read_count / self.duration_s},
            "worker_calls": {"count": len(self.worker_latencies_s),
                             "per_s": len(self.worker_latencies_s) / self.duration_s,
                             **latency_ms(self.worker_latencies_s)},
            "claims": self.claims,
            "reported_successes": len(self.reported_successes),
            "busy_retried": self.busy,
            "server_cpu_s": self.server_cpu_s,
            "server_cpu_ms_per_request": self.server_cpu_ms_per_request,
            "readers_cpu_s": self.readers_cpu_s,
        }  # fmt: skip

    @property
    def server_cpu_ms_per_request(self) -> float | None:
        if self.server_cpu_s is None or not self.requests:
            return None
        return self.server_cpu_s / self.requests * 1e3

    def lines(self) -> list[str]:
        def percentiles(figures: dict[str, float | None]) -> str:
            if figures["p50_ms"] is None:
                return "none"
            return f"p50 {figures['p50_ms']:.1f} ms, p95 {figures['p95_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms"

        mode = (
            "closed loop"
            if self.open_loop_period_s is None
            else f"open loop, each refreshing every {self.open_loop_period_s:g} s"
        )
        generator = "wrk" if self.client == "wrk" else "the readers' process"
        return [
            (
                f"{self.clients} reading clients ({mode}, {self.client} client) + {self.workers} protocol-level "
                f"workers for {self.duration_s:.0f} s (after {self.warmup_s:g} s of warm-up) against PostgreSQL "
                "on loopback"
            ),
            f"requests: {self.requests} ({self.requests / self.duration_s:.0f}/s), errors: {len(self.errors)}",
            (
                f"reads ({'GET /healthz' if self.floor_url else 'status + realisation list'}): {self.read_count} "
                f"({self.read_count / self.duration_s:.0f}/s), {percentiles(self.reads)}"
            ),
            (
                f"worker calls (claim/started/report): {len(self.worker_latencies_s)} "
                f"({len(self.worker_latencies_s) / self.duration_s:.0f}/s), "
                f"{percentiles(latency_ms(self.worker_latencies_s))}"
            ),
            (
                f"claims: {self.claims}, realisations reported succeeded: {len(self.reported_successes)}, "
                f"503 busy answers retried: {self.busy}"
            ),
        ] + (
            [
                (
                    f"API processes' CPU: {self.server_cpu_s:.1f} s, {self.server_cpu_ms_per_request:.2f} ms per "
                    f"request; the load generator ({generator}): {self.readers_cpu_s or 0:.1f} s"
                )
            ]
            if self.server_cpu_ms_per_request is not None
            else []
        )


def _client(api_url: str, token: str, tls: ssl.SSLContext) -> httpx.AsyncClient:
    # One TLS context for all (the URL is plain HTTP; httpx makes one per client otherwise, ~10 ms of CPU each).
    return httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60, verify=tls)


def _read_path(rng: random.Random, campaign_ids: list[int]) -> tuple[str, dict | None]:
    campaign_id = rng.choice(campaign_ids)
    if rng.random() < 0.5:
        return f"/campaigns/{campaign_id}", None
    return f"/campaigns/{campaign_id}/realizations", {"limit": 50}


async def _reader(
    client: httpx.AsyncClient, campaign_ids: list[int], start_at: float, stop_at: float, report: LoadReport
) -> None:
    rng = random.Random()
    while time.monotonic() < stop_at:
        path, params = (report.floor_url, None) if report.floor_url else _read_path(rng, campaign_ids)
        started = time.perf_counter()
        counted = time.monotonic() >= start_at
        try:
            answer = await client.get(path, params=params)
        except httpx.HTTPError as error:
            report.errors.append(f"GET {path}: {type(error).__name__}: {error}")
            continue
        if answer.status_code == 503 and "Retry-After" in answer.headers:
            report.busy += 1
            await asyncio.sleep(float(answer.headers["Retry-After"]))
            continue
        if counted:
            report.read_latencies_s.append(time.perf_counter() - started)
        if answer.status_code != 200:
            report.errors.append(f"GET {path}: {answer.status_code} {answer.text[:200]}")


async def _user(
    client: httpx.AsyncClient, campaign_ids: list[int], start_at: float, stop_at: float, report: LoadReport
) -> None:
    """One user of the open loop: a refresh every ``report.open_loop_period_s``, latency counted from when it was due."""
    period = report.open_loop_period_s or 1.0
    rng = random.Random()
    due = time.monotonic() + rng.uniform(0, period)
    while due < stop_at:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        path, params = (report.floor_url, None) if report.floor_url else _read_path(rng, campaign_ids)
        try:
            answer = await client.get(path, params=params)
        except httpx.HTTPError as error:
            report.errors.append(f"GET {path}: {type(error).__name__}: {error}")
        else:
            if answer.status_code == 503 and "Retry-After" in answer.headers:
                report.busy += 1
            if due >= start_at:
                report.read_latencies_s.append(time.monotonic() - due)
            if answer.status_code != 200:
                report.errors.append(f"GET {path}: {answer.status_code} {answer.text[:200]}")
        due += period


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and its children (uvicorn's worker processes)."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def _cpu_meter(pid: int, start_at: float, stop_at: float, report: LoadReport) -> None:
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    here = psutil.Process()
    before, before_here = _cpu_seconds(pid), sum(here.cpu_times()[:2])
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    report.server_cpu_s = _cpu_seconds(pid) - before
    report.readers_cpu_s = sum(here.cpu_times()[:2]) - before_here


async def _readers(
    api_url: str,
    token: str,
    campaign_ids: list[int],
    clients: int,
    warmup_s: float,
    report: LoadReport,
    server_pid: int | None = None,
) -> None:
    """Run the readers for ``warmup_s`` + ``report.duration_s`` seconds; count the requests after the warm-up."""
    reader = _reader if report.open_loop_period_s is None else _user
    tls = ssl.create_default_context()
    connections = [_client(api_url, token, tls) for _ in range(clients)]  # made before any clock starts
    try:
        start_at = time.monotonic() + warmup_s
        stop_at = start_at + report.duration_s
        meter = [_cpu_meter(server_pid, start_at, stop_at, report)] if server_pid is not None else []
        await asyncio.gather(
            *(reader(client, campaign_ids, start_at, stop_at, report) for client in connections), *meter
        )
    finally:
        for client in connections:
            await client.aclose()


# wrk's script: each request drawn at random from the prepared ones; at the end, wrk's figures as one JSON object.
WRK_SCRIPT = """
local paths = {%(paths)s}
local headers = {%(headers)s}
local prepared = {}

function init(args)
  for i, path in ipairs(paths) do prepared[i] = wrk.format("GET", path, headers) end
end

function request()
  return prepared[math.random(#prepared)]
end

function done(summary, latency, requests)
  local errors = summary.errors
  local out = io.open(%(summary)s, "w")
  out:write(string.format(
    '{"requests": %%d, "duration_us": %%d, "errors": {"connect": %%d, "read": %%d, "write": %%d, "status": %%d, '
    .. '"timeout": %%d}, "latency_us": {"p50": %%d, "p95": %%d, "p99": %%d, "mean": %%.1f}}',
    summary.requests, summary.duration, errors.connect, errors.read, errors.write, errors.status, errors.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.mean))
  out:close()
end
"""


def _run_wrk(url: str, script: Path, clients: int, seconds: float, log: Path) -> float:
    """Run wrk (one thread, ``clients`` connections) for ``seconds`` (whole); return its CPU time (user + system), s."""
    with log.open("w") as output:  # --timeout: the Python readers' 60 s (wrk's own is 2 s)
        process = subprocess.Popen(
            ["wrk", "-t1", f"-c{clients}", f"-d{seconds:.0f}s", "--timeout", "60s", "-s", str(script), url],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        _, status, usage = os.wait4(process.pid, 0)  # wait4: the rusage of wrk alone
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"wrk exited with {process.returncode}: {log.read_text()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def _wrk_readers(
    api_url: str,
    token: str,
    campaign_ids: list[int],
    clients: int,
    warmup_s: float,
    report: LoadReport,
    server_pid: int | None = None,
) -> None:
    """The closed loop run by wrk: ``warmup_s`` seconds discarded, then ``report.duration_s`` counted."""
    if report.floor_url:
        paths, headers = [urlsplit(report.floor_url).path], {}
    else:
        prefix = urlsplit(api_url).path
        paths = [
            path
            for campaign_id in campaign_ids
            for path in (f"{prefix}/campaigns/{campaign_id}", f"{prefix}/campaigns/{campaign_id}/realizations?limit=50")
        ]  # drawn uniformly: a random campaign, status or page half and half, as _read_path
        headers = {"Authorization": f"Bearer {token}"}
    with tempfile.TemporaryDirectory(prefix="mapcampaign-wrk-") as folder:
        script, summary, log = Path(folder) / "reads.lua", Path(folder) / "summary.json", Path(folder) / "wrk.log"
        script.write_text(
            WRK_SCRIPT
            % {
                "paths": ", ".join(json.dumps(path) for path in paths),
                "headers": ", ".join(f"[{json.dumps(name)}] = {json.dumps(value)}" for name, value in headers.items()),
                "summary": json.dumps(str(summary)),
            }
        )
        if warmup_s > 0:
            _run_wrk(api_url, script, clients, warmup_s, log)
        server_before = _cpu_seconds(server_pid) if server_pid is not None else 0.0
        report.readers_cpu_s = _run_wrk(api_url, script, clients, report.duration_s, log)
        if server_pid is not None:
            report.server_cpu_s = _cpu_seconds(server_pid) - server_before
        figures = json.loads(summary.read_text())
    latency_us = figures["latency_us"]
    counted = figures["requests"] > 0
    report.wrk_reads = {
        "count": figures["requests"],
        **{f"{name}_ms": latency_us[name] / 1e3 if counted else None for name in ("p50", "p95", "p99")},
    }
    what = report.floor_url or "reads"
    for kind, count in figures["errors"].items():  # one entry a failed request, as from the Python readers
        label = "answer with status > 399" if kind == "status" else f"{kind} error"
        report.errors += [f"GET {what} (wrk): {label}"] * count


def protocol_worker(args: tuple[str, str, str, float, float, int]) -> dict:
    """One worker process: claim and report until ``stop_at``, counting calls from ``start_at`` (wall-clock
    times shared across processes)."""
    api_url, token, name, start_at, stop_at, seed = args
    rng = random.Random(seed)
    latencies: list[float] = []
    errors: list[str] = []
    successes: list[tuple[int, int]] = []
    claims = 0
    busy = 0
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:

        def call(path: str, body: dict) -> dict | None:
            nonlocal busy
            started = time.perf_counter()
            try:
                answer = client.post(path, json=body)
                while answer.status_code == 503 and "Retry-After" in answer.headers:  # as the real worker does
                    busy += 1
                    time.sleep(float(answer.headers["Retry-After"]))
                    answer = client.post(path, json=body)
            except httpx.HTTPError as error:
                errors.append(f"POST {path}: {type(error).__name__}: {error}")
                return None
            if time.time() >= start_at:
                latencies.append(time.perf_counter() - started)
            if answer.status_code != 200:
                errors.append(f"POST {path}: {answer.status_code} {answer.text[:200]}")
                return None
            return answer.json()

        registered = call("/workers", {"name": name, "site": "local", "host": name, "capacity": 3})
        if registered is None:
            return {"latencies": latencies, "errors": errors, "successes": successes, "claims": claims, "busy": busy}
        worker_id = registered["id"]
        while True:  # at least one round, however late the process started
            answer = call(f"/workers/{worker_id}/claim", {"max_tasks": rng.randint(1, 3)})
            claims += time.time() >= start_at
            tasks = answer["tasks"] if answer else []
            if not tasks:
                time.sleep(0.05)  # an idle worker polls, as the real one does
            for task in tasks:
                task_id = task["task_id"]
                call(f"/tasks/{task_id}/started", {"host": name})
                if task["kind"] == "preprocess":
                    call(
                        f"/tasks/{task_id}/plan-built",
                        {"path": f"/plans/{task_id}", "checksum": "c", "size_bytes": 1, "build_time_s": 0.1},
                    )
                elif (
                    call(f"/tasks/{task_id}/succeeded", {"result": result_for(task["spec"], task["realization"])})
                    is not None
                ):
                    successes.append((task["campaign_id"], task["realization"]))  # all, for the database check
            if time.time() >= stop_at:
                break
    return {"latencies": latencies, "errors": errors, "successes": successes, "claims": claims, "busy": busy}


def run_load(
    api_url: str,
    user_token: str,
    worker_token: str,
    *,
    duration_s: float,
    clients: int = 200,
    workers: int = 4,
    realizations: int = 20_000,
    campaigns: int = 4,
    open_loop_period_s: float | None = None,
    warmup_s: float = 5.0,
    server_pid: int | None = None,
    floor_url: str | None = None,
    client: str = "python",
) -> LoadReport:
    """Create ``campaigns`` campaigns, then load the service for ``warmup_s`` + ``duration_s`` seconds; return
    what happened in the last ``duration_s`` (all accepted results, for the database check).

    ``client``: the readers, "python" (asyncio tasks here) or "wrk" (closed loop only, whole seconds)."""
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {user_token}"}, timeout=120) as user:
        campaign_ids = []
        for number in range(campaigns):
            answer = user.post(
                "/campaigns", json=spec_data(name=f"load {number}", realizations=realizations // campaigns)
            )
            answer.raise_for_status()
            campaign_ids.append(answer.json()["id"])
    report = LoadReport(
        duration_s=duration_s,
        clients=clients,
        workers=workers,
        open_loop_period_s=open_loop_period_s,
        warmup_s=warmup_s,
        floor_url=floor_url,
        client=client,
    )

    def readers() -> None:
        if client == "wrk":
            _wrk_readers(api_url, user_token, campaign_ids, clients, warmup_s, report, server_pid)
        else:
            asyncio.run(_readers(api_url, user_token, campaign_ids, clients, warmup_s, report, server_pid))

    start_wall = time.time() + warmup_s
    stop_wall = start_wall + duration_s
    if workers == 0:
        readers()
        return report
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pending = pool.map_async(
            protocol_worker,
            [(api_url, worker_token, f"load-{n}", start_wall, stop_wall, n) for n in range(workers)],
        )
        readers()
        for outcome in pending.get(timeout=warmup_s + duration_s + 300):
            report.worker_latencies_s += outcome["latencies"]
            report.errors += outcome["errors"]
            report.reported_successes += [tuple(pair) for pair in outcome["successes"]]
            report.claims += outcome["claims"]
            report.busy += outcome["busy"]
    return report


def check_database(database_url: str, report: LoadReport) -> list[str]:
    """Problems in the stored state: a lost or doubled result (empty when all is well)."""
    problems = []
    with psycopg.connect(database_url, autocommit=True) as connection:
        stored = {
            (campaign, index)
            for campaign, index in connection.execute(
                "SELECT campaign_id, index FROM realizations WHERE state = 'succeeded' AND result IS NOT NULL"
            )
        }
        twice = connection.execute(
            "SELECT realization_id FROM attempts WHERE ended_at IS NOT NULL AND failure_class IS NULL "
            "GROUP BY realization_id HAVING count(*) > 1"
        ).fetchall()
    reported = set(report.reported_successes)
    if len(reported) != len(report.reported_successes):
        problems.append("a realisation was reported succeeded twice and accepted twice")
    if not reported <= stored:
        problems.append(f"{len(reported - stored)} accepted results are not stored (lost)")
    if twice:
        problems.append(f"{len(twice)} realisations have two successful attempts")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (the requirement: 60)")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4, help="protocol-level workers (0: readers only)")
    parser.add_argument("--realizations", type=int, default=20_000, help="queued at the start, over 4 campaigns")
    parser.add_argument("--open-loop", action="store_true", help="users refreshing every --period s (not closed loop)")
    parser.add_argument("--period", type=float, default=4.0, help="open loop: seconds between a user's refreshes")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the clock starts")
    parser.add_argument("--api-workers", type=int, default=1, help="API processes (mapcampaign serve --workers)")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="readers ask GET /healthz (no token, one connection): a small request's cost on this stack",
    )
    parser.add_argument(
        "--client",
        choices=("python", "wrk"),
        default="python",
        help="the readers: asyncio tasks in this process, or wrk (C, closed loop only, whole seconds)",
    )
    add_json_option(parser)
    options = parser.parse_args()
    if options.client == "wrk":
        if options.open_loop:
            parser.error("--client wrk: closed loop only (wrk sends a request as soon as the last is answered)")
        if not (options.duration.is_integer() and options.warmup.is_integer()):
            parser.error("--client wrk: --duration and --warmup in whole seconds (wrk's -d takes whole seconds)")
        if shutil.which("wrk") is None:
            parser.error("wrk not found on PATH: apt-get install wrk (scripts/install-system-deps installs it)")

    pg_url = create_pg_database("mapcampaign_load")
    try:
        with tempfile.TemporaryDirectory(prefix="mapcampaign-load-") as folder:
            service = start_live_service(
                Path(folder) / "service", pg_url, serve_args=("--workers", str(options.api_workers))
            )
            try:
                report = run_load(
                    service.api_url,
                    service.user_token,
                    service.worker_token,
                    duration_s=options.duration,
                    clients=options.clients,
                    workers=options.workers,
                    realizations=options.realizations,
                    open_loop_period_s=options.period if options.open_loop else None,
                    warmup_s=options.warmup,
                    server_pid=service.process.pid,
                    floor_url=f"{service.url}/healthz" if options.floor else None,
                    client=options.client,
                )
                problems = check_database(pg_url, report)
            finally:
                service.stop()
    finally:
        drop_pg_database(pg_url)
    for line in report.lines():
        print(line)
    for error in report.errors[:10]:
        print("error:", error)
    print("database check:", "; ".join(problems) if problems else "every accepted result stored once, none twice")
    write_json(options.json, {**report.figures(), "api_workers": options.api_workers, "database_problems": problems})
    sys.exit(1 if report.errors or problems else 0)


if __name__ == "__main__":
    main()
