"""What the agent's parts share: its settings, client, the tasks it holds, the events that wake its threads."""

from __future__ import annotations

import concurrent.futures
import queue
import socket
import sys
import threading
import uuid
from typing import Any

from schemas.api import HeartbeatAnswer
from worker.client import ServiceClient
from worker.clock import SYSTEM_CLOCK, Clock
from worker.keep import SiteStore, store_root
from worker.layout import SiteLayout
from worker.settings import WorkerSettings
from worker.site import SiteConfig
from worker.tasks import TaskContext, TaskRun

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class AgentState:
    """The fields every part of :class:`worker.agent.Agent` reads; each part's methods live in its own module."""

    def __init__(self, settings: WorkerSettings, site: SiteConfig, token: str, *, clock: Clock = SYSTEM_CLOCK):
        self.settings = settings
        self.site = site
        self.clock = clock
        self.layout = SiteLayout.for_site(site, settings.data_dir)
        self.name = settings.worker_name(site.name)
        self.host = socket.gethostname()
        self.python = site.python or sys.executable
        self.run_id = uuid.uuid4().hex[:12]
        self.client = ServiceClient(
            settings.api_url, token, timeout_s=settings.timeout_s, retry_s=settings.report_retry_s
        )
        self.site_store = (
            SiteStore(store_root(site, self.layout.root), site.name, interval_s=site.products.sums_interval_s, clock=clock)
            if site.products.maps == "keep"
            else None
        )
        self.context = TaskContext(
            site=site,
            layout=self.layout,
            python=self.python,
            marker_prefix=f"{site.name}:{self.name}:{self.run_id}",
            client=self.client,
            keep_work=settings.keep_work,
            clock=clock,
            site_store=self.site_store,
        )
        self.worker_id: int | None = None
        self.runs: dict[str, TaskRun] = {}
        self.detached: list[TaskRun] = []  # reported, but Parsl may still hold a slot for them
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.quit = threading.Event()
        self.stop_signals = 0
        self.drain_deadline: float | None = None  # clock.monotonic()
        self.stopped_tasks = False
        self.exit_code = EXIT_OK
        self.lease_s: float | None = None
        self.heartbeat_answers: queue.SimpleQueue[HeartbeatAnswer] = queue.SimpleQueue()  # heartbeat thread -> loop
        self.launch_failures_in_a_row = 0
        self.claims_paused_until = 0.0  # clock.monotonic()
        self.fetches_in_flight: set[tuple[int, int, str]] = set()  # kept files being sent on the service's request
        self.reporters = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="report")
        self.dfk: Any = None
        self.executor: Any = None
        self.app: Any = None

    @property
    def draining(self) -> bool:
        return self.drain_deadline is not None
