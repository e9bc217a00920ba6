from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSE_IDS, Base, BigId, utcnow


class Worker(Base):
    __tablename__ = "workers"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    site: Mapped[str] = mapped_column(String(128))
    host: Mapped[str] = mapped_column(String(255))
    capacity: Mapped[int] = mapped_column(Integer, default=1)
    data_dir: Mapped[str | None] = mapped_column(
        String(4096), default=None, doc="The site's data folder on the worker's host: its plan paths lie inside"
    )
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), doc="Registered by")
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    sky_maps: Mapped[list[str] | None] = mapped_column(
        JSON(none_as_null=True), default=None, doc="Sky-map files under its site's sky_root, as it declared them (None: no sky_root)"
    )
