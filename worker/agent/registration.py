"""Registration: tell the service who this worker is, trying again while it cannot be reached."""

from __future__ import annotations

import logging

from schemas.api import WorkerRegistration
from worker.agent.state import AgentState
from worker.client import NotAuthorized, ServiceError
from worker.site import declared_sky_maps

log = logging.getLogger("mapcampaign.worker")

FIRST_RETRY_S = 1.0
LONGEST_RETRY_S = 30.0


class Registration(AgentState):
    def _registration(self) -> WorkerRegistration:
        return WorkerRegistration(
            name=self.name,
            site=self.site.name,
            host=self.host[:255],
            capacity=self.site.max_tasks,
            sky_maps=declared_sky_maps(self.site.sky_root),
            data_dir=str(self.layout.root),
        )

    def _register(self) -> bool:
        """Register (``worker_id`` set) and say True; False when refused or stopped before the service answered."""
        registration = self._registration()
        pause = FIRST_RETRY_S
        while True:
            try:
                info = self.client.register(registration, retry_s=0)
            except NotAuthorized as error:
                log.error(
                    "the service refused the worker token: %s (make one with `mapcampaign token create --worker`)",
                    error,
                )
                return False
            except ServiceError as error:
                if error.status is not None:
                    log.error("registration refused: %s", error)
                    return False
                log.warning(
                    "cannot reach the service at %s (%s); trying again in %.0f s", self.settings.server, error, pause
                )
                if self.clock.wait(self.quit, pause):
                    return False
                pause = min(pause * 2, LONGEST_RETRY_S)
                continue
            self.worker_id = info.id
            if self.site_store is not None:
                self.site_store.worker_id = info.id
            log.info(
                "worker %s (id %d) registered for site %r at %s: %d tasks at once, data in %s",
                self.name, info.id, self.site.name, self.settings.server, registration.capacity, self.layout.root,
            )  # fmt: skip
            return True
