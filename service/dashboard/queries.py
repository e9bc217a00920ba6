"""Read queries of the dashboard pages: a fixed number of statements per page, whatever the campaign size.

Every function takes the owner's user id and reaches only that user's
campaigns (:func:`service.campaigns.reads.get_campaign` answers 404 for the
others). Result JSON is read field by field in SQL (``result["timing"]``), so
large fields such as spectra never leave the database for a chart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, case, func, literal, select, type_coerce
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session

from schemas.states import LEASED_REALIZATION_STATES, PlanState, RealizationState
from service.campaigns.models import Attempt, Campaign, Realization
from service.queue.models import PreprocessingPlan
from service.workers.models import Worker

# One character per realisation state: the grid of a 10000-realisation campaign is 10 kB.
STATE_CODES = {
    RealizationState.QUEUED: "q",
    RealizationState.CLAIMED: "c",
    RealizationState.RUNNING: "r",
    RealizationState.SUCCEEDED: "s",
    RealizationState.FAILED: "f",
    RealizationState.CANCELLED: "x",
}

RESULTS_WINDOW = 100  # realisations per window of the timing and convergence charts
MAP_ROLE = "iqu"  # role (ProductFile.name) of the I/Q/U map in a realisation's products


def state_grid(*, session: Session, campaign: Campaign) -> str:
    """The state of every realisation as one character each, in index order (see STATE_CODES).

    On PostgreSQL the string is made in the database (``string_agg`` in index order over the unique
    index ``(campaign_id, index)``): one value crosses the wire, not a row per realisation, which made
    the page of a 100,000-realisation campaign take 0.4 s. Elsewhere, and whenever the indices are
    not exactly 0 to N-1 (never seen; the check costs nothing), rows are read as plain strings.
    """
    state = type_coerce(Realization.state, String)  # the stored text, without the enum's conversion per row
    if session.get_bind().dialect.name == "postgresql":
        code = case({str(key): value for key, value in STATE_CODES.items()}, value=state, else_="q")
        grid = session.scalar(
            select(func.string_agg(code, aggregate_order_by(literal(""), Realization.index))).where(
                Realization.campaign_id == campaign.id
            )
        )
        if grid is not None and len(grid) == campaign.realizations:
            return grid
    codes = ["q"] * campaign.realizations
    by_text = {str(key): value for key, value in STATE_CODES.items()}
    rows = session.execute(select(Realization.index, state).where(Realization.campaign_id == campaign.id))
    for index, text in rows:
        if 0 <= index < len(codes):
            codes[index] = by_text.get(text, "q")
    return "".join(codes)


@dataclass(frozen=True)
class PlanUse:
    id: int
    site: str
    state: str
    build_time_s: float | None
    size_bytes: int | None
    uses: int
    uses_here: int
    build_attempts: int
    last_error: str | None
    created_at: datetime
    ready_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "site": self.site,
            "state": self.state,
            "build_time_s": self.build_time_s,
            "size_bytes": self.size_bytes,
            "uses": self.uses,
            "uses_here": self.uses_here,
            "build_attempts": self.build_attempts,
            "last_error": self.last_error,
            "ready_at": self.ready_at.isoformat() if self.ready_at else None,
        }


def plans_of(*, session: Session, campaign: Campaign) -> list[PlanUse]:
    """The overlap plans this campaign needs (one per site), with how many of its realisations used each."""
    used_here = dict(
        session.execute(
            select(Attempt.plan_id, func.count())
            .where(
                Attempt.campaign_id == campaign.id,
                Attempt.plan_id.is_not(None),
                Attempt.exit_code == 0,
                Attempt.failure_class.is_(None),
                Attempt.ended_at.is_not(None),
            )
            .group_by(Attempt.plan_id)
        ).all()
    )
    plans = session.scalars(
        select(PreprocessingPlan)
        .where(PreprocessingPlan.scan_key == campaign.scan_key, PreprocessingPlan.ranks == campaign.ranks)
        .order_by(PreprocessingPlan.site)
    )
    return [
        PlanUse(
            id=plan.id,
            site=plan.site,
            state=plan.state,
            build_time_s=plan.build_time_s,
            size_bytes=plan.size_bytes,
            uses=plan.uses,
            uses_here=used_here.get(plan.id, 0),
            build_attempts=plan.build_attempts,
            last_error=plan.last_error,
            created_at=plan.created_at,
            ready_at=plan.ready_at,
        )
        for plan in plans
    ]


def failure_summary(*, session: Session, campaign_id: int, recent: int = 8) -> dict[str, Any]:
    """Failed attempts of the campaign by failure class, and the most recent ones with their last log line."""
    by_class = dict(
        session.execute(
            select(Attempt.failure_class, func.count())
            .where(Attempt.campaign_id == campaign_id, Attempt.failure_class.is_not(None))
            .group_by(Attempt.failure_class)
        ).all()
    )
    rows = session.execute(
        select(
            Realization.index,
            Attempt.number,
            Attempt.failure_class,
            Attempt.exit_code,
            Attempt.ended_at,
            Attempt.host,
            Attempt.log_tail,
        )
        .join(Realization, Realization.id == Attempt.realization_id)
        .where(Attempt.campaign_id == campaign_id, Attempt.failure_class.is_not(None))
        .order_by(Attempt.id.desc())
        .limit(recent)
    )
    latest = [
        {
            "realization": index,
            "attempt": number,
            "failure_class": failure_class,
            "exit_code": exit_code,
            "ended_at": ended_at,
            "host": host,
            "last_line": last_log_line(log_tail),
        }
        for index, number, failure_class, exit_code, ended_at, host, log_tail in rows
    ]
    return {"by_class": by_class, "recent": latest}


def last_log_line(log_tail: str | None, limit: int = 200) -> str:
    lines = [line for line in (log_tail or "").splitlines() if line.strip()]
    return lines[-1][-limit:] if lines else ""


def results_window(*, session: Session, campaign: Campaign, window: int) -> list[dict[str, Any]]:
    """Timing split and residual history of the succeeded realisations with index in this window of 100."""
    start, stop = window * RESULTS_WINDOW, (window + 1) * RESULTS_WINDOW
    result = Realization.result
    rows = session.execute(
        select(
            Realization.index,
            result["timing"],
            result["residual_history"],
            result["iterations"],
            result["converged"],
            result["communication"],
        )
        .where(
            Realization.campaign_id == campaign.id,
            Realization.state == RealizationState.SUCCEEDED,
            Realization.index >= start,
            Realization.index < stop,
        )
        .order_by(Realization.index)
    )
    items = []
    for index, timing, residuals, iterations, converged, communication in rows:
        communication = communication if isinstance(communication, dict) else {}
        items.append(
            {
                "index": index,
                "timing": timing if isinstance(timing, dict) else None,
                "residual_history": residuals if isinstance(residuals, list) else [],
                "iterations": iterations,
                "converged": converged,
                "strategy": communication.get("strategy"),
            }
        )
    return items


def latest_results_window(*, session: Session, campaign_id: int) -> int:
    """The window holding the most recently finished succeeded realisation (0 when none succeeded yet)."""
    index = session.scalar(
        select(Realization.index)
        .where(Realization.campaign_id == campaign_id, Realization.state == RealizationState.SUCCEEDED)
        .order_by(Realization.finished_at.desc(), Realization.index.desc())
        .limit(1)
    )
    return (index or 0) // RESULTS_WINDOW


@dataclass(frozen=True)
class MapProduct:
    realization: int
    path: str
    sha256: str
    finished_at: datetime | None


def map_product(products: Any) -> tuple[str, str] | None:
    """(path, sha256) of the I/Q/U map among a result's products, if it has one."""
    for product in products if isinstance(products, list) else []:
        if isinstance(product, dict) and product.get("name") == MAP_ROLE:
            path, sha256 = product.get("path"), product.get("sha256")
            if isinstance(path, str) and isinstance(sha256, str):
                return path, sha256
    return None


def latest_map(*, session: Session, campaign_id: int, look_back: int = 20) -> MapProduct | None:
    """The I/Q/U map of the most recently finished succeeded realisation that has one."""
    rows = session.execute(
        select(Realization.index, Realization.result["products"], Realization.finished_at)
        .where(Realization.campaign_id == campaign_id, Realization.state == RealizationState.SUCCEEDED)
        .order_by(Realization.finished_at.desc(), Realization.index.desc())
        .limit(look_back)
    )
    for index, products, finished_at in rows:
        found = map_product(products)
        if found is not None:
            return MapProduct(realization=index, path=found[0], sha256=found[1], finished_at=finished_at)
    return None


def realization_map(*, session: Session, campaign_id: int, index: int) -> MapProduct | None:
    row = session.execute(
        select(Realization.result["products"], Realization.finished_at).where(
            Realization.campaign_id == campaign_id,
            Realization.index == index,
            Realization.state == RealizationState.SUCCEEDED,
        )
    ).first()
    if row is None:
        return None
    found = map_product(row[0])
    return MapProduct(realization=index, path=found[0], sha256=found[1], finished_at=row[1]) if found else None


def product_of(*, session: Session, campaign_id: int, index: int, name: str) -> dict[str, Any] | None:
    """The product record a succeeded realisation's result names with this file name."""
    products = session.scalar(
        select(Realization.result["products"]).where(
            Realization.campaign_id == campaign_id,
            Realization.index == index,
            Realization.state == RealizationState.SUCCEEDED,
        )
    )
    for product in products if isinstance(products, list) else []:
        if isinstance(product, dict) and product.get("path") == name:
            return product
    return None


def workers_with_tasks(*, session: Session, owner_id: int, own_tasks_per_worker: int = 20) -> list[dict[str, Any]]:
    """Every worker with its running tasks: counts over all users, and the caller's own tasks by campaign."""
    held = dict(
        session.execute(
            select(Realization.lease_holder_id, func.count())
            .where(Realization.state.in_(LEASED_REALIZATION_STATES), Realization.lease_holder_id.is_not(None))
            .group_by(Realization.lease_holder_id)
        ).all()
    )
    building = dict(
        session.execute(
            select(PreprocessingPlan.lease_holder_id, func.count())
            .where(PreprocessingPlan.state == PlanState.BUILDING, PreprocessingPlan.lease_holder_id.is_not(None))
            .group_by(PreprocessingPlan.lease_holder_id)
        ).all()
    )
    own: dict[int, list[dict[str, Any]]] = {}  # worker id -> [{campaign_id, campaign, realizations}]
    shown: dict[int, int] = {}
    rows = session.execute(
        select(Realization.lease_holder_id, Campaign.id, Campaign.name, Realization.index)
        .join(Campaign, Campaign.id == Realization.campaign_id)
        .where(
            Campaign.owner_id == owner_id,
            Realization.state.in_(LEASED_REALIZATION_STATES),
            Realization.lease_holder_id.is_not(None),
        )
        .order_by(Realization.lease_holder_id, Campaign.id, Realization.index)
    )
    for worker_id, campaign_id, campaign_name, index in rows:
        assert worker_id is not None  # the query keeps leased realisations only
        if shown.get(worker_id, 0) >= own_tasks_per_worker:
            continue
        shown[worker_id] = shown.get(worker_id, 0) + 1
        groups = own.setdefault(worker_id, [])
        if not groups or groups[-1]["campaign_id"] != campaign_id:
            groups.append({"campaign_id": campaign_id, "campaign": campaign_name, "realizations": []})
        groups[-1]["realizations"].append(index)
    workers = session.scalars(select(Worker).order_by(Worker.site, Worker.name))
    return [
        {
            "id": worker.id,
            "name": worker.name,
            "site": worker.site,
            "host": worker.host,
            "capacity": worker.capacity,
            "registered_at": worker.registered_at,
            "last_heartbeat_at": worker.last_heartbeat_at,
            "running": held.get(worker.id, 0),
            "building": building.get(worker.id, 0),
            "own_tasks": own.get(worker.id, []),
        }
        for worker in workers
    ]


def campaigns_by_ids(*, session: Session, owner_id: int, ids: list[int]) -> list[Campaign]:
    if not ids:
        return []
    return list(session.scalars(select(Campaign).where(Campaign.owner_id == owner_id, Campaign.id.in_(ids))))


def table_rows(*, session: Session, campaign: Campaign, indices: list[int]) -> list[dict[str, Any]]:
    """Rows of the realisation table: state, attempts used, and the worker of the latest attempt.

    The worker is that of the realisation's latest attempt, so it stays shown once the realisation
    ends (its lease, and with it ``lease_holder``, is gone by then); ``holding`` says whether that
    worker still holds it.
    """
    if not indices:
        return []
    latest = (
        select(Attempt.realization_id, func.max(Attempt.id).label("attempt_id"))
        .where(Attempt.campaign_id == campaign.id)
        .group_by(Attempt.realization_id)
        .subquery()
    )
    rows = session.execute(
        select(
            Realization.index,
            Realization.state,
            Realization.attempts,
            Realization.lease_holder_id,
            Realization.finished_at,
            Worker.name,
        )
        .outerjoin(latest, latest.c.realization_id == Realization.id)
        .outerjoin(Attempt, Attempt.id == latest.c.attempt_id)
        .outerjoin(Worker, Worker.id == Attempt.worker_id)
        .where(Realization.campaign_id == campaign.id, Realization.index.in_(indices))
        .order_by(Realization.index)
    )
    return [
        {
            "index": index,
            "state": state,
            "attempts": attempts,
            "max_attempts": campaign.max_attempts,
            "worker": worker,
            "holding": lease_holder_id is not None,
            "finished_at": finished_at,
        }
        for index, state, attempts, lease_holder_id, finished_at, worker in rows
    ]


@dataclass(frozen=True)
class PlanRow:
    """An overlap plan and the caller's campaigns that need it (same scan key and ranks)."""

    plan: PlanUse
    scan_key: str
    ranks: int
    campaigns: list[tuple[int, str]]  # (id, name), newest first


def plans_of_owner(*, session: Session, owner_id: int, limit: int = 200) -> list[PlanRow]:
    """Every plan one of the owner's campaigns needs, newest first, with those campaigns.

    Plans are shared by every user with the same pointing; only the caller's own campaigns are named.
    """
    pairs = session.execute(
        select(PreprocessingPlan, Campaign.id, Campaign.name)
        .join(
            Campaign,
            (Campaign.scan_key == PreprocessingPlan.scan_key) & (Campaign.ranks == PreprocessingPlan.ranks),
        )
        .where(Campaign.owner_id == owner_id)
        .order_by(PreprocessingPlan.id.desc(), Campaign.id.desc())
    )
    found: dict[int, PlanRow] = {}
    for plan, campaign_id, campaign_name in pairs:
        row = found.get(plan.id)
        if row is None:
            if len(found) >= limit:
                break
            row = found[plan.id] = PlanRow(
                plan=PlanUse(
                    id=plan.id,
                    site=plan.site,
                    state=plan.state,
                    build_time_s=plan.build_time_s,
                    size_bytes=plan.size_bytes,
                    uses=plan.uses,
                    uses_here=0,
                    build_attempts=plan.build_attempts,
                    last_error=plan.last_error,
                    created_at=plan.created_at,
                    ready_at=plan.ready_at,
                ),
                scan_key=plan.scan_key,
                ranks=plan.ranks,
                campaigns=[],
            )
        row.campaigns.append((campaign_id, campaign_name))
    return list(found.values())
