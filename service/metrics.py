"""Prometheus metrics at /metrics.

Queue figures (realisations by state, claims, lease expiries) are read from the
database at scrape time, so they are right with several API processes and
across restarts. The request-latency histogram is per process.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.api import API_PREFIX, CAMPAIGN_STATES, REALIZATION_STATES
from schemas.states import PlanState
from service.campaigns.models import Attempt, Campaign, RealizationCount
from service.db import Database
from service.events.models import Event
from service.queue.models import PreprocessingPlan
from service.workers.models import Worker

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class QueueCollector:
    def __init__(self, database: Database):
        self.database = database

    def collect(self):
        with self.database.session(write=False) as session:
            by_state = dict(  # the counts the database's triggers keep, not a scan of every realisation
                session.execute(
                    select(RealizationCount.state, func.sum(RealizationCount.count)).group_by(RealizationCount.state)
                ).all()
            )
            campaigns = dict(session.execute(select(Campaign.state, func.count()).group_by(Campaign.state)).all())
            plans = dict(
                session.execute(select(PreprocessingPlan.state, func.count()).group_by(PreprocessingPlan.state)).all()
            )
            realize_claims = session.scalar(select(func.count()).select_from(Attempt)) or 0
            build_claims = session.scalar(select(func.coalesce(func.sum(PreprocessingPlan.build_number), 0))) or 0
            expiries = dict(
                session.execute(
                    select(Event.plan_id.is_(None), func.count())
                    .where(Event.kind == "lease_expired")
                    .group_by(Event.plan_id.is_(None))
                ).all()
            )
            workers = session.scalar(select(func.count()).select_from(Worker)) or 0
        gauge = GaugeMetricFamily("mapcampaign_realizations", "Realisations by state", labels=["state"])
        for state in REALIZATION_STATES:
            gauge.add_metric([state], int(by_state.get(state, 0)))
        yield gauge
        gauge = GaugeMetricFamily("mapcampaign_campaigns", "Campaigns by state", labels=["state"])
        for state in CAMPAIGN_STATES:
            gauge.add_metric([state], campaigns.get(state, 0))
        yield gauge
        gauge = GaugeMetricFamily("mapcampaign_plans", "Preprocessing plans by state", labels=["state"])
        for state in PlanState:
            gauge.add_metric([state], plans.get(state, 0))
        yield gauge
        counter = CounterMetricFamily("mapcampaign_claims", "Tasks handed out by claim", labels=["kind"])
        counter.add_metric(["realize"], realize_claims)
        counter.add_metric(["preprocess"], int(build_claims))
        yield counter
        counter = CounterMetricFamily(
            "mapcampaign_lease_expiries", "Leases that expired and were reaped", labels=["kind"]
        )
        counter.add_metric(["realize"], expiries.get(True, 0))
        counter.add_metric(["preprocess"], expiries.get(False, 0))
        yield counter
        yield GaugeMetricFamily("mapcampaign_workers", "Registered workers", value=workers)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "mapcampaign_http_request_duration_seconds",
            "Time to answer an HTTP request (this process)",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

        self._collector: QueueCollector | None = None

    def watch_database(self, database: Database) -> None:
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = QueueCollector(database)
        self.registry.register(self._collector)


class LatencyMiddleware:
    """Observe request latency by route template (not raw path: ids would explode the label set)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            if (
                template.startswith("/")
                and scope["path"].startswith(API_PREFIX)
                and not template.startswith(API_PREFIX)
            ):
                template = API_PREFIX + template  # routes of included routers keep their own part only
            if not template.endswith("/events"):  # a stream's duration is not a latency
                self.metrics.latency.labels(scope["method"], template, str(status)).observe(time.perf_counter() - start)
