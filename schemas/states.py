"""The states of campaigns, realisations, attempts and preprocessing plans, and the moves allowed between them.

Every state change the service makes goes through :func:`advance`, which
refuses a move not in :data:`TRANSITIONS` with :class:`ForbiddenTransition`.

Realisation: ``queued -> claimed -> running -> succeeded``. A failed attempt
sends it back to ``queued`` while attempts remain, else to ``failed``; an
expired lease does the same. ``cancelled`` (campaign cancelled) and
``failed`` (its plan could not be built) from any unfinished state; a retry
puts ``failed`` back to ``queued``.

Attempt: ``claimed -> running``, then it ends ``succeeded``, ``failed`` or
``cancelled``. It has no state column: the state is read from its times and
failure class (:func:`attempt_state`).

Plan: ``building -> ready | failed``; a failed plan is built again
(``failed -> building``); a ready plan a worker refuses becomes ``failed``.

Campaign: follows its realisations (``queued``, ``running``, ``succeeded``,
``failed``); ``cancelled`` only by the user, from an unfinished state; a retry
takes ``failed`` back to ``queued`` or ``running``, and an extension (more
realisations) takes ``failed`` or ``succeeded`` to ``running``. ``held``
(fail fast): from ``running`` when attempts of several realisations fail
alike; nothing is dispatched until a retry releases it (back to ``queued``
or ``running``); it may be cancelled, and ends ``failed`` if its last
running realisations end while it is held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from enum import StrEnum


class _State(StrEnum):
    """A state whose repr is its value's, so a mapping of counts prints as ``{'queued': 3}``."""

    def __repr__(self) -> str:
        return repr(self.value)
from typing import TypeVar


class CampaignState(_State):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    HELD = "held"  # fail fast: attempts failed alike; nothing is dispatched until a retry releases it


class RealizationState(_State):
    QUEUED = "queued"
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptState(_State):
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class PlanState(_State):
    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


class Entity(StrEnum):
    """What a state belongs to."""

    CAMPAIGN = "campaign"
    REALIZATION = "realization"
    ATTEMPT = "attempt"
    PLAN = "plan"


State = CampaignState | RealizationState | AttemptState | PlanState
S = TypeVar("S", CampaignState, RealizationState, AttemptState, PlanState)

# Campaigns whose queued realisations are dispatched (a held one waits for its owner).
UNFINISHED_CAMPAIGN_STATES = (CampaignState.QUEUED, CampaignState.RUNNING)
FINISHED_CAMPAIGN_STATES = (CampaignState.SUCCEEDED, CampaignState.FAILED, CampaignState.CANCELLED)
UNFINISHED_REALIZATION_STATES = (RealizationState.QUEUED, RealizationState.CLAIMED, RealizationState.RUNNING)
LEASED_REALIZATION_STATES = (RealizationState.CLAIMED, RealizationState.RUNNING)
# A plan that serves, or will serve, its campaigns at its site.
LIVE_PLAN_STATES = (PlanState.READY, PlanState.BUILDING)

_R = RealizationState
_C = CampaignState
_A = AttemptState
_P = PlanState

INITIAL: Mapping[Entity, State] = {
    Entity.CAMPAIGN: _C.QUEUED,
    Entity.REALIZATION: _R.QUEUED,
    Entity.ATTEMPT: _A.CLAIMED,
    Entity.PLAN: _P.BUILDING,
}

TRANSITIONS: Mapping[Entity, Mapping[State, frozenset[State]]] = {
    Entity.REALIZATION: {
        _R.QUEUED: frozenset({_R.CLAIMED, _R.CANCELLED, _R.FAILED}),
        # back to QUEUED: the attempt failed (or its lease expired) with attempts left
        _R.CLAIMED: frozenset({_R.RUNNING, _R.SUCCEEDED, _R.QUEUED, _R.FAILED, _R.CANCELLED}),
        _R.RUNNING: frozenset({_R.SUCCEEDED, _R.QUEUED, _R.FAILED, _R.CANCELLED}),
        _R.FAILED: frozenset({_R.QUEUED}),  # retry
        _R.SUCCEEDED: frozenset(),
        _R.CANCELLED: frozenset(),
    },
    Entity.ATTEMPT: {
        _A.CLAIMED: frozenset({_A.RUNNING, _A.SUCCEEDED, _A.FAILED, _A.CANCELLED}),
        _A.RUNNING: frozenset({_A.SUCCEEDED, _A.FAILED, _A.CANCELLED}),
        _A.SUCCEEDED: frozenset(),
        _A.FAILED: frozenset(),
        _A.CANCELLED: frozenset(),
    },
    Entity.PLAN: {
        _P.BUILDING: frozenset({_P.READY, _P.FAILED}),
        _P.READY: frozenset({_P.FAILED}),  # a worker refused the built plan
        _P.FAILED: frozenset({_P.BUILDING}),  # rebuilt
    },
    Entity.CAMPAIGN: {
        # The campaign's state is settled from its realisations' counts, so it may skip a step: QUEUED ->
        # SUCCEEDED when a claim raced the reaper's RUNNING -> QUEUED (every started realisation went back).
        _C.QUEUED: frozenset({_C.RUNNING, _C.SUCCEEDED, _C.FAILED, _C.CANCELLED}),
        # HELD: attempts failed alike (a failure report, so the campaign has started).
        _C.RUNNING: frozenset({_C.QUEUED, _C.SUCCEEDED, _C.FAILED, _C.CANCELLED, _C.HELD}),
        # Released by a retry; FAILED when its last running realisations end while it is held (the ones that
        # failed alike are failed or queued, so it cannot have succeeded).
        _C.HELD: frozenset({_C.QUEUED, _C.RUNNING, _C.FAILED, _C.CANCELLED}),
        _C.FAILED: frozenset({_C.QUEUED, _C.RUNNING}),  # retry of its failed realisations, or an extension
        _C.SUCCEEDED: frozenset({_C.RUNNING}),  # extended with more realisations (some had started)
        _C.CANCELLED: frozenset(),
    },
}


class ForbiddenTransition(ValueError):
    """A state change the machine does not allow: a bug in the caller, never a user's mistake."""

    def __init__(self, entity: Entity, current: str, new: str) -> None:
        super().__init__(f"{entity} cannot go from {current!r} to {new!r}")
        self.entity = entity
        self.current = current
        self.new = new


TransitionObserver = Callable[[Entity, State, State], None]
_OBSERVERS: list[TransitionObserver] = []


def observe_transitions(observer: TransitionObserver) -> Callable[[], None]:
    """Call ``observer(entity, current, new)`` on every allowed transition; return the function that stops it."""
    _OBSERVERS.append(observer)
    return lambda: _OBSERVERS.remove(observer)


def is_allowed(entity: Entity, current: State, new: State) -> bool:
    return new in TRANSITIONS[entity].get(current, frozenset())


def advance(entity: Entity, current: State | str, new: S) -> S:
    """Return ``new`` if ``entity`` may go from ``current`` to it; else raise :class:`ForbiddenTransition`."""
    states = type(new)
    try:
        before = states(current)
    except ValueError:
        raise ForbiddenTransition(entity, str(current), str(new)) from None
    if not is_allowed(entity, before, new):
        raise ForbiddenTransition(entity, str(before), str(new))
    for observer in _OBSERVERS:
        observer(entity, before, new)
    return new


def advance_each(entity: Entity, currents: Iterable[State | str], new: S) -> S:
    """:func:`advance` from every state in ``currents``: for a bulk update of rows in any of them."""
    for current in currents:
        advance(entity, current, new)
    return new


def attempt_state(*, started_at: datetime | None, ended_at: datetime | None, failure_class: str | None) -> AttemptState:
    """An attempt's state, read from its row: its times and how it ended."""
    if ended_at is None:
        return AttemptState.RUNNING if started_at is not None else AttemptState.CLAIMED
    if failure_class is None:
        return AttemptState.SUCCEEDED
    return AttemptState.CANCELLED if failure_class == "cancelled" else AttemptState.FAILED
