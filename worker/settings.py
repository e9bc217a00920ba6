"""Settings of the worker: environment variables ``MAPCAMPAIGN_*`` (pydantic-settings), overridden by the CLI.

=================================== ============================================= =======================================
variable                            default                                       meaning
=================================== ============================================= =======================================
``MAPCAMPAIGN_SITE``                (required, or ``--site``)                     site file (``deploy/sites/*.toml``)
``MAPCAMPAIGN_SERVER``              ``http://127.0.0.1:8765``                     the service's root URL
``MAPCAMPAIGN_TOKEN_FILE``          ``<data dir>/tokens/local-worker.token``      file holding a worker token
``MAPCAMPAIGN_WORKER_NAME``         ``<site>@<short host name>``                  stable name; registering again updates it
``MAPCAMPAIGN_DATA_DIR``            ``${XDG_DATA_HOME:-~/.local/share}/mapcampaign`` parent of the site data (``sites/<site>``)
``MAPCAMPAIGN_WORKER_POLL_S``       2                                             pause between claims while the queue is empty
``MAPCAMPAIGN_WORKER_HEARTBEAT_S``  a third of the lease                          heartbeat interval
``MAPCAMPAIGN_WORKER_DRAIN_S``      300                                           on SIGTERM: how long running tasks may finish
``MAPCAMPAIGN_WORKER_TIMEOUT_S``    30                                            one HTTP request to the service
``MAPCAMPAIGN_WORKER_REPORT_RETRY_S`` 300                                         how long a report is retried while the
                                                                                  service is out of reach or busy
``MAPCAMPAIGN_WORKER_KEEP_WORK``    false                                         keep the work folders of succeeded tasks
``MAPCAMPAIGN_LOG_LEVEL``           ``info``                                      worker logging
=================================== ============================================= =======================================
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.api import NAME_PATTERN


def default_data_dir() -> Path:
    """The service's default data folder (``service.config.default_data_dir``; the worker does not import the service)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "mapcampaign"


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MAPCAMPAIGN_", extra="ignore", populate_by_name=True)

    site: Path | None = Field(None, description="Site file")
    server: str = Field("http://127.0.0.1:8765", description="Root URL of the service (no /api/v1)")
    token_file: Path | None = Field(None, description="Worker token file; default <data_dir>/tokens/local-worker.token")
    name: str | None = Field(None, validation_alias="MAPCAMPAIGN_WORKER_NAME", description="Worker name")
    data_dir: Path = Field(default_factory=default_data_dir)
    poll_s: float = Field(2.0, ge=0.05, le=3_600, validation_alias="MAPCAMPAIGN_WORKER_POLL_S")
    heartbeat_s: float | None = Field(None, ge=0.05, le=3_600, validation_alias="MAPCAMPAIGN_WORKER_HEARTBEAT_S")
    drain_s: float = Field(300.0, ge=0, le=7 * 86_400, validation_alias="MAPCAMPAIGN_WORKER_DRAIN_S")
    timeout_s: float = Field(30.0, ge=1, le=3_600, validation_alias="MAPCAMPAIGN_WORKER_TIMEOUT_S")
    # A report is worth retrying as long as the task's lease may still be alive: the service's default
    # lease (300 s) by default, so that a restart of the service does not turn finished work into lost work.
    report_retry_s: float = Field(300.0, ge=0, le=86_400, validation_alias="MAPCAMPAIGN_WORKER_REPORT_RETRY_S")
    keep_work: bool = Field(False, validation_alias="MAPCAMPAIGN_WORKER_KEEP_WORK")
    log_level: str = Field("info")

    @field_validator("server")
    @classmethod
    def _url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8765")
        return value.removesuffix("/api/v1")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(NAME_PATTERN, value):
            raise ValueError("must be 1-128 letters, digits and _.:@+- starting with a letter or digit")
        return value

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        value = value.lower()
        if value not in ("critical", "error", "warning", "info", "debug"):
            raise ValueError("must be one of critical, error, warning, info, debug")
        return value

    @property
    def api_url(self) -> str:
        return self.server + "/api/v1"

    @property
    def effective_token_file(self) -> Path:
        return (self.token_file or self.data_dir / "tokens" / "local-worker.token").expanduser()

    def worker_name(self, site_name: str) -> str:
        return self.name or f"{site_name}@{socket.gethostname().split('.')[0]}"[:128]
