from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from schemas.states import AttemptState, CampaignState, RealizationState, attempt_state
from service.db import NEVER_REUSE_IDS, Base, BigId, state_type, utcnow


class Campaign(Base):
    __tablename__ = "campaigns"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key"),
        Index("ix_campaigns_owner_id_id", "owner_id", "id"),
        Index("ix_campaigns_state_priority", "state", "priority"),
        NEVER_REUSE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="RESTRICT"))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(32))
    priority: Mapped[int] = mapped_column(Integer)
    max_attempts: Mapped[int] = mapped_column(Integer)
    realizations: Mapped[int] = mapped_column(Integer)
    ranks: Mapped[int] = mapped_column(Integer, doc="MPI ranks per realisation: with scan_key, names the plan")
    scan_key: Mapped[str] = mapped_column(String(64), index=True)
    spec_hash: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    # What the spec's focal-plane and schedule files said at submit (campaignlib.instrument.instrument_summary), for
    # the dashboard; deferred, so listing campaigns does not load up to 2,000 detectors each.
    instrument_summary: Mapped[dict[str, Any] | None] = mapped_column(default=None, deferred=True)
    state: Mapped[CampaignState] = mapped_column(state_type(CampaignState), default=CampaignState.QUEUED)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    queued_at: Mapped[datetime] = mapped_column(default=utcnow, doc="Creation, or the last retry")
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    cancel_reason: Mapped[str | None] = mapped_column(Text, default=None)
    failure_cause: Mapped[str | None] = mapped_column(Text, default=None)


class Realization(Base):
    __tablename__ = "realizations"
    __table_args__ = (
        UniqueConstraint("campaign_id", "index"),
        # The claim walks this index: a campaign's queued realisations in index order.
        Index("ix_realizations_campaign_id_state_index", "campaign_id", "state", "index"),
        Index("ix_realizations_state_lease_expires_at", "state", "lease_expires_at"),
        # The throughput figure: a campaign's realisations finished in the last window.
        Index("ix_realizations_campaign_id_finished_at", "campaign_id", "finished_at"),
        NEVER_REUSE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    state: Mapped[RealizationState] = mapped_column(state_type(RealizationState), default=RealizationState.QUEUED)
    attempts: Mapped[int] = mapped_column(Integer, default=0, doc="Attempts used from the current budget")
    attempts_total: Mapped[int] = mapped_column(Integer, default=0, doc="Attempts ever made (numbers attempts)")
    current_attempt_id: Mapped[int | None] = mapped_column(BigId, default=None)
    lease_holder_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    result: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class RealizationCount(Base):
    """How many of a campaign's realisations are in each state: what a status read shows.

    Written only by the database's triggers on ``realizations`` (migration 0005), in the
    transaction of each change; the service reads it and never writes it.
    """

    __tablename__ = "realization_counts"

    campaign_id: Mapped[int] = mapped_column(BigId, ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[RealizationState] = mapped_column(state_type(RealizationState), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)


class Attempt(Base):
    """One try at one realisation: who ran it, where, how it ended."""

    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_realization_id_number", "realization_id", "number"),
        # A campaign's attempts; the throughput's first claim in a window is one lookup (migration 0007).
        Index("ix_attempts_campaign_id_claimed_at", "campaign_id", "claimed_at"),
        NEVER_REUSE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    realization_id: Mapped[int] = mapped_column(ForeignKey("realizations.id", ondelete="CASCADE"))
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("preprocessing_plans.id", ondelete="SET NULL"))
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"))
    host: Mapped[str | None] = mapped_column(String(255), default=None)
    scheduler_job_id: Mapped[str | None] = mapped_column(String(255), default=None)
    claimed_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    failure_class: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    log_tail: Mapped[str | None] = mapped_column(Text, default=None)

    realization: Mapped[Realization] = relationship()

    @property
    def state(self) -> AttemptState:
        return attempt_state(started_at=self.started_at, ended_at=self.ended_at, failure_class=self.failure_class)
