"""The embedded default as one unit: the API (with its dashboard) and one local worker, as child processes.

``mapcampaign up`` and ``mapcampaign demo`` start it. Both children run in their own sessions, so a
Ctrl-C in the terminal reaches only this process, which then stops them in order: the worker first
(SIGTERM: it stops claiming, lets running tasks finish for a few seconds, then ends their MPI
processes and hands them back), then the API. A child that does not stop in time is killed with its
whole process group.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

import typer

from mapcampaign.cli._client import local_server_url, up_record_path
from mapcampaign.cli._utilities import fail
from worker.pdeathsig import PARENT_VARIABLE

if TYPE_CHECKING:
    from service.config import Settings

# Ctrl-C should stop the stack in seconds, not after the worker's production drain of 300 s.
DEFAULT_DRAIN_S = "5"
SERVE_STOP_S = 20.0


class StackInterrupted(Exception):
    """SIGINT or SIGTERM arrived: stop the stack."""


def local_site_toml(max_tasks: int) -> str:
    """The site of ``up``: this machine, no scheduler (the same choices as deploy/sites/local.toml, which an
    installed package does not carry)."""
    return f"""# Written by `mapcampaign up`: this machine, Parsl LocalProvider + MPIExecutor + the pip mpich's mpiexec.
name = "local"
max_tasks = {max_tasks}

[provider]
kind = "local"
init_blocks = 1
min_blocks = 1
max_blocks = 1

[mpi]
launcher = "mpiexec"

[executor]
heartbeat_period_s = 30
heartbeat_threshold_s = 120
strategy_period_s = 1
"""


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class LocalStack:
    def __init__(self, settings: Settings, *, site: Path | None = None, max_tasks: int | None = None):
        self.settings = settings
        self.url = local_server_url(settings.host, settings.port)
        self.data_dir = settings.data_dir
        self.log_dir = settings.data_dir / "logs"
        self.site = site
        self.max_tasks = max_tasks or max(1, (os.cpu_count() or 2) // 2)
        self.serve: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._lock: IO[str] | None = None  # <data dir>/up/up.lock, held (flock) for the process lifetime
        self._previous_handlers: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self._stopping:
            self._stopping = True
            raise StackInterrupted(signal.Signals(signum).name)
        # A second signal while stopping: skip the worker's drain.
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)

    # ------------------------------------------------------------------ start

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["MAPCAMPAIGN_DATA_DIR"] = str(self.data_dir)
        env["MAPCAMPAIGN_HOST"] = self.settings.host
        env["MAPCAMPAIGN_PORT"] = str(self.settings.port)
        env.setdefault("MAPCAMPAIGN_LOG_LEVEL", "warning")
        env["MAPCAMPAIGN_SERVER"] = self.url
        env.setdefault("MAPCAMPAIGN_WORKER_DRAIN_S", DEFAULT_DRAIN_S)
        env.pop("MAPCAMPAIGN_TOKEN_FILE", None)  # a user's token file must not become the worker's
        return env

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 -- the child keeps it open; ours closes below
        try:
            # Through worker.pdeathsig: if `up` itself is SIGKILLed (no chance to stop its children),
            # the kernel sends them SIGTERM, so the API and the worker (which drains) do not live on.
            return subprocess.Popen(
                [sys.executable, "-m", "worker.pdeathsig", sys.executable, "-m", "mapcampaign.cli", *args],
                env={**self._environment(), PARENT_VARIABLE: str(os.getpid())},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def user_token_file(self) -> Path:
        return self.settings.tokens_dir / "local-user.token"

    @property
    def worker_token_file(self) -> Path:
        return self.settings.tokens_dir / "local-worker.token"

    def lock_data_folder(self) -> None:
        """Hold ``<data dir>/up/up.lock`` (an exclusive flock) until this process ends, or exit 2 naming the
        ``up`` that holds it: two services on one SQLite file and one products folder would step on each other.

        The kernel releases a flock when its holder dies, however it dies, so a stale lock cannot remain;
        the file's text (pid and address of the holder) is only what the message reports.
        """
        path = self.data_dir / "up" / "up.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 -- held open for the process lifetime; not inherited (O_CLOEXEC)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            try:
                other = json.loads(holder)
                who = f"pid {other['pid']}, {other['url']}"
            except (ValueError, KeyError, TypeError):
                who = "starting"
            fail(
                f"another `mapcampaign up` ({who}) is running on the data folder {self.data_dir}",
                hint="use that one (`mapcampaign list` finds it), stop it first, or set MAPCAMPAIGN_DATA_DIR to "
                "another folder",
                code=2,
            )
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "url": self.url}))
        handle.flush()
        self._lock = handle

    def start(self, *, startup_timeout_s: float = 180.0) -> None:
        import httpx

        if not self.settings.embedded:
            fail(
                "`up` runs the embedded default (SQLite in the data folder), but MAPCAMPAIGN_DATABASE_URL is set",
                hint="with a database server run `mapcampaign serve` and `mapcampaign worker --site FILE` apart",
                code=2,
            )
        self.lock_data_folder()
        if not port_is_free(self.settings.host, self.settings.port):
            fail(
                f"{self.settings.host}:{self.settings.port} is taken (is a MapCampaign service already running?)",
                hint="pass --port N (or set MAPCAMPAIGN_PORT) for another port",
                code=2,
            )
        site = self.site
        if site is None:
            site = self.data_dir / "up" / "local-site.toml"
            site.parent.mkdir(parents=True, exist_ok=True)
            site.write_text(local_site_toml(self.max_tasks))
        self.install_signal_handlers()
        self.serve = self._spawn("serve", "serve")
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if self.serve.poll() is not None:
                self.stop()
                fail(f"the API exited with status {self.serve.returncode}:\n{self.log_tail('serve')}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                fail(f"the API did not answer within {startup_timeout_s:.0f} s:\n{self.log_tail('serve')}")
            time.sleep(0.2)
        self.worker = self._spawn("worker", "worker", "--site", str(site), "--token-file", str(self.worker_token_file))
        record = up_record_path(self.data_dir)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"url": self.url, "pid": os.getpid()}))

    def check_children(self) -> None:
        """Fail (after stopping the rest) when the API or the worker has exited on its own."""
        for name, process in (("API", self.serve), ("worker", self.worker)):
            if process is not None and process.poll() is not None:
                log = "serve" if name == "API" else "worker"
                self.stop()
                fail(
                    f"the {name} exited with status {process.returncode}; last lines of {self.log_dir / (log + '.log')}:"
                    f"\n{self.log_tail(log)}"
                )

    def wait(self) -> None:
        """Until SIGINT/SIGTERM (then return) or a child's death (then fail)."""
        try:
            while True:
                self.check_children()
                time.sleep(0.5)
        except StackInterrupted:
            return

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        self._stopping = True
        drain_s = float(self._environment()["MAPCAMPAIGN_WORKER_DRAIN_S"])
        # The worker first: it must report its tasks to a service that is still up.
        _terminate(self.worker, timeout_s=drain_s + 60.0)
        _terminate(self.serve, timeout_s=SERVE_STOP_S)
        self._remove_own_record()
        self.restore_signal_handlers()
        if self._lock is not None:  # last: the folder is free once everything of this up has stopped
            self._lock.close()
            self._lock = None

    def _remove_own_record(self) -> None:
        """Remove the up record only if this process wrote it: another ``up`` on the folder may own it."""
        record = up_record_path(self.data_dir)
        try:
            owner = json.loads(record.read_text()).get("pid")
        except (OSError, ValueError, AttributeError):
            return
        if owner == os.getpid():
            record.unlink(missing_ok=True)


def _terminate(process: subprocess.Popen[bytes] | None, *, timeout_s: float) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        typer.echo(f"process {process.pid} did not stop in {timeout_s:.0f} s: killing its process group", err=True)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: the group holds what it started
        except ProcessLookupError:
            pass
        process.wait(timeout=10)
