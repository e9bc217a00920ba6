from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from schemas.states import PlanState
from service.db import NEVER_REUSE_IDS, Base, BigId, state_type, utcnow


class PreprocessingPlan(Base):
    """The overlap preprocessing of one (scan key, ranks) at one site; shared by every campaign that needs it."""

    __tablename__ = "preprocessing_plans"
    __table_args__ = (UniqueConstraint("scan_key", "ranks", "site"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    scan_key: Mapped[str] = mapped_column(String(64))
    ranks: Mapped[int] = mapped_column(Integer)
    site: Mapped[str] = mapped_column(String(128))
    state: Mapped[PlanState] = mapped_column(state_type(PlanState), default=PlanState.BUILDING)
    path: Mapped[str | None] = mapped_column(Text, default=None)
    checksum: Mapped[str | None] = mapped_column(String(200), default=None)
    build_time_s: Mapped[float | None] = mapped_column(Float, default=None)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    build_attempts: Mapped[int] = mapped_column(Integer, default=0, doc="Builds used from the current budget")
    build_number: Mapped[int] = mapped_column(Integer, default=0, doc="Builds ever started: numbers the task ids")
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    campaign_id: Mapped[int | None] = mapped_column(BigInteger, default=None, doc="Campaign whose spec the build uses")
    lease_holder_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(default=None)
    failed_at: Mapped[datetime | None] = mapped_column(default=None)


class ModeCoupling(Base):
    """The bandpowers' mode-coupling file of one coupling key at one site (``schemas.spec.coupling_key``).

    Built by the first realisation that needs it and read by the next ones; recorded when their results
    are accepted (``service.queue.couplings``): what the file is (checksum, size), what building it cost,
    how many accepted realisations used it.
    """

    __tablename__ = "couplings"
    __table_args__ = (UniqueConstraint("site", "coupling_key"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    coupling_key: Mapped[str] = mapped_column(String(64))
    site: Mapped[str] = mapped_column(String(128))
    scan_key: Mapped[str] = mapped_column(String(64), index=True)
    mask_sha256: Mapped[str] = mapped_column(String(64))
    file_sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    build_time_s: Mapped[float | None] = mapped_column(Float, default=None, doc="None until the builder's result is in")
    built_at: Mapped[datetime | None] = mapped_column(default=None, doc="When the builder's result was accepted")
    uses: Mapped[int] = mapped_column(Integer, default=0, doc="Accepted realisation results that used the file")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class CouplingCampaign(Base):
    """A campaign whose accepted results used a coupling."""

    __tablename__ = "coupling_campaigns"

    coupling_id: Mapped[int] = mapped_column(BigId, ForeignKey("couplings.id", ondelete="CASCADE"), primary_key=True)
    campaign_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True, index=True
    )
