"""Worker registration and lookup."""

from __future__ import annotations

from datetime import datetime
from functools import cache

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningUpdate

from schemas.api import WorkerInfo, WorkerRegistration
from service.auth.models import ApiToken
from service.auth.service import Principal, hash_token
from service.db import UTCDateTime, utcnow
from service.events.service import record_event
from service.events.transitions import EventKind
from service.workers.errors import WorkerNameTaken, WorkerNotFound, WorkerTokenMismatch
from service.workers.models import Worker


def register_worker(*, session: Session, principal: Principal, registration: WorkerRegistration) -> Worker:
    """Create the worker, or update it when the name is known (a restarted worker keeps its id)."""
    worker = session.scalar(select(Worker).where(Worker.name == registration.name).with_for_update())
    now = utcnow()
    if worker is not None and worker.token_id not in (None, principal.token_id):
        # A restarted worker may come back with a new token of the same user (rotation); a token of
        # another user would take over the worker's tasks and lock its owner out.
        holder = session.get(ApiToken, worker.token_id)
        if holder is not None and holder.user_id != principal.user_id:
            raise WorkerNameTaken(
                f"worker name {registration.name!r} is registered with another user's token; choose another name"
            )
    if worker is None:
        worker = Worker(
            name=registration.name,
            registered_at=now,
            site=registration.site,
            host=registration.host,
            capacity=registration.capacity,
        )
        session.add(worker)
    worker.site = registration.site
    worker.host = registration.host
    worker.capacity = registration.capacity
    worker.sky_maps = registration.sky_maps
    worker.data_dir = registration.data_dir
    worker.token_id = principal.token_id
    worker.last_heartbeat_at = now
    session.flush()
    record_event(
        session,
        EventKind.WORKER,
        state="registered",
        data={"worker": worker.name, "site": worker.site, "host": worker.host, "capacity": worker.capacity},
    )
    session.commit()
    return worker


def hold_worker(*, session: Session, principal: Principal, worker_id: int, now: datetime) -> Worker:
    """The caller's worker, its row locked and its heartbeat set to ``now``, in one statement.

    Claims and heartbeats of one worker queue on its row. ``UPDATE ... RETURNING`` locks it and records
    the heartbeat in one round trip (a ``SELECT ... FOR UPDATE`` and a flushed change took two, on
    every claim). A token that is not the worker's raises, and the caller's transaction, which has not
    committed, rolls the heartbeat back with it.
    """
    worker = session.scalar(
        update(Worker)
        .where(Worker.id == worker_id)
        .values(last_heartbeat_at=now)
        .returning(Worker)
        .execution_options(synchronize_session=False)
    )
    if worker is None:
        raise WorkerNotFound(f"worker {worker_id} is not registered; POST /api/v1/workers first")
    if worker.token_id != principal.token_id:
        raise WorkerTokenMismatch(f"worker {worker_id} was registered with another token; register again")
    return worker


def hold_worker_by_token(*, session: Session, token: str, worker_id: int, now: datetime) -> Worker | None:
    """:func:`hold_worker` and the token check in one statement: the worker, its row locked and its heartbeat
    set to ``now``, if ``token`` is the live worker token that registered it; else None (nothing changed),
    and the caller finds out why with the ordinary checks (get_principal, :func:`hold_worker`).

    A claim checked the token in a session of its own first: a connection, its ping, BEGIN, the lookup and
    ROLLBACK, on every claim.
    """
    return session.scalar(
        _hold_by_token_statement(), {"worker_id": worker_id, "token_hash": hash_token(token), "now": now}
    )


@cache
def _hold_by_token_statement() -> ReturningUpdate[Worker]:
    """The statement of :func:`hold_worker_by_token`, built once: its values are bound parameters."""
    return (
        update(Worker)
        .where(
            Worker.id == bindparam("worker_id"),
            ApiToken.id == Worker.token_id,
            ApiToken.token_hash == bindparam("token_hash"),
            ApiToken.kind == "worker",
            ApiToken.revoked_at.is_(None),
        )
        .values(last_heartbeat_at=bindparam("now", type_=UTCDateTime()))
        .returning(Worker)
        .execution_options(synchronize_session=False)
    )


def worker_info(worker: Worker) -> WorkerInfo:
    return WorkerInfo(
        id=worker.id,
        name=worker.name,
        site=worker.site,
        host=worker.host,
        capacity=worker.capacity,
        registered_at=worker.registered_at,
        last_heartbeat_at=worker.last_heartbeat_at,
    )


def list_workers(*, session: Session) -> list[WorkerInfo]:
    return [worker_info(worker) for worker in session.scalars(select(Worker).order_by(Worker.id))]
