"""Settings of the campaign service: environment variables ``MAPCAMPAIGN_*``, safe defaults.

The default is the embedded deployment: a SQLite file in the data folder and
the API on the loopback interface only.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1 << 20


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "mapcampaign"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MAPCAMPAIGN_", extra="ignore", validate_default=True)

    data_dir: Path = Field(default_factory=default_data_dir, description="Database (SQLite), tokens, products")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; unset means the embedded SQLite file <data_dir>/mapcampaign.sqlite3"
    )
    auto_migrate: bool | None = Field(
        None, description="Run migrations at start; default: only for the embedded SQLite database"
    )
    instrument_root: Path | None = Field(
        None,
        description="Folder that a spec's focal_plane.file and schedule file paths are relative to (the files the "
        "sites see under their instrument_root), and where uploaded instrument files are kept (uploads/); unset: "
        "campaigns naming such a file, and uploads, are refused",
    )
    host: str = Field("127.0.0.1", min_length=1, description="Listen address; loopback only unless told")
    port: int = Field(8765, ge=1, le=65_535)
    lease_s: float = Field(300.0, ge=0.05, le=7 * 86_400, description="Lease of a claimed task; heartbeats renew it")
    reaper_interval_s: float = Field(10.0, ge=0.01, le=3_600, description="How often expired leases are collected")
    max_plan_builds: int = Field(3, ge=1, le=100, description="Build attempts of a plan before its campaigns fail")
    max_json_body_bytes: int = Field(1 * MIB, ge=1_024, le=1 << 30)
    max_result_body_bytes: int = Field(16 * MIB, ge=1_024, le=1 << 31, description="Body of a succeeded report")
    max_artifact_bytes: int = Field(4 << 30, ge=1_024, le=1 << 40, description="One uploaded product file")
    max_upload_bytes: int = Field(
        256 * MIB, ge=1_024, le=1 << 40, description="One uploaded instrument file (a TOAST focal plane or schedule)"
    )
    max_spectrum_bytes: int = Field(
        1_280 * MIB,
        ge=1_024,
        le=1 << 40,
        description="The map of one POST /spectrum (an nside 2048 I, Q, U map in float64 is 1,152 MiB)",
    )
    upload_quota_bytes: int = Field(
        1 << 30, ge=1_024, le=1 << 50, description="Instrument-file bytes one user may keep uploaded, all files"
    )
    upload_file_mode: str = Field(
        "0640",
        pattern=r"^0?[0-7]{3}$",
        description="Permissions of an uploaded instrument file, octal (0640: the site group can read it)",
    )
    body_timeout_s: float = Field(
        30.0,
        ge=0.1,
        le=3_600,
        description="A JSON request body must arrive whole within this (else 408), before the request takes a turn",
    )
    upload_idle_timeout_s: float = Field(
        60.0,
        ge=0.1,
        le=3_600,
        description="An upload (instrument file, spectrum map, product file) that sends nothing for this long: 408",
    )
    spectrum_per_user: int = Field(
        1, ge=1, le=64, description="POST /spectrum requests one user may have running at once in one API process (more: 429)"
    )
    sqlite_busy_timeout_ms: int = Field(30_000, ge=100, le=600_000)
    db_pool_size: int = Field(10, ge=1, le=200)
    max_concurrent_requests: int | None = Field(
        None,
        ge=1,
        le=400,
        description="Requests that may use the database at once (others wait their turn); default: db_pool_size",
    )
    admission_timeout_s: float = Field(
        30.0, ge=0.1, le=600, description="A request waiting longer for its turn is answered 503 busy"
    )
    events_poll_s: float = Field(0.5, ge=0.01, le=60, description="How often an SSE stream looks for new events")
    sse_keepalive_s: float = Field(15.0, ge=0.1, le=600)
    throughput_window_s: float = Field(3_600.0, ge=1, le=30 * 86_400)
    page_size_max: int = Field(500, ge=1, le=10_000)
    log_level: str = Field("info")
    # Dashboard (web pages at /): a signed session cookie made from a user's API token.
    session_secret: SecretStr | None = Field(
        None,
        min_length=32,
        description="Key that signs dashboard session cookies; unset: a random key kept in <data_dir>/session.key",
    )
    session_max_age_s: float = Field(12 * 3_600.0, ge=60, le=30 * 86_400, description="Life of a dashboard login")
    cookie_secure: bool = Field(False, description="Mark the session cookie Secure (set when served over HTTPS)")
    admin_users: str | None = Field(
        None,
        description="User names (comma-separated) who read every user's preprocessing plans (GET /plans), with "
        "their sites and paths; unset: none, every user reads only the plans their own campaigns need",
    )
    metrics_token: SecretStr | None = Field(
        None,
        min_length=32,
        description="Bearer token that GET /metrics requires (Prometheus: authorization credentials_file); unset: "
        "/metrics answers whoever reaches the API (aggregate counts and latencies only)",
    )
    keep_alive_s: int = Field(
        75,
        ge=6,
        le=3_600,
        description="An idle HTTP connection is closed after this. Longer than a client's own idle limit (httpx "
        "and the CLI: 5 s; nginx's upstream keep-alive: 60 s), so a client never sends on a connection the server "
        "is closing at that moment (the request would be lost: 'Server disconnected', or a 502 from the proxy)",
    )
    forwarded_allow_ips: str | None = Field(
        None,
        min_length=1,
        description="Reverse proxies (comma-separated IPs, or *) whose X-Forwarded-For/-Proto headers are believed; "
        "unset: none (the headers are ignored)",
    )

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        value = value.strip()
        scheme = value.split(":", 1)[0].lower()
        if not (scheme.startswith(("sqlite", "postgresql")) or scheme == "postgres"):
            raise ValueError("database_url must be a sqlite:/// or postgresql:// URL")
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        value = value.lower()
        if value not in ("critical", "error", "warning", "info", "debug"):
            raise ValueError("log_level must be one of critical, error, warning, info, debug")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.max_result_body_bytes < self.max_json_body_bytes:
            raise ValueError("max_result_body_bytes must be at least max_json_body_bytes")
        return self

    @property
    def embedded(self) -> bool:
        """True when the database is the default SQLite file in the data folder."""
        return self.database_url is None

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "mapcampaign.sqlite3"

    @property
    def effective_database_url(self) -> str:
        if self.database_url is None:
            return f"sqlite:///{self.sqlite_path}"
        url = self.database_url
        # psycopg 3 is the installed driver; plain postgresql:// would ask for psycopg2.
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url

    @property
    def should_auto_migrate(self) -> bool:
        return self.embedded if self.auto_migrate is None else self.auto_migrate

    @property
    def admin_user_names(self) -> frozenset[str]:
        return frozenset(name.strip() for name in (self.admin_users or "").split(",") if name.strip())

    @property
    def products_dir(self) -> Path:
        return self.data_dir / "campaigns"

    @property
    def upload_file_permissions(self) -> int:
        """``upload_file_mode`` as the number ``os.chmod`` takes."""
        return int(self.upload_file_mode, 8)

    @property
    def spectrum_work_dir(self) -> Path:
        """Where ``POST /spectrum`` writes a request's map and bandpowers while it runs."""
        return self.data_dir / "spectrum-work"

    @property
    def coupling_cache_dir(self) -> Path:
        """Mode couplings the service built for ``POST /spectrum``, one file per coupling key and mask."""
        return self.data_dir / "couplings"

    @property
    def tokens_dir(self) -> Path:
        return self.data_dir / "tokens"

    @property
    def session_key_path(self) -> Path:
        return self.data_dir / "session.key"


@lru_cache
def get_settings() -> Settings:
    return Settings()
