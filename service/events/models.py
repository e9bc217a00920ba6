from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSE_IDS, Base, BigId, utcnow


class Event(Base):
    """One state change. Ids increase in commit order (see service.events.service)."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_campaign_id_id", "campaign_id", "id"),
        Index("ix_events_kind_state", "kind", "state"),
        NEVER_REUSE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str | None] = mapped_column(String(32), default=None)
    # Plain columns, not foreign keys: the log outlives a deleted campaign.
    owner_id: Mapped[int | None] = mapped_column(BigInteger, default=None)
    campaign_id: Mapped[int | None] = mapped_column(BigInteger, default=None)
    realization: Mapped[int | None] = mapped_column(Integer, default=None)
    plan_id: Mapped[int | None] = mapped_column(BigInteger, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
