"""What the benchmarks share with the tests: a live service, PostgreSQL databases, specs, workers, JSON output.

The benchmarks run from the environment ``scripts/demo`` makes, which has no test
tools, so this module imports none; ``tests/support`` imports these helpers from here.

* :func:`start_live_service`: a real ``mapcampaign serve`` in a subprocess, on a free
  port, with its own data folder (embedded SQLite, or a PostgreSQL URL it migrates);
* :func:`create_pg_database` / :func:`drop_pg_database`: a fresh, uniquely named
  database on 127.0.0.1:5432 (user postgres, trust auth);
* :func:`spec_data`, :func:`result_for`, :func:`tiny_spec`, :func:`long_spec`:
  campaign specs and the result a worker would report;
* :func:`start_worker`, :func:`write_site`, :class:`Api`: a real ``mapcampaign
  worker`` on the local site and the user side of the REST API;
* :func:`add_json_option` / :func:`write_json`: every benchmark's ``--json FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from schemas.files import atomic_write_json
from schemas.io import example_spec_path, load_spec
from schemas.programs import MARKER_VARIABLE
from schemas.spec import CampaignSpec, scan_key, spec_hash

# Claims of the service benchmarks are never run or reported: a lease longer than any drain keeps the reaper
# from handing them out again mid-benchmark (which would count a realisation twice) on a slow or busy machine.
DRAIN_LEASE_S = 86_400

REPO = Path(__file__).resolve().parents[1]
MAPCAMPAIGN = Path(sys.executable).with_name("mapcampaign")

# --------------------------------------------------------------------------- JSON output


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json FILE``: also write the figures to FILE as one JSON object; ``--json`` or ``--json -`` alone
    prints only that JSON on stdout."""
    parser.add_argument(
        "--json", nargs="?", const="-", default=None, metavar="FILE",
        help="also write the figures to FILE as JSON (no FILE, or -: print only the JSON on stdout)",
    )  # fmt: skip


def write_json(destination: str | None, figures: dict[str, Any]) -> None:
    """Write ``figures`` where ``--json`` says: a file, stdout for ``-``, nowhere for None."""
    if destination is None:
        return
    if destination == "-":
        print(json.dumps(figures, indent=1))
    else:
        atomic_write_json(Path(destination), figures)


# --------------------------------------------------------------------------- MPI runs


def run_ranks(ranks: int, *args: str, timeout: float = 3600) -> str:
    """Run ``python -m mpi4py ARGS`` on ``ranks`` ranks of this environment's ``mpiexec`` (from the repository);
    its standard output. A failure raises with the tail of its standard error."""
    command = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(ranks), sys.executable, "-m", "mpi4py", *args]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr[-3000:]}")
    return completed.stdout


def run_ranks_json(ranks: int, *args: str, timeout: float = 3600) -> dict[str, Any]:
    """:func:`run_ranks`, returning the JSON object the last line prints (a benchmark's ``--worker`` half)."""
    return json.loads(run_ranks(ranks, *args, timeout=timeout).strip().splitlines()[-1])


def print_json_on_root(figures: dict[str, Any] | None) -> None:
    """The ``--worker`` half's output under mpiexec: rank 0 prints ``figures`` as the one JSON line that
    :func:`run_ranks_json` reads."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(figures))


# --------------------------------------------------------------------------- PostgreSQL databases

PG_ADMIN_URL = os.environ.get("MAPCAMPAIGN_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_BASE_URL = PG_ADMIN_URL.rsplit("/", 1)[0]


class DatabaseUnreachable(RuntimeError):
    pass


def _admin_connection() -> psycopg.Connection:
    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        raise DatabaseUnreachable(
            f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {error}. Start it with "
            "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`"
        ) from None


def create_pg_database(prefix: str = "mapcampaign_test") -> str:
    """Create an empty database with a unique name; return its URL."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with _admin_connection() as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_BASE_URL}/{name}"


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with _admin_connection() as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------- a live service


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mapcampaign_command(*args: str) -> list[str]:
    # The console script when the installed one runs this tree's CLI (an install older than the move of the
    # CLI into mapcampaign/cli/ still names service.cli), else the same entry point through the interpreter.
    if MAPCAMPAIGN.exists() and "mapcampaign.cli" in MAPCAMPAIGN.read_text(errors="replace"):
        return [str(MAPCAMPAIGN), *args]
    return [sys.executable, "-m", "mapcampaign", *args]


@dataclass
class LiveService:
    url: str
    data_dir: Path
    database_url: str | None
    user_token: str
    worker_token: str
    env: dict[str, str]
    process: subprocess.Popen
    log_path: Path
    extra_tokens: dict[str, str] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return self.url + "/api/v1"

    def client(self, token: str | None = None, *, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout)

    def run_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            mapcampaign_command(*args), env=self.env, capture_output=True, text=True, check=check, timeout=120
        )

    def create_token(self, user: str, *, worker: bool = False) -> str:
        """A new token made with ``mapcampaign token create`` against the service's database."""
        args = ["token", "create", "--user", user] + (["--worker"] if worker else [])
        return self.run_cli(*args).stdout.strip()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def service_env(data_dir: Path, port: int, database_url: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAPCAMPAIGN_")}
    env.update(
        {
            "MAPCAMPAIGN_DATA_DIR": str(data_dir),
            "MAPCAMPAIGN_HOST": "127.0.0.1",
            "MAPCAMPAIGN_PORT": str(port),
            "MAPCAMPAIGN_LOG_LEVEL": "warning",
        }
    )
    if database_url is not None:
        env["MAPCAMPAIGN_DATABASE_URL"] = database_url
    env.update(extra or {})
    return env


# `mapcampaign db upgrade`, then `token create` for user `local`, then the same with `--worker`: the CLI's own
# commands, in one interpreter; a command that fails ends the script with its exit code.
PREPARE_DATABASE = """
import sys
from mapcampaign.cli import app
for args in (["db", "upgrade"], ["token", "create", "--user", "local"], ["token", "create", "--user", "local", "--worker"]):
    code = app(args, prog_name="mapcampaign", standalone_mode=False)
    if code:
        sys.exit(f"mapcampaign {' '.join(args)} exited {code}")
"""


def start_live_service(
    data_dir: Path,
    database_url: str | None = None,
    *,
    env: dict[str, str] | None = None,
    startup_timeout: float = 60.0,
    serve_args: tuple[str, ...] = (),
) -> LiveService:
    """Start ``mapcampaign serve`` and wait until /healthz answers.

    ``database_url=None`` is the embedded default (SQLite in ``data_dir``, tokens made on first start);
    any other URL is migrated with ``mapcampaign db upgrade`` and gets user ``local`` tokens from
    ``mapcampaign token create``. ``serve_args`` are added to ``mapcampaign serve`` (``--workers 2``).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    environment = service_env(data_dir, port, database_url, env)
    user_token = worker_token = ""
    if database_url is not None:
        # One interpreter runs the three CLI commands (a start of the CLI costs about a second, and the suite
        # starts tens of such services); each prints its token as its one line on stdout.
        done = subprocess.run([sys.executable, "-c", PREPARE_DATABASE], env=environment, capture_output=True, text=True,
                              timeout=120, check=False, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"mapcampaign db upgrade / token create failed: {done.stderr}")
        user_token, worker_token = done.stdout.split()
    log_path = data_dir / f"serve-{port}.log"
    with open(log_path, "wb") as log_file:  # the child keeps its own descriptor of the log
        process = subprocess.Popen(
            mapcampaign_command("serve", *serve_args),
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    service = LiveService(
        url=url,
        data_dir=data_dir,
        database_url=database_url,
        user_token=user_token,
        worker_token=worker_token,
        env=environment,
        process=process,
        log_path=log_path,
    )
    deadline = time.monotonic() + startup_timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"mapcampaign serve exited with {process.returncode}:\n{service.log_tail()}")
        if is_healthy(url):
            break
        if time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"mapcampaign serve did not answer within {startup_timeout} s:\n{service.log_tail()}")
        time.sleep(0.1)
    if database_url is None:
        tokens = data_dir / "tokens"
        service.user_token = (tokens / "local-user.token").read_text().strip()
        service.worker_token = (tokens / "local-worker.token").read_text().strip()
    return service


def is_healthy(url: str) -> bool:
    """``GET url/healthz`` answers 200 (False while the service is not up or not listening)."""
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# --------------------------------------------------------------------------- specs and results


def spec_data(**changes: Any) -> dict[str, Any]:
    """The demo spec as JSON data, with top-level or dotted changes (``"noise.f_knee_hz": 0.1``)."""
    data = load_spec(example_spec_path("demo")).model_dump(mode="json")
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    return data


def result_for(spec: dict[str, Any], index: int, products: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    parsed = CampaignSpec.model_validate(spec)
    return {
        "realization": index,
        "spec_hash": spec_hash(parsed),
        "scan_key": scan_key(parsed),
        "ranks": parsed.resources.ranks,
        "threads_per_rank": 1,
        "samples": 1000,
        "observed_pixels": 100,
        "cut_pixels": 0,
        "iterations": 3,
        "converged": True,
        "residual_history": [1.0, 1e-3, 1e-7],
        "timing": {
            "calc": {"max": 1.0, "mean": 0.9},
            "comm": {"max": 0.1, "mean": 0.1},
            "io": {"max": 0.0, "mean": 0.0},
            "total": 1.2,
        },
        "communication": {
            "strategy": "alltoallv",
            "requested": "auto",
            "bytes_per_iteration": {"max": 10, "mean": 8},
            "messages_per_iteration": {"max": 1, "mean": 1},
            "reductions": 4,
            "bytes_counted": "payload bytes sent",
        },
        "peak_memory_mb": {"max": 100.0, "mean": 90.0},
        "preconditioner": {"name": "block-diagonal", "why": "as the spec says", "timed": False},
        "rng_scheme": "philox(seed, realization, detector, interval)",
        "versions": {"mapmaker": "0.1.0"},
        "products": products or [],
    }


# --------------------------------------------------------------------------- task processes and workers


# Workers started by this pytest process carry this in their environment, and so does every process of
# their tasks: two test sessions on one machine (two checkouts) use the same worker names, and must not
# count each other's tasks as their own.
SCOPE_VAR = "MAPCAMPAIGN_TEST_SCOPE"
SCOPE = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _ours(environment: dict[str, str]) -> bool:
    """A process without the scope variable (an MPI launcher that dropped it) is counted, to be safe."""
    return environment.get(SCOPE_VAR, SCOPE) == SCOPE


def task_processes(prefix: str) -> list[tuple[int, str, str]]:
    """Live (not zombie) processes whose task marker starts with ``prefix``: (pid, marker, command line)."""
    found = []
    for process in psutil.process_iter():
        try:
            environment = process.environ()
            marker = environment.get(MARKER_VARIABLE)
            if marker and marker.startswith(prefix) and _ours(environment) and process.status() != psutil.STATUS_ZOMBIE:
                found.append((process.pid, marker, " ".join(process.cmdline())[:200]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def wait_for_no_task_processes(prefix: str, timeout: float = 10.0) -> list[tuple[int, str, str]]:
    """Survivors still alive after ``timeout`` seconds (empty when every process of the tasks is gone)."""
    deadline = time.monotonic() + timeout
    while True:
        survivors = task_processes(prefix)
        if not survivors or time.monotonic() > deadline:
            return survivors
        time.sleep(0.2)


def tiny_spec(name: str = "tiny", **changes: Any) -> dict[str, Any]:
    """10 minutes of 10 Hz data from 4 detectors at nside 8, 2 ranks: about a second in the map-maker."""
    spec: dict[str, Any] = {
        "name": name,
        "realizations": 4,
        "seed": 7,
        "max_attempts": 3,
        "scan": {
            "kind": "satellite",
            "duration_s": 600.0,
            "chunk_s": 60.0,
            "spin_period_s": 60.0,
            "precession_period_s": 600.0,
            "drift_deg_per_day": 720.0,
        },
        "focal_plane": {
            "sample_rate_hz": 10.0,
            "detectors": [
                {"name": "A", "offset_x_deg": 0.5, "pol_angle_deg": 0.0},
                {"name": "B", "offset_x_deg": 0.5, "pol_angle_deg": 90.0},
                {"name": "C", "offset_x_deg": -0.5, "pol_angle_deg": 45.0},
                {"name": "D", "offset_x_deg": -0.5, "pol_angle_deg": 135.0},
            ],
        },
        "pixelization": {"nside": 8},
        "sky": {"kind": "cmb", "seed": 1},
        "noise": {"net_k_sqrt_s": 100e-6},
        "resources": {"ranks": 2, "walltime_s": 300.0},
    }
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = spec
        for part in parents:
            node = node[part]
        node[last] = value
    return spec


def long_spec(name: str = "long", **changes: Any) -> dict[str, Any]:
    """A day of data at nside 16 with 1/f noise: tens of PCG iterations, several seconds in the map-maker."""
    base = {
        "scan.duration_s": 86_400.0,
        "scan.chunk_s": 3_600.0,
        "scan.precession_period_s": 3_600.0,
        "pixelization.nside": 16,
        "noise.f_knee_hz": 0.1,
    }
    return tiny_spec(name, **{**base, **changes})


def write_site(
    path: Path,
    *,
    name: str = "local",
    max_tasks: int = 2,
    kill_grace_s: float = 1.0,
    liveness_timeout_s: float = 4.0,
    sky_root: Path | None = None,
    data_dir: Path | None = None,
) -> Path:
    lines = [f'name = "{name}"', f"max_tasks = {max_tasks}"]
    if sky_root is not None:
        lines.append(f'sky_root = "{sky_root}"')
    if data_dir is not None:
        lines.append(f'data_dir = "{data_dir}"')
    lines += [
        "[provider]",
        'kind = "local"',
        "[executor]",
        # A worker pool whose interchange is gone (worker killed) exits within seconds.
        "heartbeat_period_s = 1",
        "heartbeat_threshold_s = 5",
        "strategy_period_s = 0.5",  # the block starts half a second after the worker, not five
        "[runner]",
        f"kill_grace_s = {kill_grace_s}",
        f"liveness_timeout_s = {liveness_timeout_s}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class WorkerProcess:
    name: str
    site: str
    process: subprocess.Popen
    log_path: Path
    site_data: Path
    descendants: list[psutil.Process] = field(default_factory=list)

    @property
    def marker_prefix(self) -> str:
        return f"{self.site}:{self.name}:"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def remember_descendants(self) -> list[psutil.Process]:
        """The worker's process tree now (interchange, block, pool, runners, ranks)."""
        try:
            self.descendants = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            self.descendants = []
        return self.descendants

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 120) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            raise AssertionError(f"worker {self.name} did not stop within {timeout} s:\n{self.log_tail()}") from None

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def start_worker(
    service: LiveService,
    site_file: Path,
    name: str,
    *,
    site: str = "local",
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
) -> WorkerProcess:
    """``mapcampaign worker --site SITE`` in a session of its own, talking to ``service`` with its worker token."""
    log_dir = log_dir or service.data_dir
    token_file = log_dir / f"{name}.token"
    token_file.write_text(service.worker_token + "\n")
    token_file.chmod(0o600)
    environment = {
        **service.env,
        "MAPCAMPAIGN_SERVER": service.url,
        "MAPCAMPAIGN_TOKEN_FILE": str(token_file),
        "MAPCAMPAIGN_WORKER_POLL_S": "0.3",
        "MAPCAMPAIGN_WORKER_HEARTBEAT_S": "1",
        "MAPCAMPAIGN_LOG_LEVEL": "info",
        SCOPE_VAR: SCOPE,
        **(env or {}),
    }
    log_path = log_dir / f"worker-{name}.log"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            mapcampaign_command("worker", "--site", str(site_file), "--name", name),
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    return WorkerProcess(
        name=name, site=site, process=process, log_path=log_path, site_data=service.data_dir / "sites" / site
    )


def wait_for(condition: Callable[[], Any], timeout: float, what: str, *, worker: WorkerProcess | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if worker is not None and worker.process.poll() is not None:
            raise AssertionError(
                f"worker exited ({worker.process.returncode}) while waiting for {what}:\n{worker.log_tail()}"
            )
        if time.monotonic() > deadline:
            tail = f"\nworker log:\n{worker.log_tail()}" if worker is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{tail}")
        time.sleep(0.2)


class Api:
    """The user side of the service, through its REST API."""

    def __init__(self, service: LiveService):
        self.service = service
        self.client: httpx.Client = service.client(service.user_token)

    def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        answer = self.client.post("/campaigns", json=spec)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def campaign(self, campaign_id: int) -> dict[str, Any]:
        answer = self.client.get(f"/campaigns/{campaign_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def realization(self, campaign_id: int, index: int) -> dict[str, Any]:
        answer = self.client.get(f"/campaigns/{campaign_id}/realizations/{index}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def realizations(self, campaign_id: int) -> list[dict[str, Any]]:
        return [self.realization(campaign_id, n) for n in range(self.campaign(campaign_id)["realizations"])]

    def plans(self) -> list[dict[str, Any]]:
        return self.client.get("/plans", params={"limit": 500}).json()["items"]

    def events(self) -> list[dict[str, Any]]:
        return self.client.get("/events/log", params={"limit": 500}).json()

    def state(self, campaign_id: int) -> str | None:
        """The campaign's state; None while the service answers 503 (its database restarting), as a poller retries."""
        answer = self.client.get(f"/campaigns/{campaign_id}")
        if answer.status_code == 503:
            return None
        assert answer.status_code == 200, answer.text
        return answer.json()["state"]

    def wait_state(
        self, campaign_id: int, states: set[str], timeout: float, worker: WorkerProcess | None = None
    ) -> dict:
        wait_for(
            lambda: self.state(campaign_id) in states, timeout, f"campaign {campaign_id} in {states}", worker=worker
        )
        return self.campaign(campaign_id)

    def close(self) -> None:
        self.client.close()
