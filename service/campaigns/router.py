"""HTTP for campaigns and realisations (user tokens; a user reaches only their own campaigns)."""

from __future__ import annotations

import functools
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Query, Request, Response, status

from schemas.api import (
    IDEMPOTENCY_KEY_HEADER,
    CampaignDetail,
    CampaignPage,
    CampaignState,
    CancelRequest,
    CloneRequest,
    ErrorBody,
    ExtendRequest,
    RealizationDetail,
    RealizationPage,
    RealizationState,
    RetryAnswer,
)
from schemas.spec import CampaignKind, CampaignSpec
from service.auth.deps import BearerCredentials, bearer_token, reading_user
from service.campaigns import creation, lifecycle, reads
from service.campaigns.errors import CampaignNotFound
from service.conditional import NOT_MODIFIED, json_with_etag
from service.db import get_database
from service.deps import (
    CurrentUser,
    ReadingUser,
    ReadSessionDep,
    RealizationIndex,
    RowId,
    SessionDep,
    SettingsDep,
)
from service.storage import ArtifactStore

router = APIRouter(
    prefix="/campaigns",
    tags=["campaigns"],
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody}},
)

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=IDEMPOTENCY_KEY_HEADER,
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description="Retrying a POST with the same key and body returns the same campaign",
    ),
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=CampaignDetail,
    responses={
        200: {"model": CampaignDetail, "description": "Replay of an earlier request with this key"},
        409: {"model": ErrorBody},
    },
)
def create_campaign(
    spec: CampaignSpec,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> CampaignDetail:
    creation.check_sky_map(session=session, spec=spec)
    campaign, created = creation.create_campaign(
        session=session,
        owner_id=user.user_id,
        spec=spec,
        idempotency_key=idempotency_key,
        instrument_root=settings.instrument_root,
    )
    if not created:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"{router.prefix}/{campaign.id}"
    return reads.detail(
        session=session, campaign=campaign, owner=user.user_name, window_s=settings.throughput_window_s
    )


@router.get("", response_model=CampaignPage)
def list_campaigns(
    user: ReadingUser,
    session: ReadSessionDep,
    settings: SettingsDep,
    state: CampaignState | None = None,
    name: Annotated[str | None, Query(max_length=200, description="Substring of the name, any case")] = None,
    kind: CampaignKind | None = None,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> CampaignPage:
    campaigns, next_cursor = reads.list_campaigns(
        session=session,
        owner_id=user.user_id,
        state=state,
        name=name,
        kind=kind,
        cursor=cursor,
        limit=min(limit, settings.page_size_max),
    )
    return CampaignPage(items=[reads.summary(c, user.user_name) for c in campaigns], next_cursor=next_cursor)


IfNoneMatch = Annotated[
    str | None,
    Header(max_length=2_000, description="ETag of the copy the client holds: 304 with no body if it is current"),
]


@router.get("/{campaign_id}", response_model=CampaignDetail, responses=NOT_MODIFIED)
async def get_campaign(
    request: Request,
    campaign_id: RowId,
    credentials: BearerCredentials,
    settings: SettingsDep,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """The campaign's status: spec, counts per state, throughput and ETA; ``ETag`` and ``If-None-Match`` (304)."""

    # The polled read: one statement (token check, campaign, progress) in one turn through the thread pool
    # (as sync dependencies and a sync endpoint, four turns, each a hand-off between threads).
    def read() -> bytes:
        token = bearer_token(credentials)
        database = get_database(request)
        with database.read_connection() as connection:
            detail = reads.status_for_token(
                connection=connection, token=token, campaign_id=campaign_id, window_s=settings.throughput_window_s
            )
        if detail is None:  # found nothing: the ordinary checks say why (401, 403, 404)
            with database.session(write=False) as session:
                user = reading_user(request, session, credentials)
                campaign = reads.get_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id)
                detail = reads.detail(
                    session=session, campaign=campaign, owner=user.user_name, window_s=settings.throughput_window_s
                )
        return detail.model_dump_json().encode()

    return json_with_etag(await anyio.to_thread.run_sync(read), if_none_match)


@router.post("/{campaign_id}/cancel", response_model=CampaignDetail, responses={409: {"model": ErrorBody}})
def cancel_campaign(
    campaign_id: RowId, user: CurrentUser, session: SessionDep, settings: SettingsDep, body: CancelRequest | None = None
) -> CampaignDetail:
    reason = (body or CancelRequest()).reason
    campaign = lifecycle.cancel_campaign(session=session, owner_id=user.user_id, campaign_id=campaign_id, reason=reason)
    ArtifactStore(settings.products_dir).discard(campaign_id=campaign.id)  # uploads of attempts that will not finish
    return reads.detail(
        session=session, campaign=campaign, owner=user.user_name, window_s=settings.throughput_window_s
    )


@router.post("/{campaign_id}/retry", response_model=RetryAnswer, responses={409: {"model": ErrorBody}})
def retry_failed(campaign_id: RowId, user: CurrentUser, session: SessionDep) -> RetryAnswer:
    campaign, requeued = lifecycle.retry_failed(session=session, owner_id=user.user_id, campaign_id=campaign_id)
    return RetryAnswer(requeued=requeued, campaign=reads.summary(campaign, user.user_name))


@router.post(
    "/{campaign_id}/extend",
    response_model=CampaignDetail,
    responses={409: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
def extend_campaign(
    campaign_id: RowId, body: ExtendRequest, user: CurrentUser, session: SessionDep, settings: SettingsDep
) -> CampaignDetail:
    """Add realisations to the campaign (running or finished, not cancelled): same spec, aggregates and plan."""
    campaign = lifecycle.extend_campaign(
        session=session, owner_id=user.user_id, campaign_id=campaign_id, more=body.realizations
    )
    return reads.detail(
        session=session, campaign=campaign, owner=user.user_name, window_s=settings.throughput_window_s
    )


@router.post(
    "/{campaign_id}/clone",
    status_code=status.HTTP_201_CREATED,
    response_model=CampaignDetail,
    responses={409: {"model": ErrorBody}},
)
def clone_campaign(
    campaign_id: RowId,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    body: CloneRequest | None = None,
    idempotency_key: IdempotencyKey = None,
) -> CampaignDetail:
    """A new campaign from this one's spec with ``changes``; it shares the plan when its scan key is the same."""
    spec = creation.clone_spec(
        session=session, owner_id=user.user_id, campaign_id=campaign_id, changes=(body or CloneRequest()).changes
    )
    creation.check_sky_map(session=session, spec=spec, field=("body", "changes", "sky", "path"))
    campaign, created = creation.create_campaign(
        session=session, owner_id=user.user_id, spec=spec, idempotency_key=idempotency_key
    )
    if not created:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"{router.prefix}/{campaign.id}"
    return reads.detail(
        session=session, campaign=campaign, owner=user.user_name, window_s=settings.throughput_window_s
    )


@router.delete("/{campaign_id}", status_code=status.HTTP_204_NO_CONTENT, responses={409: {"model": ErrorBody}})
def delete_campaign(campaign_id: RowId, user: CurrentUser, session: SessionDep, settings: SettingsDep) -> Response:
    lifecycle.delete_campaign(
        session=session, owner_id=user.user_id, campaign_id=campaign_id, products_dir=settings.products_dir
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{campaign_id}/realizations", response_model=RealizationPage)
async def list_realizations(
    request: Request,
    campaign_id: RowId,
    credentials: BearerCredentials,
    settings: SettingsDep,
    state: RealizationState | None = None,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    """A page of the campaign's realisations in index order; ``next_cursor`` fetches the next."""

    def read() -> bytes:  # one statement (token check and page) in one turn through the thread pool, as get_campaign
        token = bearer_token(credentials)
        page = functools.partial(
            reads.list_realizations,
            campaign_id=campaign_id,
            state=state,
            cursor=cursor,
            limit=min(limit, settings.page_size_max),
        )
        database = get_database(request)
        try:
            with database.read_connection() as connection:
                items, next_cursor = page(bind=connection, owner_id=reads.ByToken(token))
        except CampaignNotFound:  # or the token is not a user's: the ordinary checks say which (401, 403, 404)
            with database.session(write=False) as session:
                items, next_cursor = page(bind=session, owner_id=reading_user(request, session, credentials).user_id)
        return RealizationPage(items=items, next_cursor=next_cursor).model_dump_json().encode()

    return Response(await anyio.to_thread.run_sync(read), media_type="application/json")


@router.get("/{campaign_id}/realizations/{index}", response_model=RealizationDetail)
def get_realization(
    campaign_id: RowId, index: RealizationIndex, user: ReadingUser, session: ReadSessionDep
) -> RealizationDetail:
    return reads.get_realization(session=session, owner_id=user.user_id, campaign_id=campaign_id, index=index)
