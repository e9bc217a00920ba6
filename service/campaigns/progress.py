"""A campaign's progress, read in one statement: counts by state, throughput over a window, an estimate of the end."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    ScalarSelect,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from schemas.api import (
    REALIZATION_STATES,
    CampaignProgress,
)
from schemas.states import (
    FINISHED_CAMPAIGN_STATES,
    UNFINISHED_REALIZATION_STATES,
    RealizationState,
)
from service.campaigns.models import Attempt, Campaign, Realization, RealizationCount
from service.db import utcnow

# What a campaign's summary and progress read: its ORM row, or a row of a statement with the same names.
CampaignFields = Campaign | Row[Any]


def state_counts(*, session: Session, campaign_id: int) -> dict[RealizationState, int]:
    counts = dict.fromkeys(REALIZATION_STATES, 0)
    # Kept by the database's triggers (migration 0005): a few rows, whatever the campaign's size.
    rows = session.execute(
        select(RealizationCount.state, RealizationCount.count).where(RealizationCount.campaign_id == campaign_id)
    )
    for state, count in rows:
        counts[state] = count
    return counts


_FINISHED = (RealizationState.SUCCEEDED, RealizationState.FAILED)


def one_of(column: Any, values: Iterable[Any]) -> ColumnElement[bool]:
    """``column IN values`` as ORed equalities: plain parameters, where an IN list is an expanding parameter
    that SQLAlchemy rewrites the statement's parameters for at every execution (a prebuilt statement's)."""
    return or_(*(column == value for value in values))


def progress_columns(campaign_id: Any, since: Any) -> list[ScalarSelect[Any]]:
    """The progress figures of campaign ``campaign_id`` as scalar subqueries of one row, in this order: the
    count of each state of ``REALIZATION_STATES`` (primary-key lookups in the triggers' table), the
    realisations finished since ``since`` and the first claim since then (the throughput's numerator and
    start, over the indexes on ``(campaign_id, finished_at)`` and ``(campaign_id, claimed_at)``).

    ``campaign_id`` and ``since`` are values or SQL expressions (a column of an outer campaigns row).
    """
    counts = [
        select(RealizationCount.count)
        .where(RealizationCount.campaign_id == campaign_id, RealizationCount.state == state)
        .scalar_subquery()
        for state in REALIZATION_STATES
    ]
    recent = (
        select(func.count())
        .select_from(Realization)
        .where(
            Realization.campaign_id == campaign_id,
            Realization.finished_at >= since,
            one_of(Realization.state, _FINISHED),
        )
        .scalar_subquery()
    )
    first_claim = (
        select(func.min(Attempt.claimed_at))
        .where(Attempt.campaign_id == campaign_id, Attempt.claimed_at >= since)
        .scalar_subquery()
    )
    return [*counts, recent, first_claim]


def progress_from_row(
    campaign: CampaignFields, figures: Sequence[Any], *, now: datetime, window_start: datetime
) -> CampaignProgress:
    """:class:`CampaignProgress` from the values of :func:`progress_columns` (``figures``, in its order)."""
    per_state = {state: int(count or 0) for state, count in zip(REALIZATION_STATES, figures, strict=False)}
    return _progress_of(
        campaign,
        per_state,
        recent=int(figures[-2] or 0),
        first_claim=figures[-1],
        ended=_ended(campaign),
        now=now,
        window_start=window_start,
    )


def _ended(campaign: CampaignFields) -> bool:
    """Whether the campaign's throughput is over its active span (it ended) rather than the recent window."""
    return campaign.state in FINISHED_CAMPAIGN_STATES and campaign.finished_at is not None


def progress(*, session: Session, campaign: Campaign, window_s: float) -> CampaignProgress:
    """One campaign's progress in one statement: :func:`progress_columns` (the same figures as
    :func:`progress_many`)."""
    now = utcnow()
    window_start = now - timedelta(seconds=window_s)
    since = campaign.queued_at if _ended(campaign) else window_start
    figures = session.execute(select(*progress_columns(campaign.id, since))).one()
    return progress_from_row(campaign, figures, now=now, window_start=window_start)


def _progress_of(
    campaign: CampaignFields,
    per_state: dict[RealizationState, int],
    *,
    recent: int,
    first_claim: datetime | None,
    ended: bool,
    now: datetime,
    window_start: datetime,
) -> CampaignProgress:
    done = sum(per_state[state] for state in RealizationState if state not in UNFINISHED_REALIZATION_STATES)
    remaining = sum(per_state[state] for state in UNFINISHED_REALIZATION_STATES)
    throughput = eta = None
    if recent:
        if ended:
            assert campaign.finished_at is not None  # what ``ended`` means
            span_start, span_end = first_claim or campaign.queued_at, campaign.finished_at
        else:
            span_start, span_end = max(window_start, first_claim or campaign.queued_at), now
        hours = max((span_end - span_start).total_seconds(), 1.0) / 3600
        throughput = recent / hours
        if remaining and campaign.state not in FINISHED_CAMPAIGN_STATES:
            eta = remaining / throughput * 3600
    return CampaignProgress(
        counts=per_state, done=done, total=campaign.realizations, throughput_per_hour=throughput, eta_seconds=eta
    )


def progress_many(*, session: Session, campaigns: list[Campaign], window_s: float) -> dict[int, CampaignProgress]:
    """Progress of several campaigns in a few grouped queries, whatever their number (pages list many).

    Throughput (realisations per hour) of a campaign still running: those finished in the last
    ``window_s`` seconds over the time since the window's start (or the first claim in it). Of a finished
    campaign: those finished over its active span, first claim (since its last queueing) to its end; it
    stays what it was at the end instead of falling with the wall clock.
    """
    if not campaigns:
        return {}
    ids = [campaign.id for campaign in campaigns]
    counts = {campaign_id: dict.fromkeys(REALIZATION_STATES, 0) for campaign_id in ids}
    rows = session.execute(  # kept by the database's triggers (migration 0005)
        select(RealizationCount.campaign_id, RealizationCount.state, RealizationCount.count).where(
            RealizationCount.campaign_id.in_(ids)
        )
    )
    for campaign_id, state, count in rows:
        counts[campaign_id][state] = count
    ended = {c.id for c in campaigns if _ended(c)}
    running = [campaign_id for campaign_id in ids if campaign_id not in ended]
    now = utcnow()
    window_start = now - timedelta(seconds=window_s)
    finished_in_span: dict[int, int] = {}
    span_starts: dict[int, Any] = {}
    if running:
        finished_in_span.update(
            session.execute(
                select(Realization.campaign_id, func.count())
                .where(
                    Realization.campaign_id.in_(running),
                    Realization.state.in_((RealizationState.SUCCEEDED, RealizationState.FAILED)),
                    Realization.finished_at >= window_start,
                )
                .group_by(Realization.campaign_id)
            ).all()
        )
    if ended:
        finished_in_span.update(
            session.execute(
                select(Realization.campaign_id, func.count())
                .join(Campaign, Campaign.id == Realization.campaign_id)
                .where(
                    Realization.campaign_id.in_(list(ended)),
                    Realization.state.in_((RealizationState.SUCCEEDED, RealizationState.FAILED)),
                    Realization.finished_at >= Campaign.queued_at,
                )
                .group_by(Realization.campaign_id)
            ).all()
        )
    recent_running = [campaign_id for campaign_id in running if finished_in_span.get(campaign_id)]
    if recent_running:
        span_starts.update(
            session.execute(
                select(Attempt.campaign_id, func.min(Attempt.claimed_at))
                .where(Attempt.campaign_id.in_(recent_running), Attempt.claimed_at >= window_start)
                .group_by(Attempt.campaign_id)
            ).all()
        )
    recent_ended = [campaign_id for campaign_id in ended if finished_in_span.get(campaign_id)]
    if recent_ended:
        span_starts.update(
            session.execute(
                select(Attempt.campaign_id, func.min(Attempt.claimed_at))
                .join(Campaign, Campaign.id == Attempt.campaign_id)
                .where(Attempt.campaign_id.in_(recent_ended), Attempt.claimed_at >= Campaign.queued_at)
                .group_by(Attempt.campaign_id)
            ).all()
        )
    return {
        campaign.id: _progress_of(
            campaign,
            counts[campaign.id],
            recent=finished_in_span.get(campaign.id, 0),
            first_claim=span_starts.get(campaign.id),
            ended=campaign.id in ended,
            now=now,
            window_start=window_start,
        )
        for campaign in campaigns
    }
