"""Recording events, and reading them back in id order.

Events are buffered on the session and written just before it commits, under
a transaction-scoped advisory lock on PostgreSQL. So ids are handed out in
commit order: a reader that has seen id N will never later find a committed
id below N, which is what lets an SSE stream resume from ``Last-Event-ID``
with ``id > N``. (SQLite has one writer at a time, so its ids are in commit
order already.)
"""

from __future__ import annotations

import json
from typing import Any, cast

from sqlalchemy import Table, TextClause, event, func, or_, select, text
from sqlalchemy.orm import Session

from service.db import utcnow
from service.events.models import Event

# Arbitrary 64-bit key of the advisory lock that orders event ids ("MCevents").
EVENTS_LOCK_KEY = 0x4D4365766E7473

_PENDING = "mapcampaign_pending_events"


def record_event(
    session: Session,
    kind: str,
    *,
    state: str | None = None,
    owner_id: int | None = None,
    campaign_id: int | None = None,
    realization: int | None = None,
    plan_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Queue one event; it is written when ``session`` commits, and dropped if it rolls back."""
    session.info.setdefault(_PENDING, []).append(
        {
            "kind": kind,
            "state": state,
            "owner_id": owner_id,
            "campaign_id": campaign_id,
            "realization": realization,
            "plan_id": plan_id,
            "created_at": utcnow(),
            "data": data or {},
        }
    )


@event.listens_for(Session, "before_commit")
def _write_pending_events(session: Session) -> None:
    pending = session.info.pop(_PENDING, None)
    if not pending:
        return
    # Changes still pending in the session are written before the event lock is taken, not after it (the
    # commit flushes after this hook): a change to realisations locks their count rows (migration 0005),
    # and every transaction must take those before the event lock, or two could wait on each other.
    session.flush()
    events = cast(Table, Event.__table__)
    if session.get_bind().dialect.name != "postgresql":
        session.execute(events.insert(), pending)  # Core executemany: no RETURNING needed
    elif len(pending) <= _LOCKED_INSERT_ROWS:
        session.execute(_insert_under_lock(pending))
    else:
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENTS_LOCK_KEY})
        session.execute(events.insert(), pending)


# Events a transaction writes in the statement that takes the lock; more (a bulk cancel's) go in an
# executemany after it.
_LOCKED_INSERT_ROWS = 1000

# PostgreSQL: the event lock taken and the events inserted in one statement (one round trip, not two, in
# the part of every writing transaction that runs under the lock, so under the lock for less time). The
# lock is a volatile CTE every row joins, so it is taken before the first row reaches the insert, and so
# before any id is drawn; ORDER BY the position keeps the ids in recording order. The rows come as one
# JSON parameter: the statement's text is the same whatever their number (compiled and prepared once).
_INSERT_UNDER_LOCK = text(
    """
    WITH event_lock AS (SELECT pg_advisory_xact_lock(:key))
    INSERT INTO events (kind, state, owner_id, campaign_id, realization, plan_id, created_at, data)
    SELECT kind, state, owner_id, campaign_id, realization, plan_id, created_at, data
    FROM event_lock, jsonb_to_recordset(CAST(:rows AS jsonb)) AS pending(
        position integer, kind varchar, state varchar, owner_id bigint, campaign_id bigint, realization integer,
        plan_id bigint, created_at timestamptz, data json
    )
    ORDER BY position
    """
)


def _insert_under_lock(pending: list[dict[str, Any]]) -> TextClause:
    rows = [
        {**event, "position": position, "created_at": event["created_at"].isoformat()}
        for position, event in enumerate(pending)
    ]
    return _INSERT_UNDER_LOCK.bindparams(key=EVENTS_LOCK_KEY, rows=json.dumps(rows))


@event.listens_for(Session, "after_rollback")
def _drop_pending_events(session: Session) -> None:
    session.info.pop(_PENDING, None)


def latest_event_id(*, session: Session) -> int:
    return session.scalar(select(func.coalesce(func.max(Event.id), 0))) or 0


def events_after(
    *, session: Session, after_id: int, owner_id: int, campaign_id: int | None = None, limit: int = 500
) -> list[Event]:
    """Events with id > ``after_id`` that ``owner_id`` may see: their own campaigns', and system events."""
    query = select(Event).where(Event.id > after_id)
    if campaign_id is not None:
        query = query.where(Event.campaign_id == campaign_id, Event.owner_id == owner_id)
    else:
        query = query.where(or_(Event.owner_id == owner_id, Event.owner_id.is_(None)))
    return list(session.scalars(query.order_by(Event.id).limit(limit)))
