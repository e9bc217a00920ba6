"""Campaign logic: create (idempotent), read with progress, cancel, retry, delete, settle the state."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    CursorResult,
    Insert,
    Integer,
    Row,
    ScalarSelect,
    Select,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from schemas.api import (
    REALIZATION_STATES,
    AttemptInfo,
    CampaignDetail,
    CampaignProgress,
    CampaignSummary,
    RealizationDetail,
    RealizationSummary,
    realize_task_id,
)
from schemas.instrument import FocalPlaneFileError, ScheduleFileError, instrument_summary, resolve_files
from schemas.io import problem_message
from schemas.spec import MAX_REALIZATIONS, CampaignSpec, scan_key, spec_hash
from schemas.states import (
    FINISHED_CAMPAIGN_STATES,
    UNFINISHED_REALIZATION_STATES,
    AttemptState,
    CampaignState,
    Entity,
    RealizationState,
    advance,
    advance_each,
    attempt_state,
)
from service.auth.models import ApiToken, User
from service.auth.service import hash_token
from service.campaigns.errors import (
    CampaignAlreadyFinished,
    CampaignNotFinished,
    CampaignNotFound,
    IdempotencyKeyReused,
    RealizationNotFound,
)
from service.campaigns.models import Attempt, Campaign, Realization, RealizationCount
from service.campaigns.specs import current_spec
from service.db import UTCDateTime, utcnow
from service.errors import InvalidField
from service.events.service import record_event
from service.pagination import decode_cursor, encode_cursor
from service.storage import CampaignStorage
from service.workers.models import Worker

log = logging.getLogger("mapcampaign.service")

# What a campaign's summary and progress read: its ORM row, or a row of a statement with the same names.
CampaignFields = Campaign | Row[Any]

# --------------------------------------------------------------------------- create


def check_focal_plane_file(spec: CampaignSpec, instrument_root: Path | None) -> dict[str, Any] | None:
    """Read a spec's focal-plane and schedule files as the map-maker will; return what they said
    (:func:`schemas.instrument.instrument_summary`, None: no file in the spec).

    A missing, changed (sha256) or malformed file, or a detector without noise parameters, is refused
    here, at submit, with the file and the column named (:class:`InvalidField`, a 422), before anything
    is stored.
    """
    try:
        resolve_files(spec, instrument_root)  # reads into the spec's private fields; its JSON does not change
    except ScheduleFileError as error:
        raise InvalidField(("body", "scan", "file"), str(error)) from None
    except FocalPlaneFileError as error:
        raise InvalidField(("body", "focal_plane", "file"), str(error)) from None
    return instrument_summary(spec)


def create_campaign(
    *,
    session: Session,
    owner_id: int,
    spec: CampaignSpec,
    idempotency_key: str | None = None,
    instrument_root: Path | None = None,
) -> tuple[Campaign, bool]:
    """Store the campaign and its queued realisations; return it and whether it is new.

    A repeated ``idempotency_key`` with the same spec returns the campaign made the
    first time; with a different spec it is refused. A focal-plane file is read from
    ``instrument_root`` and checked first (:func:`check_focal_plane_file`).
    """
    summary = check_focal_plane_file(spec, instrument_root)
    digest = spec_hash(spec)
    if idempotency_key is not None:
        existing = _by_idempotency_key(session, owner_id, idempotency_key)
        if existing is not None:
            return _replayed(existing, digest, idempotency_key, spec.realizations), False
    now = utcnow()
    campaign = Campaign(
        owner_id=owner_id,
        name=spec.name,
        kind=spec.kind,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        realizations=spec.realizations,
        ranks=spec.resources.ranks,
        scan_key=scan_key(spec),
        spec_hash=digest,
        spec=spec.model_dump(mode="json"),
        instrument_summary=summary,
        state=CampaignState.QUEUED,
        idempotency_key=idempotency_key,
        created_at=now,
        queued_at=now,
    )
    session.add(campaign)
    try:
        session.flush()
    except IntegrityError:
        # Another request with the same key won the race; answer as a replay.
        session.rollback()
        existing = _by_idempotency_key(session, owner_id, idempotency_key or "")
        if existing is None:
            raise
        return _replayed(existing, digest, idempotency_key or "", spec.realizations), False
    session.execute(queued_realizations(campaign_id=campaign.id, count=spec.realizations, now=now))
    record_event(
        session,
        "campaign",
        state=CampaignState.QUEUED,
        owner_id=owner_id,
        campaign_id=campaign.id,
        data={"name": campaign.name, "realizations": campaign.realizations},
    )
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = _by_idempotency_key(session, owner_id, idempotency_key or "") if idempotency_key else None
        if existing is None:
            raise
        return _replayed(existing, digest, idempotency_key or "", spec.realizations), False
    log.info(
        "campaign %d created: %d realisations, scan key %s", campaign.id, campaign.realizations, campaign.scan_key[:12]
    )
    return campaign, True


def check_sky_map(*, session: Session, spec: CampaignSpec, field: tuple[str, ...] = ("body", "sky", "path")) -> None:
    """Refuse (422 naming ``field``) a spec whose sky map no site declares: the workers list the files under
    their site's ``sky_root`` when they register (``WorkerRegistration.sky_maps``).

    Without it a missing file is found by the map-maker on the site, after the campaign is stored: every
    realisation fails alike. The path's form (relative, no ``..``) is the spec's own check.
    """
    if spec.sky.kind != "map":
        return
    declared = session.execute(select(Worker.site, Worker.sky_maps).where(Worker.sky_maps.is_not(None))).all()
    if not declared:
        raise InvalidField(
            field,
            f"no site declares a sky_root, so no worker could read {spec.sky.path!r}: set sky_root in the site "
            "file of a worker (and start it) before submitting a campaign with sky.kind = 'map'",
        )
    if any(spec.sky.path in (maps or []) for _, maps in declared):
        return
    sites = sorted({site for site, _ in declared})
    raise InvalidField(
        field,
        f"no file {spec.sky.path!r} under the sky_root of any site ({', '.join(sites)}); the path is relative "
        "to the site's sky_root (a worker lists the maps there when it starts)",
    )


def queued_realizations(*, campaign_id: int, count: int, now: datetime, first: int = 0) -> Insert:
    """One ``INSERT ... SELECT`` of ``count`` queued realisations of a campaign, indices ``first`` to
    ``first + count - 1`` made by the database.

    One statement whatever the size (a list of rows sent from Python was 100,000 statements of one row,
    each firing the count triggers of migration 0005).
    """
    numbers = select(literal(first, Integer).label("i")).cte("numbers", recursive=True)
    numbers = numbers.union_all(select(numbers.c.i + 1).where(numbers.c.i + 1 < first + count))
    return insert(Realization).from_select(
        ["campaign_id", "index", "state", "attempts", "attempts_total", "updated_at"],
        select(
            literal(campaign_id, BigInteger),
            numbers.c.i,
            literal(RealizationState.QUEUED.value, String(16)),
            literal(0, Integer),
            literal(0, Integer),
            literal(now, UTCDateTime()),
        ),
    )


def _by_idempotency_key(session: Session, owner_id: int, key: str) -> Campaign | None:
    return session.scalar(select(Campaign).where(Campaign.owner_id == owner_id, Campaign.idempotency_key == key))


def _replayed(existing: Campaign, digest: str, key: str, realizations: int) -> Campaign:
    # The stored spec keeps the count as submitted (an extension grows the campaign's column only), and the
    # hash leaves the count out: both are compared.
    if existing.spec_hash != digest or existing.spec.get("realizations") != realizations:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used for campaign {existing.id} with a different spec; "
            "send the same spec to retry, or use a new key for a new campaign"
        )
    return existing


# --------------------------------------------------------------------------- read


def get_campaign(*, session: Session, owner_id: Owner, campaign_id: int, lock: bool = False) -> Campaign:
    query = select(Campaign).where(Campaign.id == campaign_id, _owner_is(owner_id))
    if lock:
        query = query.with_for_update()
    campaign = session.scalar(query)
    if campaign is None:
        raise CampaignNotFound(f"campaign {campaign_id} not found")
    return campaign


def campaign_visible(session: Session, owner_id: int, campaign_id: int) -> None:
    """Raise CampaignNotFound unless ``owner_id`` owns campaign ``campaign_id``: the events routes' check."""
    get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)


def list_campaigns(
    *,
    session: Session,
    owner_id: int,
    state: CampaignState | None = None,
    name: str | None = None,
    kind: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[Campaign], str | None]:
    """Newest first; the cursor holds the last id seen, so pages stay stable while campaigns are added."""
    query = select(Campaign).where(Campaign.owner_id == owner_id)
    if state is not None:
        query = query.where(Campaign.state == state)
    if kind is not None:
        query = query.where(Campaign.kind == kind)
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(func.lower(Campaign.name).like(f"%{escaped.lower()}%", escape="\\"))
    position = decode_cursor(cursor, keys=("before_id",))
    if position is not None:
        query = query.where(Campaign.id < position["before_id"])
    rows = list(session.scalars(query.order_by(Campaign.id.desc()).limit(limit + 1)))
    next_cursor = encode_cursor({"before_id": rows[limit - 1].id}) if len(rows) > limit else None
    return rows[:limit], next_cursor


def state_counts(*, session: Session, campaign_id: int) -> dict[RealizationState, int]:
    counts = dict.fromkeys(REALIZATION_STATES, 0)
    # Kept by the database's triggers (migration 0005): a few rows, whatever the campaign's size.
    rows = session.execute(
        select(RealizationCount.state, RealizationCount.count).where(RealizationCount.campaign_id == campaign_id)
    )
    for state, count in rows:
        counts[state] = count
    return counts


_FINISHED = (RealizationState.SUCCEEDED, RealizationState.FAILED)


def _one_of(column: Any, values: Iterable[Any]) -> ColumnElement[bool]:
    """``column IN values`` as ORed equalities: plain parameters, where an IN list is an expanding parameter
    that SQLAlchemy rewrites the statement's parameters for at every execution (a prebuilt statement's)."""
    return or_(*(column == value for value in values))


def _progress_columns(campaign_id: Any, since: Any) -> list[ScalarSelect[Any]]:
    """The progress figures of campaign ``campaign_id`` as scalar subqueries of one row, in this order: the
    count of each state of ``REALIZATION_STATES`` (primary-key lookups in the triggers' table), the
    realisations finished since ``since`` and the first claim since then (the throughput's numerator and
    start, over the indexes on ``(campaign_id, finished_at)`` and ``(campaign_id, claimed_at)``).

    ``campaign_id`` and ``since`` are values or SQL expressions (a column of an outer campaigns row).
    """
    counts = [
        select(RealizationCount.count)
        .where(RealizationCount.campaign_id == campaign_id, RealizationCount.state == state)
        .scalar_subquery()
        for state in REALIZATION_STATES
    ]
    recent = (
        select(func.count())
        .select_from(Realization)
        .where(
            Realization.campaign_id == campaign_id,
            Realization.finished_at >= since,
            _one_of(Realization.state, _FINISHED),
        )
        .scalar_subquery()
    )
    first_claim = (
        select(func.min(Attempt.claimed_at))
        .where(Attempt.campaign_id == campaign_id, Attempt.claimed_at >= since)
        .scalar_subquery()
    )
    return [*counts, recent, first_claim]


def _progress_from_row(
    campaign: CampaignFields, figures: Sequence[Any], *, now: datetime, window_start: datetime
) -> CampaignProgress:
    """:class:`CampaignProgress` from the values of :func:`_progress_columns` (``figures``, in its order)."""
    per_state = {state: int(count or 0) for state, count in zip(REALIZATION_STATES, figures, strict=False)}
    return _progress_of(
        campaign,
        per_state,
        recent=int(figures[-2] or 0),
        first_claim=figures[-1],
        ended=_ended(campaign),
        now=now,
        window_start=window_start,
    )


def _ended(campaign: CampaignFields) -> bool:
    """Whether the campaign's throughput is over its active span (it ended) rather than the recent window."""
    return campaign.state in FINISHED_CAMPAIGN_STATES and campaign.finished_at is not None


def progress(*, session: Session, campaign: Campaign, window_s: float) -> CampaignProgress:
    """One campaign's progress in one statement: :func:`_progress_columns` (the same figures as
    :func:`progress_many`)."""
    now = utcnow()
    window_start = now - timedelta(seconds=window_s)
    since = campaign.queued_at if _ended(campaign) else window_start
    figures = session.execute(select(*_progress_columns(campaign.id, since))).one()
    return _progress_from_row(campaign, figures, now=now, window_start=window_start)


def _user_of_token_hash(token_hash: Any) -> ScalarSelect[Any]:
    """The id of the user whose user token has SHA-256 ``token_hash`` (a value or a bound parameter), as a
    scalar subquery; NULL when the token is unknown, revoked or a worker's."""
    return (
        select(ApiToken.user_id)
        .where(ApiToken.token_hash == token_hash, ApiToken.revoked_at.is_(None), ApiToken.kind == "user")
        .scalar_subquery()
    )


@dataclass(frozen=True)
class ByToken:
    """A reader known by its bearer token only: the token's check is part of the read's own statement (one
    round trip fewer). Unknown, revoked or a worker's: the read finds nothing (404), and the caller's
    ordinary checks say why (401, 403)."""

    token: str


Owner = int | ByToken  # a user id, or the user of a token


def _owner_is(owner: Owner) -> ColumnElement[bool]:
    """Whether a campaigns row belongs to ``owner``."""
    if isinstance(owner, ByToken):
        return Campaign.owner_id == _user_of_token_hash(hash_token(owner.token))
    return Campaign.owner_id == owner


def _status_by_token() -> Select[Any]:
    """A campaign's status as one row, found by id and by its owner's bearer token (bound parameters
    ``campaign_id``, ``token_hash`` and ``window_start``): the summary's columns, the owner's name,
    ``queued_at``, then :func:`_progress_columns`. No row: no such campaign of that token's user, or the
    token is unknown, revoked or a worker's."""
    callers_user = _user_of_token_hash(bindparam("token_hash"))
    ended = and_(_one_of(Campaign.state, FINISHED_CAMPAIGN_STATES), Campaign.finished_at.is_not(None))
    since = case((ended, Campaign.queued_at), else_=bindparam("window_start", type_=UTCDateTime()))
    return (
        select(
            *(getattr(Campaign, name) for name in CampaignSummary.model_fields if name != "owner"),
            Campaign.queued_at,
            User.name.label("owner"),
            *_progress_columns(Campaign.id, since),
        )
        .join(User, User.id == Campaign.owner_id)
        .where(Campaign.id == bindparam("campaign_id"), Campaign.owner_id == callers_user)
    )


# Built once: the polled read's statement, not rebuilt (and its cache key not recomputed) per request.
_STATUS_BY_TOKEN = _status_by_token()
# Where its progress columns start: the summary's columns but the owner, queued_at and the owner's name before.
_PROGRESS_FROM = len(CampaignSummary.model_fields) + 1


def status_for_token(
    *, connection: Connection, token: str, campaign_id: int, window_s: float
) -> CampaignDetail | None:
    """The status of campaign ``campaign_id`` for the holder of user token ``token``, in one statement (token
    check, campaign, progress); None when that finds nothing (the caller's ordinary checks then say why:
    401, 403 or 404). The polled read: the dashboard, ``watch`` and scripts ask it every few seconds."""
    now = utcnow()
    window_start = now - timedelta(seconds=window_s)
    parameters = {"token_hash": hash_token(token), "campaign_id": campaign_id, "window_start": window_start}
    row = connection.execute(_STATUS_BY_TOKEN, parameters).first()
    if row is None:
        return None
    return CampaignDetail(
        **_summary_fields(row, row.owner),
        spec=current_spec(row, lambda: connection.scalar(select(Campaign.spec).where(Campaign.id == campaign_id))),
        progress=_progress_from_row(row, row[_PROGRESS_FROM:], now=now, window_start=window_start),
    )


def _progress_of(
    campaign: CampaignFields,
    per_state: dict[RealizationState, int],
    *,
    recent: int,
    first_claim: datetime | None,
    ended: bool,
    now: datetime,
    window_start: datetime,
) -> CampaignProgress:
    done = sum(per_state[state] for state in RealizationState if state not in UNFINISHED_REALIZATION_STATES)
    remaining = sum(per_state[state] for state in UNFINISHED_REALIZATION_STATES)
    throughput = eta = None
    if recent:
        if ended:
            assert campaign.finished_at is not None  # what ``ended`` means
            span_start, span_end = first_claim or campaign.queued_at, campaign.finished_at
        else:
            span_start, span_end = max(window_start, first_claim or campaign.queued_at), now
        hours = max((span_end - span_start).total_seconds(), 1.0) / 3600
        throughput = recent / hours
        if remaining and campaign.state not in FINISHED_CAMPAIGN_STATES:
            eta = remaining / throughput * 3600
    return CampaignProgress(
        counts=per_state, done=done, total=campaign.realizations, throughput_per_hour=throughput, eta_seconds=eta
    )


def progress_many(*, session: Session, campaigns: list[Campaign], window_s: float) -> dict[int, CampaignProgress]:
    """Progress of several campaigns in a few grouped queries, whatever their number (pages list many).

    Throughput (realisations per hour) of a campaign still running: those finished in the last
    ``window_s`` seconds over the time since the window's start (or the first claim in it). Of a finished
    campaign: those finished over its active span, first claim (since its last queueing) to its end; it
    stays what it was at the end instead of falling with the wall clock.
    """
    if not campaigns:
        return {}
    ids = [campaign.id for campaign in campaigns]
    counts = {campaign_id: dict.fromkeys(REALIZATION_STATES, 0) for campaign_id in ids}
    rows = session.execute(  # kept by the database's triggers (migration 0005)
        select(RealizationCount.campaign_id, RealizationCount.state, RealizationCount.count).where(
            RealizationCount.campaign_id.in_(ids)
        )
    )
    for campaign_id, state, count in rows:
        counts[campaign_id][state] = count
    ended = {c.id for c in campaigns if _ended(c)}
    running = [campaign_id for campaign_id in ids if campaign_id not in ended]
    now = utcnow()
    window_start = now - timedelta(seconds=window_s)
    finished_in_span: dict[int, int] = {}
    span_starts: dict[int, Any] = {}
    if running:
        finished_in_span.update(
            session.execute(
                select(Realization.campaign_id, func.count())
                .where(
                    Realization.campaign_id.in_(running),
                    Realization.state.in_((RealizationState.SUCCEEDED, RealizationState.FAILED)),
                    Realization.finished_at >= window_start,
                )
                .group_by(Realization.campaign_id)
            ).all()
        )
    if ended:
        finished_in_span.update(
            session.execute(
                select(Realization.campaign_id, func.count())
                .join(Campaign, Campaign.id == Realization.campaign_id)
                .where(
                    Realization.campaign_id.in_(list(ended)),
                    Realization.state.in_((RealizationState.SUCCEEDED, RealizationState.FAILED)),
                    Realization.finished_at >= Campaign.queued_at,
                )
                .group_by(Realization.campaign_id)
            ).all()
        )
    recent_running = [campaign_id for campaign_id in running if finished_in_span.get(campaign_id)]
    if recent_running:
        span_starts.update(
            session.execute(
                select(Attempt.campaign_id, func.min(Attempt.claimed_at))
                .where(Attempt.campaign_id.in_(recent_running), Attempt.claimed_at >= window_start)
                .group_by(Attempt.campaign_id)
            ).all()
        )
    recent_ended = [campaign_id for campaign_id in ended if finished_in_span.get(campaign_id)]
    if recent_ended:
        span_starts.update(
            session.execute(
                select(Attempt.campaign_id, func.min(Attempt.claimed_at))
                .join(Campaign, Campaign.id == Attempt.campaign_id)
                .where(Attempt.campaign_id.in_(recent_ended), Attempt.claimed_at >= Campaign.queued_at)
                .group_by(Attempt.campaign_id)
            ).all()
        )
    return {
        campaign.id: _progress_of(
            campaign,
            counts[campaign.id],
            recent=finished_in_span.get(campaign.id, 0),
            first_claim=span_starts.get(campaign.id),
            ended=campaign.id in ended,
            now=now,
            window_start=window_start,
        )
        for campaign in campaigns
    }


def owner_name(*, session: Session, owner_id: int) -> str:
    return session.scalar(select(User.name).where(User.id == owner_id)) or "?"


def summary(campaign: CampaignFields, owner: str) -> CampaignSummary:
    return CampaignSummary(**_summary_fields(campaign, owner))


def _summary_fields(campaign: CampaignFields, owner: str) -> dict[str, Any]:
    """The fields of :class:`CampaignSummary` (which :class:`CampaignDetail` extends): the campaign's
    columns of the same names, and the owner's name."""
    return {name: owner if name == "owner" else getattr(campaign, name) for name in CampaignSummary.model_fields}


def detail(*, session: Session, campaign: Campaign, owner: str, window_s: float) -> CampaignDetail:
    return CampaignDetail(
        **_summary_fields(campaign, owner),
        spec=current_spec(campaign, lambda: campaign.spec),
        progress=progress(session=session, campaign=campaign, window_s=window_s),
    )


@functools.cache
def _page_statement(*, by_token: bool, with_state: bool, after_index: bool) -> Select[*tuple[Any, ...]]:
    """A page of realisations as one statement, built once per shape (bound parameters ``campaign_id``,
    ``owner_id`` or ``token_hash``, ``state``, ``after_index``, ``limit``). The owner's check is a join, and
    the page walks the unique index ``(campaign_id, index)``, or ``(campaign_id, state, index)`` with a
    state, from the cursor on: its cost is the page's, however deep. Only the summary's columns are read."""
    owner = _user_of_token_hash(bindparam("token_hash")) if by_token else bindparam("owner_id")
    query = (
        select(
            Realization.index,
            Realization.state,
            Realization.attempts,
            Realization.lease_expires_at,
            Realization.finished_at,
            Worker.name,
        )
        .join(Campaign, Campaign.id == Realization.campaign_id)
        .outerjoin(Worker, Worker.id == Realization.lease_holder_id)
        .where(Realization.campaign_id == bindparam("campaign_id"), Campaign.owner_id == owner)
    )
    if with_state:
        query = query.where(Realization.state == bindparam("state", type_=Realization.state.type))
    if after_index:
        query = query.where(Realization.index > bindparam("after_index"))
    return query.order_by(Realization.index).limit(bindparam("limit"))


def list_realizations(
    *,
    bind: Session | Connection,
    owner_id: Owner,
    campaign_id: int,
    state: RealizationState | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> tuple[list[RealizationSummary], str | None]:
    """A page of the campaign's realisations in index order, after the cursor's index (keyset pagination).

    One statement in the common case (:func:`_page_statement`); only an empty page asks whether the
    campaign exists (404 if not). ``bind``: a session, or a connection for a read without an ORM session.
    """
    position = decode_cursor(cursor, keys=("after_index",))
    by_token = isinstance(owner_id, ByToken)
    statement = _page_statement(by_token=by_token, with_state=state is not None, after_index=position is not None)
    parameters: dict[str, Any] = {"campaign_id": campaign_id, "state": state, "limit": limit + 1}
    if isinstance(owner_id, ByToken):
        parameters["token_hash"] = hash_token(owner_id.token)
    else:
        parameters["owner_id"] = owner_id
    if position is not None:
        parameters["after_index"] = position["after_index"]
    rows = bind.execute(statement, parameters).all()
    if not rows:  # 404 unless only the page is empty
        found = bind.execute(select(Campaign.id).where(Campaign.id == campaign_id, _owner_is(owner_id))).first()
        if found is None:
            raise CampaignNotFound(f"campaign {campaign_id} not found")
    items = [
        RealizationSummary(
            index=index,
            state=state_,
            attempts=attempts,
            lease_holder=worker,
            lease_expires_at=lease_expires_at,
            finished_at=finished_at,
        )
        for index, state_, attempts, lease_expires_at, finished_at, worker in rows[:limit]
    ]
    next_cursor = encode_cursor({"after_index": items[-1].index}) if len(rows) > limit else None
    return items, next_cursor


def _realization_summary(realization: Realization, worker: str | None) -> RealizationSummary:
    return RealizationSummary(
        index=realization.index,
        state=realization.state,
        attempts=realization.attempts,
        lease_holder=worker,
        lease_expires_at=realization.lease_expires_at,
        finished_at=realization.finished_at,
    )


def get_realization(*, session: Session, owner_id: int, campaign_id: int, index: int) -> RealizationDetail:
    get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    row = session.execute(
        select(Realization, Worker.name)
        .outerjoin(Worker, Worker.id == Realization.lease_holder_id)
        .where(Realization.campaign_id == campaign_id, Realization.index == index)
    ).first()
    if row is None:
        raise RealizationNotFound(f"campaign {campaign_id} has no realisation {index}")
    realization, worker = row
    attempts = session.execute(
        select(Attempt, Worker.name)
        .outerjoin(Worker, Worker.id == Attempt.worker_id)
        .where(Attempt.realization_id == realization.id)
        .order_by(Attempt.number)
    )
    history = [
        AttemptInfo(
            id=attempt.id,
            task_id=realize_task_id(attempt.id),
            number=attempt.number,
            worker=name,
            host=attempt.host,
            scheduler_job_id=attempt.scheduler_job_id,
            claimed_at=attempt.claimed_at,
            started_at=attempt.started_at,
            ended_at=attempt.ended_at,
            exit_code=attempt.exit_code,
            failure_class=attempt.failure_class,
            log_tail=attempt.log_tail,
        )
        for attempt, name in attempts
    ]
    return RealizationDetail(
        **_realization_summary(realization, worker).model_dump(),
        campaign_id=campaign_id,
        result=realization.result,
        attempt_history=history,
    )


# --------------------------------------------------------------------------- change


def settle_campaign(*, session: Session, campaign: Campaign, release: bool = False) -> None:
    """Make the campaign's state follow its realisations. Call with the campaign row locked.

    A held campaign stays held while it has realisations to run, unless ``release`` (a retry).
    """
    if campaign.state == CampaignState.CANCELLED:
        return
    counts = state_counts(session=session, campaign_id=campaign.id)
    unfinished = sum(counts[state] for state in UNFINISHED_REALIZATION_STATES)
    if campaign.state == CampaignState.HELD and unfinished and not release:
        return  # held until its owner releases it (a retry), or until nothing of it is left to run
    before = campaign.state
    failed = counts[RealizationState.FAILED]
    if unfinished == 0:
        settled = CampaignState.FAILED if failed else CampaignState.SUCCEEDED
        if campaign.state == CampaignState.HELD and not release:
            pass  # ended while held: the hold's reason stays the cause
        elif failed and not campaign.failure_cause:
            campaign.failure_cause = f"{failed} of {campaign.realizations} realisations failed"
        campaign.finished_at = campaign.finished_at or utcnow()
    else:
        started = campaign.realizations - counts[RealizationState.QUEUED] - counts[RealizationState.CANCELLED]
        settled = CampaignState.RUNNING if started > 0 else CampaignState.QUEUED
        campaign.finished_at = None
    if settled != before:
        campaign.state = advance(Entity.CAMPAIGN, before, settled)
        record_event(
            session,
            "campaign",
            state=campaign.state,
            owner_id=campaign.owner_id,
            campaign_id=campaign.id,
            data={"from": before, "failure_cause": campaign.failure_cause},
        )


def end_open_attempts(*, session: Session, campaign_id: int, failure_class: str) -> None:
    """Close every attempt of the campaign still open (no end time), e.g. at cancel: one statement."""
    now = utcnow()
    ended = attempt_state(started_at=None, ended_at=now, failure_class=failure_class)
    # An open attempt is claimed or running (its state is read from its times): both may end so.
    advance_each(Entity.ATTEMPT, (AttemptState.CLAIMED, AttemptState.RUNNING), ended)
    session.execute(
        update(Attempt)
        .where(Attempt.campaign_id == campaign_id, Attempt.ended_at.is_(None))
        .values(ended_at=now, failure_class=failure_class),
        execution_options={"synchronize_session": False},
    )


def cancel_campaign(*, session: Session, owner_id: int, campaign_id: int, reason: str) -> Campaign:
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state in FINISHED_CAMPAIGN_STATES:
        raise CampaignAlreadyFinished(f"campaign {campaign_id} is already {campaign.state}; nothing to cancel")
    fail_unfinished(session=session, campaign=campaign, state=RealizationState.CANCELLED, failure_class="cancelled")
    campaign.state = advance(Entity.CAMPAIGN, campaign.state, CampaignState.CANCELLED)
    campaign.cancel_reason = reason
    campaign.finished_at = utcnow()
    record_event(
        session, "campaign", state=campaign.state, owner_id=owner_id, campaign_id=campaign.id, data={"reason": reason}
    )
    session.commit()
    return campaign


def fail_unfinished(*, session: Session, campaign: Campaign, state: RealizationState, failure_class: str) -> int:
    """Move every unfinished realisation of a locked campaign to ``state``, close its open attempts; return how many.

    Set-based by campaign, whatever its size (a list of ids is bounded by the database's bind parameters).
    """
    # The transition table is checked here for each source state the WHERE clause admits; a row in any
    # other state is left as it is, so no forbidden transition can happen.
    new_state = advance_each(Entity.REALIZATION, UNFINISHED_REALIZATION_STATES, state)
    unfinished = (Realization.campaign_id == campaign.id, Realization.state.in_(UNFINISHED_REALIZATION_STATES))
    # Rows locked by id first, like every multi-row lock (heartbeats, claims): no deadlock. Counted in the
    # database, so no id comes back; a statement of its own, so the UPDATE's plan cannot change the order.
    # SQLite has one write lock and drops the FOR UPDATE.
    locked_by_id = select(Realization.id).where(*unfinished).order_by(Realization.id).with_for_update().subquery()
    session.execute(select(func.count()).select_from(locked_by_id))
    now = utcnow()
    result = session.execute(
        update(Realization)
        .where(*unfinished)
        .values(
            state=new_state,
            lease_holder_id=None,
            lease_expires_at=None,
            current_attempt_id=None,
            finished_at=now,
            updated_at=now,
        ),
        execution_options={"synchronize_session": False},
    )
    moved = cast("CursorResult[Any]", result).rowcount or 0  # an UPDATE's result is a cursor's
    if not moved:
        return 0
    end_open_attempts(session=session, campaign_id=campaign.id, failure_class=failure_class)
    record_event(
        session,
        "realization",
        state=state,
        owner_id=campaign.owner_id,
        campaign_id=campaign.id,
        data={"count": moved, "bulk": True},
    )
    return moved


def retry_failed(*, session: Session, owner_id: int, campaign_id: int) -> tuple[Campaign, int]:
    """Put failed realisations back in the queue with a fresh attempt budget; release a held campaign."""
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state == CampaignState.CANCELLED:
        raise CampaignAlreadyFinished(f"campaign {campaign_id} was cancelled; submit it again instead")
    result = session.execute(
        update(Realization)
        .where(Realization.campaign_id == campaign.id, Realization.state == RealizationState.FAILED)
        .values(
            state=advance(Entity.REALIZATION, RealizationState.FAILED, RealizationState.QUEUED),
            attempts=0,
            lease_holder_id=None,
            lease_expires_at=None,
            current_attempt_id=None,
            finished_at=None,
            updated_at=utcnow(),
        ),
        execution_options={"synchronize_session": False},
    )
    requeued = cast("CursorResult[Any]", result).rowcount or 0  # an UPDATE's result is a cursor's
    held = campaign.state == CampaignState.HELD
    if requeued or held:
        campaign.failure_cause = None
        campaign.finished_at = None
        campaign.queued_at = utcnow()  # also where fail fast starts counting again
        record_event(
            session,
            "realization",
            state=RealizationState.QUEUED,
            owner_id=owner_id,
            campaign_id=campaign.id,
            data={"count": requeued, "bulk": True, "retry": True},
        )
        settle_campaign(session=session, campaign=campaign, release=held)
    session.commit()
    return campaign, requeued


def extend_campaign(*, session: Session, owner_id: int, campaign_id: int, more: int) -> Campaign:
    """Add ``more`` queued realisations after the last one; a finished campaign runs again.

    The new realisations share the campaign's spec (its hash leaves the count out), scan key and plan, and
    their results go into the same aggregates; their seeds are keyed by their new indices, so no two
    realisations of the campaign draw the same skies or noise. A cancelled campaign is refused (409).
    """
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state == CampaignState.CANCELLED:
        raise CampaignAlreadyFinished(f"campaign {campaign_id} was cancelled; clone it to run its spec again")
    total = campaign.realizations + more
    if total > MAX_REALIZATIONS:
        raise InvalidField(
            ("body", "realizations"),
            f"the campaign has {campaign.realizations}; {more} more would make {total}, over {MAX_REALIZATIONS}",
        )
    now = utcnow()
    first = campaign.realizations
    session.execute(queued_realizations(campaign_id=campaign.id, count=more, now=now, first=first))
    campaign.realizations = total
    campaign.failure_cause = None if campaign.state != CampaignState.FAILED else campaign.failure_cause
    record_event(
        session,
        "campaign",
        state=campaign.state,
        owner_id=owner_id,
        campaign_id=campaign.id,
        data={"extended": more, "realizations": total, "first_new": first},
    )
    if campaign.state in (CampaignState.SUCCEEDED, CampaignState.FAILED):
        campaign.queued_at = now
    settle_campaign(session=session, campaign=campaign)
    session.commit()
    log.info("campaign %d extended by %d to %d realisations", campaign.id, more, total)
    return campaign


def merge_changes(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in: a table into a table key by key, anything else replaces."""
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge_changes(merged[key], value)
        else:
            merged[key] = value
    return merged


def clone_spec(*, session: Session, owner_id: int, campaign_id: int, changes: Mapping[str, Any]) -> CampaignSpec:
    """The spec of campaign ``campaign_id`` as it stands with ``changes`` merged in, validated.

    A change that does not validate is refused with a 422 naming ``changes.<field path>``.
    """
    source = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id)
    data = merge_changes(current_spec(source, lambda: source.spec).model_dump(mode="json"), changes)
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(
            [
                # The message is made here, against the spec model ("did you mean"), not the request's.
                {
                    "loc": ("body", "changes", *item["loc"]),
                    "msg": problem_message(CampaignSpec, item),
                    "type": "value_error",
                }
                for item in error.errors()
            ]
        ) from None


def delete_campaign(*, session: Session, owner_id: int, campaign_id: int, products_dir: Path) -> None:
    campaign = get_campaign(session=session, owner_id=owner_id, campaign_id=campaign_id, lock=True)
    if campaign.state not in FINISHED_CAMPAIGN_STATES:
        raise CampaignNotFinished(f"campaign {campaign_id} is {campaign.state}; cancel it before deleting it")
    session.execute(delete(Attempt).where(Attempt.campaign_id == campaign.id))
    session.execute(delete(Realization).where(Realization.campaign_id == campaign.id))
    session.execute(delete(Campaign).where(Campaign.id == campaign.id))
    record_event(session, "campaign", state="deleted", owner_id=owner_id, campaign_id=campaign.id)
    session.commit()
    CampaignStorage(products_dir).delete_campaign(campaign.id)
