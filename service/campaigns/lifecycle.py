"""A campaign's life after creation: its state follows its realisations; cancel, retry, extend, delete."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.orm import Session

from schemas.spec import MAX_REALIZATIONS
from schemas.states import (
    FINISHED_CAMPAIGN_STATES,
    UNFINISHED_REALIZATION_STATES,
    AttemptState,
    CampaignState,
    Entity,
    RealizationState,
    advance,
    advance_each,
    attempt_state,
)
from service.campaigns.creation import queued_realizations
from service.campaigns.errors import (
    CampaignAlreadyFinished,
    CampaignNotFinished,
)
from service.campaigns.models import Attempt, Campaign, Realization
from service.campaigns.progress import state_counts
from service.campaigns.reads import get_campaign
from service.db import utcnow
from service.errors import InvalidField
from service.events.service import record_event
from service.storage import CampaignStorage

log = logging.getLogger("mapcampaign.service")


def settle_campaign(*, session: Session, campaign: Campaign, release: bool = False) -> None:
    """Make the campaign's state follow its realisations. Call with the campaign row locked.

    A held campaign stays held while it has realisations to run, unless ``release`` (a retry).
    """
    if campaign.state == CampaignState.CANCELLED:
        return
    counts = state_counts(session=session, campaign_id=campaign.id)
    unfinished = sum(counts[state] for state in UNFINISHED_REALIZATION_STATES)
    if campaign.state == CampaignState.HELD and unfinished and not release:
        return  # held until its owner releases it (a retry), or until nothing of it is left to run
    before = campaign.state
    failed = counts[RealizationState.FAILED]
    if unfinished == 0:
        settled = CampaignState.FAILED if failed else CampaignState.SUCCEEDED
        if campaign.state == CampaignState.HELD and not release:
            pass  # ended while held: the hold's reason stays the cause
        elif failed and not campaign.failure_cause:
            campaign.failure_cause = f"{failed} of {campaign.realizations} realisations failed"
        campaign.finished_at = campaign.finished_at or utcnow()
    else:
        started = campaign.realizations - counts[RealizationState.QUEUED] - counts[RealizationState.CANCELLED]
        settled = CampaignState.RUNNING if started > 0 else CampaignState.QUEUED
        campaign.finished_at = None
    if settled != before:
        campaign.state = advance(Entity.CAMPAIGN, before, settled)
        record_event(
            session,
            "campaign",
            state=campaign.state,
            owner_id=campaign.owner_id,
            campaign_id=campaign.id,
            data={"from": before, "failure_cause": campaign.failure_cause},
        )


def end_open_attempts(*, session: Session, campaign_id: int, failure_class: str) -> None:
    """Close every attempt of the campaign still open (no end time), e.g. at cancel: one statement."""
    now = utcnow()
    ended = attempt_state(started_at=None, ended_at=now, failure_class=failure_class)
    # An open attempt is claimed or running (its state is read from its times): both may end so.
    advance_each(Entity.ATTEMPT, (AttemptState.CLAIMED, AttemptState.RUNNING), ended)
    session.execute(
        update(Attempt)
        .where(Attempt.campaign_id == campaign_id, Attempt.ended_at.is_(None))
        .values(ended_at=now, failure_class=failure_class),
        execution_options={"synchronize_session": False},
    )


def cancel_campaign(*, session: Session, owner_id: int, campaign_id: int, reason: str) -> Campaign:
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state in FINISHED_CAMPAIGN_STATES:
        raise CampaignAlreadyFinished(f"campaign {campaign_id} is already {campaign.state}; nothing to cancel")
    fail_unfinished(session=session, campaign=campaign, state=RealizationState.CANCELLED, failure_class="cancelled")
    campaign.state = advance(Entity.CAMPAIGN, campaign.state, CampaignState.CANCELLED)
    campaign.cancel_reason = reason
    campaign.finished_at = utcnow()
    record_event(
        session, "campaign", state=campaign.state, owner_id=owner_id, campaign_id=campaign.id, data={"reason": reason}
    )
    session.commit()
    return campaign


def fail_unfinished(*, session: Session, campaign: Campaign, state: RealizationState, failure_class: str) -> int:
    """Move every unfinished realisation of a locked campaign to ``state``, close its open attempts; return how many.

    Set-based by campaign, whatever its size (a list of ids is bounded by the database's bind parameters).
    """
    # The transition table is checked here for each source state the WHERE clause admits; a row in any
    # other state is left as it is, so no forbidden transition can happen.
    new_state = advance_each(Entity.REALIZATION, UNFINISHED_REALIZATION_STATES, state)
    unfinished = (Realization.campaign_id == campaign.id, Realization.state.in_(UNFINISHED_REALIZATION_STATES))
    # Rows locked by id first, like every multi-row lock (heartbeats, claims): no deadlock. Counted in the
    # database, so no id comes back; a statement of its own, so the UPDATE's plan cannot change the order.
    # SQLite has one write lock and drops the FOR UPDATE.
    locked_by_id = select(Realization.id).where(*unfinished).order_by(Realization.id).with_for_update().subquery()
    session.execute(select(func.count()).select_from(locked_by_id))
    now = utcnow()
    result = session.execute(
        update(Realization)
        .where(*unfinished)
        .values(
            state=new_state,
            lease_holder_id=None,
            lease_expires_at=None,
            current_attempt_id=None,
            finished_at=now,
            updated_at=now,
        ),
        execution_options={"synchronize_session": False},
    )
    moved = cast("CursorResult[Any]", result).rowcount or 0  # an UPDATE's result is a cursor's
    if not moved:
        return 0
    end_open_attempts(session=session, campaign_id=campaign.id, failure_class=failure_class)
    record_event(
        session,
        "realization",
        state=state,
        owner_id=campaign.owner_id,
        campaign_id=campaign.id,
        data={"count": moved, "bulk": True},
    )
    return moved


def retry_failed(*, session: Session, owner_id: int, campaign_id: int) -> tuple[Campaign, int]:
    """Put failed realisations back in the queue with a fresh attempt budget; release a held campaign."""
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state == CampaignState.CANCELLED:
        raise CampaignAlreadyFinished(f"campaign {campaign_id} was cancelled; submit it again instead")
    result = session.execute(
        update(Realization)
        .where(Realization.campaign_id == campaign.id, Realization.state == RealizationState.FAILED)
        .values(
            state=advance(Entity.REALIZATION, RealizationState.FAILED, RealizationState.QUEUED),
            attempts=0,
            lease_holder_id=None,
            lease_expires_at=None,
            current_attempt_id=None,
            finished_at=None,
            updated_at=utcnow(),
        ),
        execution_options={"synchronize_session": False},
    )
    requeued = cast("CursorResult[Any]", result).rowcount or 0  # an UPDATE's result is a cursor's
    held = campaign.state == CampaignState.HELD
    if requeued or held:
        campaign.failure_cause = None
        campaign.finished_at = None
        campaign.queued_at = utcnow()  # also where fail fast starts counting again
        record_event(
            session,
            "realization",
            state=RealizationState.QUEUED,
            owner_id=owner_id,
            campaign_id=campaign.id,
            data={"count": requeued, "bulk": True, "retry": True},
        )
        settle_campaign(session=session, campaign=campaign, release=held)
    session.commit()
    return campaign, requeued


def extend_campaign(*, session: Session, owner_id: int, campaign_id: int, more: int) -> Campaign:
    """Add ``more`` queued realisations after the last one; a finished campaign runs again.

    The new realisations share the campaign's spec (its hash leaves the count out), scan key and plan, and
    their results go into the same aggregates; their seeds are keyed by their new indices, so no two
    realisations of the campaign draw the same skies or noise. A cancelled campaign is refused (409).
    """
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state == CampaignState.CANCELLED:
        raise CampaignAlreadyFinished(f"campaign {campaign_id} was cancelled; clone it to run its spec again")
    total = campaign.realizations + more
    if total > MAX_REALIZATIONS:
        raise InvalidField(
            ("body", "realizations"),
            f"the campaign has {campaign.realizations}; {more} more would make {total}, over {MAX_REALIZATIONS}",
        )
    now = utcnow()
    first = campaign.realizations
    session.execute(queued_realizations(campaign_id=campaign.id, count=more, now=now, first=first))
    campaign.realizations = total
    campaign.failure_cause = None if campaign.state != CampaignState.FAILED else campaign.failure_cause
    record_event(
        session,
        "campaign",
        state=campaign.state,
        owner_id=owner_id,
        campaign_id=campaign.id,
        data={"extended": more, "realizations": total, "first_new": first},
    )
    if campaign.state in (CampaignState.SUCCEEDED, CampaignState.FAILED):
        campaign.queued_at = now
    settle_campaign(session=session, campaign=campaign)
    session.commit()
    log.info("campaign %d extended by %d to %d realisations", campaign.id, more, total)
    return campaign


def delete_campaign(*, session: Session, owner_id: int, campaign_id: int, products_dir: Path) -> None:
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state not in FINISHED_CAMPAIGN_STATES:
        raise CampaignNotFinished(f"campaign {campaign_id} is {campaign.state}; cancel it before deleting it")
    session.execute(delete(Attempt).where(Attempt.campaign_id == campaign.id))
    session.execute(delete(Realization).where(Realization.campaign_id == campaign.id))
    session.execute(delete(Campaign).where(Campaign.id == campaign.id))
    record_event(session, "campaign", state="deleted", owner_id=owner_id, campaign_id=campaign.id)
    session.commit()
    CampaignStorage(products_dir).delete_campaign(campaign.id)
