"""The table of allowed state transitions (schemas/states.py) and the one function every change goes through."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

import pytest

from schemas.api import CAMPAIGN_STATES, REALIZATION_STATES
from schemas.states import (
    INITIAL,
    TRANSITIONS,
    UNFINISHED_REALIZATION_STATES,
    AttemptState,
    CampaignState,
    Entity,
    ForbiddenTransition,
    PlanState,
    RealizationState,
    advance,
    advance_each,
    attempt_state,
    is_allowed,
    observe_transitions,
)

STATES = {
    Entity.CAMPAIGN: CampaignState,
    Entity.REALIZATION: RealizationState,
    Entity.ATTEMPT: AttemptState,
    Entity.PLAN: PlanState,
}
R = RealizationState


@pytest.mark.parametrize("entity", list(Entity))
def test_every_state_has_a_row_and_moves_only_to_its_own_kind(entity):
    states = STATES[entity]
    assert set(TRANSITIONS[entity]) == set(states)
    assert isinstance(INITIAL[entity], states)
    for current, targets in TRANSITIONS[entity].items():
        assert all(isinstance(target, states) for target in targets)
        assert current not in targets  # staying put is not a transition


def test_finished_states_are_final():
    finals = {
        Entity.REALIZATION: {R.SUCCEEDED, R.CANCELLED},
        Entity.ATTEMPT: {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED},
        Entity.CAMPAIGN: {CampaignState.CANCELLED},  # a succeeded campaign may be extended
        Entity.PLAN: set(),
    }
    for entity, states in finals.items():
        assert {state for state, targets in TRANSITIONS[entity].items() if not targets} == states


def test_the_machine_of_the_design():
    path = [R.QUEUED, R.CLAIMED, R.RUNNING, R.SUCCEEDED]
    assert all(is_allowed(Entity.REALIZATION, a, b) for a, b in pairwise(path))
    assert is_allowed(Entity.REALIZATION, R.RUNNING, R.FAILED) and is_allowed(Entity.REALIZATION, R.FAILED, R.QUEUED)
    assert all(is_allowed(Entity.REALIZATION, state, R.CANCELLED) for state in UNFINISHED_REALIZATION_STATES)
    assert not is_allowed(Entity.REALIZATION, R.SUCCEEDED, R.CANCELLED)
    assert not is_allowed(Entity.REALIZATION, R.QUEUED, R.RUNNING)  # a realisation is claimed before it runs
    assert TRANSITIONS[Entity.PLAN][PlanState.BUILDING] == {PlanState.READY, PlanState.FAILED}


def test_a_forbidden_transition_raises_naming_entity_and_both_states():
    with pytest.raises(ForbiddenTransition, match=r"realization cannot go from 'succeeded' to 'queued'") as raised:
        advance(Entity.REALIZATION, R.SUCCEEDED, R.QUEUED)
    assert (raised.value.entity, raised.value.current, raised.value.new) == (Entity.REALIZATION, "succeeded", "queued")
    with pytest.raises(ForbiddenTransition, match="'archived'"):
        advance(Entity.PLAN, "archived", PlanState.READY)  # not a state at all
    with pytest.raises(ForbiddenTransition, match="'cancelled' to 'queued'"):
        advance_each(Entity.REALIZATION, [R.FAILED, R.CANCELLED], R.QUEUED)


def test_an_allowed_transition_returns_the_new_state_and_is_observed():
    seen = []
    stop = observe_transitions(lambda *move: seen.append(move))
    try:
        assert advance(Entity.CAMPAIGN, "queued", CampaignState.RUNNING) is CampaignState.RUNNING
        with pytest.raises(ForbiddenTransition):
            advance(Entity.CAMPAIGN, CampaignState.CANCELLED, CampaignState.RUNNING)
    finally:
        stop()
    advance(Entity.PLAN, PlanState.FAILED, PlanState.BUILDING)
    assert seen == [(Entity.CAMPAIGN, CampaignState.QUEUED, CampaignState.RUNNING)]


def test_an_attempts_state_is_read_from_its_row():
    now = datetime.now(UTC)
    assert attempt_state(started_at=None, ended_at=None, failure_class=None) == AttemptState.CLAIMED
    assert attempt_state(started_at=now, ended_at=None, failure_class=None) == AttemptState.RUNNING
    assert attempt_state(started_at=now, ended_at=now, failure_class=None) == AttemptState.SUCCEEDED
    assert attempt_state(started_at=now, ended_at=now, failure_class="oom") == AttemptState.FAILED
    assert attempt_state(started_at=None, ended_at=now, failure_class="cancelled") == AttemptState.CANCELLED


def test_the_api_lists_its_states_from_the_enums():
    assert CAMPAIGN_STATES == tuple(CampaignState) and REALIZATION_STATES == tuple(RealizationState)
    assert [str(state) for state in REALIZATION_STATES] == [
        "queued", "claimed", "running", "succeeded", "failed", "cancelled",
    ]  # fmt: skip
