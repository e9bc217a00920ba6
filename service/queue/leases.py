"""Lease arithmetic, in one place."""

from __future__ import annotations

from datetime import datetime, timedelta

from service.db import utcnow


def lease_expiry(lease_s: float, now: datetime | None = None) -> datetime:
    return (now or utcnow()) + timedelta(seconds=lease_s)
