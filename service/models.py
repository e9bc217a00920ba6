"""Every table of the service, imported in one place for Alembic and the metadata."""

from service.auth.models import ApiToken, LoginLink, User
from service.campaigns.models import Attempt, Campaign, Realization
from service.db import Base
from service.events.models import Event
from service.instruments.models import InstrumentUpload
from service.queue.models import PreprocessingPlan
from service.workers.models import Worker

metadata = Base.metadata

__all__ = [
    "ApiToken",
    "Attempt",
    "Campaign",
    "Event",
    "InstrumentUpload",
    "LoginLink",
    "PreprocessingPlan",
    "Realization",
    "User",
    "Worker",
    "metadata",
]
