"""Moved to :mod:`service.auth.session`; this name stays while ``service.products`` imports ``DashboardUser`` here."""

from service.auth.session import DashboardUser

__all__ = ["DashboardUser"]
