"""Run a real ``mapcampaign worker`` against a live service in tests (and the dispatch benchmark).

Specs are tiny (nside 8-16, minutes to a day of 10 Hz data) so a realisation
takes seconds; ``long_spec`` takes several seconds inside the map-maker, long
enough to kill, cancel or time out in the middle.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support.live_service import LiveService, mapcampaign_command
from tests.support.processes import SCOPE, SCOPE_VAR, task_processes

REPO = Path(__file__).resolve().parents[2]


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


def running_task_processes(
    worker: WorkerProcess, minimum: int = 3, kind: str = "realize"
) -> list[tuple[int, str, str]] | None:
    """The worker's processes of ``kind`` tasks once an MPI job is up (mpiexec, proxy, ranks), else None."""
    found = [entry for entry in task_processes(worker.marker_prefix) if f":{kind}-" in entry[1]]
    ranks = [entry for entry in found if "mapmaker" in entry[2] and "mpiexec" not in entry[2]]
    return found if len(found) >= minimum and ranks else None


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
