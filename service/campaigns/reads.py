"""Reading campaigns and realisations: by owner (a user id or a bearer token), by page, with progress."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    ScalarSelect,
    Select,
    and_,
    bindparam,
    case,
    func,
    select,
)
from sqlalchemy.orm import Session

from schemas.api import (
    AttemptInfo,
    CampaignDetail,
    CampaignSummary,
    RealizationDetail,
    RealizationSummary,
    realize_task_id,
)
from schemas.states import (
    FINISHED_CAMPAIGN_STATES,
    CampaignState,
    RealizationState,
)
from service.auth.models import ApiToken, User
from service.auth.service import hash_token
from service.campaigns.errors import (
    CampaignNotFound,
    RealizationNotFound,
)
from service.campaigns.models import Attempt, Campaign, Realization
from service.campaigns.progress import CampaignFields, one_of, progress, progress_columns, progress_from_row
from service.campaigns.specs import current_spec
from service.db import UTCDateTime, utcnow
from service.pagination import decode_cursor, encode_cursor
from service.workers.models import Worker


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
    ``queued_at``, then :func:`progress_columns`. No row: no such campaign of that token's user, or the
    token is unknown, revoked or a worker's."""
    callers_user = _user_of_token_hash(bindparam("token_hash"))
    ended = and_(one_of(Campaign.state, FINISHED_CAMPAIGN_STATES), Campaign.finished_at.is_not(None))
    since = case((ended, Campaign.queued_at), else_=bindparam("window_start", type_=UTCDateTime()))
    return (
        select(
            *(getattr(Campaign, name) for name in CampaignSummary.model_fields if name != "owner"),
            Campaign.queued_at,
            User.name.label("owner"),
            *progress_columns(Campaign.id, since),
        )
        .join(User, User.id == Campaign.owner_id)
        .where(Campaign.id == bindparam("campaign_id"), Campaign.owner_id == callers_user)
    )


# Built once: the polled read's statement, not rebuilt (and its cache key not recomputed) per request.
_STATUS_BY_TOKEN = _status_by_token()
# Where its progress columns start: the summary's columns but the owner, queued_at and the owner's name before.
_PROGRESS_FROM = len(CampaignSummary.model_fields) + 1


def status_for_token(*, connection: Connection, token: str, campaign_id: int, window_s: float) -> CampaignDetail | None:
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
        progress=progress_from_row(row, row[_PROGRESS_FROM:], now=now, window_start=window_start),
    )


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
