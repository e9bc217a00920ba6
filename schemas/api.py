"""Messages of the service's REST API (``/api/v1``): the contract the worker and the CLI import.

Two families:

* what users read and write: campaigns, realisations, attempts, plans, events;
* the worker protocol: register, claim (which hands out :data:`Task` values),
  heartbeat, and the reports a worker makes about a task it holds.

Times are timezone-aware UTC datetimes; durations are seconds; sizes are bytes.

Task ids are strings the service makes: ``realize-<attempt id>`` for a
realisation attempt and ``preprocess-<plan id>-<build number>`` for one
build of an overlap plan. A worker passes them back verbatim.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.programs import MAX_LOG_TAIL_CHARS, MAX_MESSAGE_CHARS
from schemas.result import RealizationResult
from schemas.spec import CONTROL_CHARACTERS, MAX_REALIZATIONS, CampaignKind, CampaignSpec, Integer
from schemas.states import CampaignState, PlanState, RealizationState

API_PREFIX = "/api/v1"

FailureClass = Literal[
    "app_error", "walltime", "oom", "lost_worker", "node_failure", "drained", "launch_error", "site_error", "cancelled"
]
TokenKind = Literal["user", "worker"]

# The state tuples are the enums' own members, in order: one list to extend, not two.
CAMPAIGN_STATES: tuple[CampaignState, ...] = tuple(CampaignState)
REALIZATION_STATES: tuple[RealizationState, ...] = tuple(RealizationState)
FAILURE_CLASSES: tuple[str, ...] = get_args(FailureClass)

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
# The sky maps a worker declares at registration: a site with more files under its sky_root declares these
# first ones (sorted), and a spec naming another is refused at submit.
MAX_DECLARED_SKY_MAPS = 10_000
ARTIFACT_SHA256_HEADER = "X-Content-SHA256"

# Site and worker names appear in paths, logs and web pages.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$"
# A product file: one flat file name inside the realisation's product folder.
ARTIFACT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$"
_ARTIFACT_NAME = re.compile(ARTIFACT_NAME_PATTERN)


def is_valid_artifact_name(name: str) -> bool:
    return bool(_ARTIFACT_NAME.match(name)) and ".." not in name


# --------------------------------------------------------------------------- task ids


def realize_task_id(attempt_id: int) -> str:
    return f"realize-{attempt_id}"


def preprocess_task_id(plan_id: int, build_attempt: int) -> str:
    return f"preprocess-{plan_id}-{build_attempt}"


_TASK_ID = re.compile(r"^(?:realize-(\d{1,18})|preprocess-(\d{1,18})-(\d{1,9}))$")


def parse_task_id(task_id: str) -> tuple[Literal["realize"], int, None] | tuple[Literal["preprocess"], int, int] | None:
    """``("realize", attempt_id, None)``, ``("preprocess", plan_id, build_attempt)``, or None when malformed."""
    match = _TASK_ID.match(task_id)
    if not match:
        return None
    if match.group(1):
        return ("realize", int(match.group(1)), None)
    return ("preprocess", int(match.group(2)), int(match.group(3)))


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestModel(ApiModel):
    """Base of the bodies clients send. No text may hold NUL: PostgreSQL refuses it in a text column,
    so it would fail only there, and only once stored (see :class:`TaskFailed` for the log tail).
    Answers are not checked: what SQLite stored before this rule must still be readable."""

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("must not contain NUL characters (\\x00)")
        return value


# --------------------------------------------------------------------------- errors, health


class ErrorBody(ApiModel):
    """Every 4xx/5xx answer except 422: a sentence for a person and a stable code for a program."""

    detail: str
    code: str


class FieldProblem(ApiModel):
    field: str = Field(description="Dotted location, e.g. body.focal_plane.detectors.0.name")
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(ApiModel):
    detail: list[FieldProblem]
    code: Literal["invalid_request"] = "invalid_request"


class Health(ApiModel):
    status: Literal["ok", "unavailable"]
    database: str
    schema_revision: str | None = None


# --------------------------------------------------------------------------- campaigns


class CampaignSummary(ApiModel):
    id: int
    name: str
    owner: str
    kind: CampaignKind
    state: CampaignState
    priority: int
    max_attempts: int
    realizations: int
    scan_key: str
    spec_hash: str
    ranks: int
    created_at: datetime
    finished_at: datetime | None = None
    cancel_reason: str | None = None
    failure_cause: str | None = None


class CampaignProgress(ApiModel):
    counts: dict[RealizationState, int] = Field(description="Realisations per state; every state is present")
    done: int = Field(description="Realisations in a final state")
    total: int
    throughput_per_hour: float | None = Field(
        None, description="Realisations finished per hour over the recent window; None before the first one"
    )
    eta_seconds: float | None = Field(None, description="Remaining / throughput; None when unknown or finished")


class CampaignDetail(CampaignSummary):
    spec: CampaignSpec
    progress: CampaignProgress


class CampaignPage(ApiModel):
    items: list[CampaignSummary]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; None on the last page")


class CancelRequest(RequestModel):
    reason: str = Field("cancelled by the owner", max_length=1_000)


class ExtendRequest(RequestModel):
    """Add realisations to a campaign: new indices after the last, into the same aggregates and plan."""

    realizations: Integer = Field(ge=1, le=MAX_REALIZATIONS, description="How many realisations to add")


class CloneRequest(RequestModel):
    """A new campaign from an existing one's spec (as it stands, extensions included) with ``changes``
    merged in: nested tables merge key by key, any other value replaces the original."""

    changes: dict[str, Any] = Field(
        default_factory=dict, description='Partial spec, e.g. {"pixelization": {"nside": 128}, "name": "b"}'
    )


class RetryAnswer(ApiModel):
    requeued: int = Field(description="Failed realisations put back in the queue with a fresh attempt budget")
    campaign: CampaignSummary


# --------------------------------------------------------------------------- realisations and attempts


class AttemptInfo(ApiModel):
    id: int
    task_id: str
    number: int = Field(description="1, 2, ... over the life of the realisation (retries continue the count)")
    worker: str | None
    host: str | None
    scheduler_job_id: str | None
    claimed_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    failure_class: FailureClass | None
    log_tail: str | None


class RealizationSummary(ApiModel):
    index: int
    state: RealizationState
    attempts: int = Field(description="Attempts used from the current budget (max_attempts)")
    lease_holder: str | None = None
    lease_expires_at: datetime | None = None
    finished_at: datetime | None = None


class RealizationDetail(RealizationSummary):
    campaign_id: int
    result: dict[str, Any] | None = None
    attempt_history: list[AttemptInfo]


class RealizationPage(ApiModel):
    items: list[RealizationSummary]
    next_cursor: str | None = None


# --------------------------------------------------------------------------- preprocessing plans


class PlanInfo(ApiModel):
    id: int
    scan_key: str
    ranks: int
    site: str
    state: PlanState
    path: str | None = None
    checksum: str | None = None
    build_time_s: float | None = None
    size_bytes: int | None = None
    uses: int = Field(description="Realisations that succeeded with this plan")
    build_attempts: int = Field(description="Builds used from the current budget (max_plan_builds)")
    last_error: str | None = None
    lease_holder: str | None = None
    lease_expires_at: datetime | None = None
    created_at: datetime
    ready_at: datetime | None = None


class PlanPage(ApiModel):
    items: list[PlanInfo]
    next_cursor: str | None = None


class CouplingCampaignRef(ApiModel):
    id: int
    name: str


class CouplingInfo(ApiModel):
    """The bandpowers' mode-coupling file of one coupling key at one site, as accepted results reported it."""

    id: int
    coupling_key: str = Field(description="schemas.spec.coupling_key of the campaigns sharing the file (64 hex)")
    site: str
    scan_key: str
    mask_sha256: str = Field(description="SHA-256 of the analysis mask the coupling was built for")
    file_sha256: str = Field(description="SHA-256 of the coupling file the latest accepted result used")
    size_bytes: int = Field(description="Size of the coupling file (bytes)")
    build_time_s: float | None = Field(None, description="Seconds the building realisation spent (None: not reported)")
    built_at: datetime | None = Field(None, description="When the building realisation's result was accepted")
    uses: int = Field(description="Accepted realisation results of every user that used the file")
    campaigns: list[CouplingCampaignRef] = Field(description="The caller's campaigns that used it, newest first")
    created_at: datetime
    updated_at: datetime


class CouplingPage(ApiModel):
    items: list[CouplingInfo]


# --------------------------------------------------------------------------- workers


def site_path_problem(path: str) -> str | None:
    """Why a path a worker sends cannot be a file or folder of its site, or None if it can.

    The service hands such a path to every worker of the site and lists it to every user, so it is held
    to the rules of user-supplied paths: absolute (a worker resolves it without a folder of its own),
    no ``.`` or ``..`` component, no control character or backslash.
    """
    if CONTROL_CHARACTERS.search(path) or "\\" in path:
        return "must not contain control characters or backslashes"
    if not PurePosixPath(path).is_absolute():
        return "must be an absolute path on the site"
    if any(part in (".", "..") for part in path.split("/")):
        return "must not contain '.' or '..' components"
    return None


class WorkerRegistration(RequestModel):
    name: str = Field(pattern=NAME_PATTERN, description="Stable name of this worker; registering again updates it")
    site: str = Field(pattern=NAME_PATTERN, description="Site whose preprocessing plans this worker can use")
    host: str = Field(max_length=255)
    capacity: int = Field(1, ge=1, le=100_000, description="Tasks the worker runs at once")
    sky_maps: list[Annotated[str, Field(max_length=255)]] | None = Field(
        None,
        max_length=MAX_DECLARED_SKY_MAPS,
        description=(
            "The sky maps (FITS files) under the site's sky_root, relative to it: a spec naming a map no site "
            "declares is refused at submit. None: the site has no sky_root"
        ),
    )
    data_dir: str | None = Field(
        None,
        min_length=1,
        max_length=4_096,
        description="The site's data folder on this worker's host (absolute); the plan files the worker "
        "reports built must lie inside it",
    )

    @field_validator("data_dir")
    @classmethod
    def _site_folder(cls, value: str | None) -> str | None:
        problem = None if value is None else site_path_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("host")
    @classmethod
    def _printable(cls, value: str) -> str:
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("must not contain control characters")
        return value


class WorkerInfo(ApiModel):
    id: int
    name: str
    site: str
    host: str
    capacity: int
    registered_at: datetime
    last_heartbeat_at: datetime | None


class ClaimRequest(RequestModel):
    max_tasks: int = Field(1, ge=1, le=1_000, description="Free slots: at most this many tasks are handed out")


class PlanRef(ApiModel):
    id: int
    path: str
    checksum: str


class PreprocessTask(ApiModel):
    """Build the overlap plan for (scan key, ranks) at this worker's site, then report plan-built or failed."""

    kind: Literal["preprocess"] = "preprocess"
    task_id: str
    plan_id: int
    build_attempt: int = Field(description="Build number of this plan, from 1; part of the task id")
    scan_key: str
    ranks: int
    site: str
    campaign_id: int = Field(description="A campaign that needs the plan; its spec fixes the pointing")
    spec: CampaignSpec
    lease_expires_at: datetime


class RealizeTask(ApiModel):
    """Run one realisation with the ready plan, upload its products, then report succeeded or failed."""

    kind: Literal["realize"] = "realize"
    task_id: str
    attempt_id: int
    campaign_id: int
    realization: int
    attempt: int = Field(description="Attempt number of this realisation, from 1")
    spec: CampaignSpec
    plan: PlanRef
    lease_expires_at: datetime


Task = Annotated[PreprocessTask | RealizeTask, Field(discriminator="kind")]


class ClaimAnswer(ApiModel):
    tasks: list[Task]
    lease_s: float | None = Field(
        None,
        description="Length of a lease, seconds (heartbeat within it); unlike lease_expires_at, "
        "free of any difference between the service's clock and the worker's",
    )


class HeartbeatRequest(RequestModel):
    running: list[str] = Field(default_factory=list, max_length=100_000, description="Task ids the worker holds")


class HeartbeatAnswer(ApiModel):
    lease_expires_at: datetime = Field(description="New expiry of every extended lease")
    lease_s: float | None = Field(None, description="Length of a lease, seconds (see ClaimAnswer)")
    extended: list[str] = Field(description="Task ids whose lease was extended: keep running them")
    cancel: list[str] = Field(description="Task ids to stop: their campaign was cancelled, failed or deleted")
    lost: list[str] = Field(description="Task ids that are no longer this worker's (lease expired, reassigned)")


class TaskStarted(RequestModel):
    host: str | None = Field(None, max_length=255)
    scheduler_job_id: str | None = Field(None, max_length=255)


class TaskSucceeded(RequestModel):
    """A realisation's result; every product it names must have been uploaded as an artifact first."""

    result: RealizationResult


class PlanBuilt(RequestModel):
    path: str = Field(min_length=1, max_length=4_096, description="Where the plan file lives on the site")
    checksum: str = Field(min_length=1, max_length=200)
    size_bytes: int = Field(ge=0, lt=2**63)
    build_time_s: float = Field(ge=0, allow_inf_nan=False)


class TaskFailed(RequestModel):
    failure_class: FailureClass
    exit_code: int | None = Field(None, ge=-(2**31), lt=2**31, description="Exit status, or -signal")
    log_tail: str = Field("", max_length=MAX_LOG_TAIL_CHARS)
    message: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description="One line for people: what went wrong")

    @field_validator("log_tail", "message", mode="before")
    @classmethod
    def _keep_binary_output(cls, value: Any) -> Any:
        """A crashing program may write binary to stderr: its NULs become U+FFFD, not a refused report."""
        return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


class PlanInvalid(RequestModel):
    """A worker found a ready plan unusable (the map-maker refused it, or its file is gone): build it again.

    Only a worker holding a realize task that uses the plan may say so; a plan
    rebuilt since (another checksum) is left alone.
    """

    task_id: str = Field(max_length=64, description="The realize task (held by the caller) that was given the plan")
    checksum: str = Field(min_length=1, max_length=200, description="Checksum of the plan that was refused")
    reason: str = Field("", max_length=MAX_MESSAGE_CHARS, description="What was wrong, e.g. the map-maker's refusal message")


class TaskAnswer(ApiModel):
    """What a report changed."""

    task_id: str
    state: str = Field(description="State of the realisation or plan after the report")


InstrumentFileKind = Literal["focal-plane", "ground-schedule", "satellite-schedule"]
# The request body's media type per kind: TOAST's HDF5 focal plane, and the ECSV text of its schedules.
INSTRUMENT_MEDIA_TYPES: dict[str, str] = {
    "focal-plane": "application/x-hdf5",
    "ground-schedule": "text/x-ecsv",
    "satellite-schedule": "text/x-ecsv",
}


class InstrumentFile(ApiModel):
    """A TOAST file uploaded to the service, stored once under its instrument_root by its sha256.

    A spec names it by ``file`` (relative to the instrument_root) and ``sha256``, as it names any file there.
    """

    sha256: str = Field(description="SHA-256 of the file's bytes (64 hex digits)")
    kind: InstrumentFileKind
    file: str = Field(description="Where it is, relative to the instrument_root: uploads/<sha256>.h5 or .ecsv")
    size_bytes: int
    detectors: int | None = Field(None, description="Detectors in a focal-plane file")
    scans: int | None = Field(None, description="Scans in a schedule")


class SiteSumsReceipt(ApiModel):
    """The service's answer to a site's partial map sums (``PUT /workers/{id}/campaigns/{id}/map-sums``)."""

    campaign_id: int
    site: str
    version: int = Field(description="Realisations in the sums now held for the site (a later send must not have fewer)")
    pixels: int = Field(description="Observed pixels in the sums")


class KeptFileRequest(ApiModel):
    """A kept file the service asks a site's worker to send (``GET /workers/{id}/fetches``)."""

    campaign_id: int
    realization: int
    role: str = Field(description="The product's role: iqu, hits or rcond")
    path: str = Field(description="Where the result says the site keeps it")
    sha256: str
    size_bytes: int


class KeptFileRequests(ApiModel):
    requests: list[KeptFileRequest]


class KeptFileFailure(RequestModel):
    """Why a site cannot send a kept file (gone, damaged): the service reports it to whoever asked, for good."""

    reason: str = Field(min_length=1, max_length=1_000)


class ArtifactReceipt(ApiModel):
    task_id: str
    name: str
    sha256: str
    size_bytes: int


# --------------------------------------------------------------------------- events


class EventInfo(ApiModel):
    """One state change. ``id`` increases monotonically; SSE clients resume with Last-Event-ID."""

    id: int
    kind: str = Field(description="campaign, realization, plan, coupling, worker or lease_expired")
    state: str | None = None
    campaign_id: int | None = None
    realization: int | None = None
    plan_id: int | None = None
    created_at: datetime
    data: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- dashboard login links


class LoginLinkInfo(ApiModel):
    """A one-time dashboard login link (``POST /login-links``): ``url`` opens a page whose button logs the
    browser in, once."""

    url: str = Field(description="Open in a browser before expires_at; it works once")
    expires_at: datetime
