"""The one way a row's state changes: checked against the transition table, set, and its event recorded.

:func:`transition` is the only place in ``service/`` that assigns a row's ``state``
(tests/unit/test_architecture.py fails on any other). A bulk ``UPDATE`` that moves
many rows at once checks the table with :func:`schemas.states.advance_each` and records
one event itself; the architecture test lists those places.

The event's ``data`` is typed per kind of change (the ``TypedDict``s below); it is
stored as the JSON object it is, so the event log, the SSE stream and the dashboard
read the same keys as ever.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, TypedDict

from sqlalchemy.orm import Session

from schemas.states import CampaignState, Entity, PlanState, RealizationState, S, advance
from service.events.service import record_event


class EventKind(StrEnum):
    """What an event is about: its ``kind`` in the event log."""

    CAMPAIGN = "campaign"
    REALIZATION = "realization"
    PLAN = "plan"
    LEASE_EXPIRED = "lease_expired"
    COUPLING = "coupling"
    WORKER = "worker"


# The data of each kind of state change. "from" is a Python keyword, hence the functional form.
CampaignSettled = TypedDict("CampaignSettled", {"from": str, "failure_cause": str | None})
CampaignStarted = TypedDict("CampaignStarted", {"from": str})
CampaignHeld = TypedDict(
    "CampaignHeld", {"from": str, "failure_cause": str | None, "signature": str, "failures": int}
)


class CampaignCancelled(TypedDict):
    reason: str


class RealizationClaimed(TypedDict):
    attempt: int
    worker: str


class RealizationStarted(TypedDict):
    attempt: int
    worker: str
    host: str | None


class RealizationSucceeded(TypedDict):
    attempt: int
    worker: str
    iterations: int
    converged: bool


class RealizationEnded(TypedDict):
    """An attempt ended without success: the realisation is queued again, or failed for good."""

    attempt: int
    failure_class: str
    exit_code: int | None
    worker: str | None
    attempts_left: int
    charged: bool


class RealizationRequeued(TypedDict):
    """The attempt's lease expired and it had no attempt row to end (cannot happen through the API)."""


class PlanReady(TypedDict):
    scan_key: str
    ranks: int
    site: str


class PlanInvalidated(TypedDict):
    scan_key: str
    ranks: int
    site: str
    invalidated: bool
    error: str


class PlanBuildFailed(TypedDict):
    scan_key: str
    ranks: int
    site: str
    build_attempt: int
    final: bool
    error: str


TransitionData = (
    CampaignSettled
    | CampaignStarted
    | CampaignHeld
    | CampaignCancelled
    | RealizationClaimed
    | RealizationStarted
    | RealizationSucceeded
    | RealizationEnded
    | RealizationRequeued
    | PlanReady
    | PlanInvalidated
    | PlanBuildFailed
)

_ENTITIES: dict[type, Entity] = {
    CampaignState: Entity.CAMPAIGN,
    RealizationState: Entity.REALIZATION,
    PlanState: Entity.PLAN,
}


class HasState(Protocol):
    state: Any


def transition(
    session: Session,
    row: HasState,
    *,
    to: S,
    event: EventKind | None,
    data: TransitionData | None = None,
    owner_id: int | None = None,
    campaign_id: int | None = None,
    realization: int | None = None,
    plan_id: int | None = None,
) -> S:
    """Move ``row`` (a campaign, realisation or plan) to ``to`` and record ``event`` in ``session``; return ``to``.

    The move is checked against :data:`schemas.states.TRANSITIONS` (the entity is read from the type of
    ``to``); a forbidden one raises :class:`schemas.states.ForbiddenTransition` and changes nothing. The
    event is written when ``session`` commits, with ``state`` set to ``to``. ``event=None`` records none:
    for a move whose event the caller records with other data (a realisation returning to the queue as
    its lease expired is told by the ``lease_expired`` event).
    """
    row.state = advance(_ENTITIES[type(to)], row.state, to)
    if event is not None:
        record_event(
            session,
            event,
            state=to,
            owner_id=owner_id,
            campaign_id=campaign_id,
            realization=realization,
            plan_id=plan_id,
            data=dict(data) if data is not None else None,
        )
    return to
