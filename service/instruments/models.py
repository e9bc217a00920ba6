from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSE_IDS, Base, BigId, utcnow


class InstrumentUpload(Base):
    """One user's upload of an instrument file: the bytes are kept once by checksum, each uploader has a row.

    The rows are what a user's quota counts and what a delete removes; the file goes when no row names it.
    """

    __tablename__ = "instrument_uploads"
    __table_args__ = (UniqueConstraint("owner_id", "sha256"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    owner_id: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    entries: Mapped[int] = mapped_column(Integer, doc="Detectors of a focal plane, scans of a schedule")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
