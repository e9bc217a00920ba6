"""Server-sent events of state changes, read from the events table.

The stream polls the table, so it works across restarts and with several API
processes. Each SSE message carries ``id:`` (the event id), ``event:`` (the
kind) and ``data:`` (an :class:`schemas.api.EventInfo` as JSON). Resume with
the ``Last-Event-ID`` header (browsers send it when they reconnect) or
``?after=N``; without either the stream starts with events after "now".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from schemas.api import ErrorBody, EventInfo
from service.auth.service import Principal
from service.config import Settings
from service.db import Database, get_database
from service.deps import (
    MAX_ROW_ID,
    CurrentUser,
    EventPosition,
    EventPositionQuery,
    ReadSessionDep,
    RowIdQuery,
    SettingsDep,
)
from service.errors import Invalid
from service.events.models import Event
from service.events.service import events_after, latest_event_id

CampaignCheck = Callable[[Session, int, int], object]
"""``check(session, owner_id, campaign_id)`` raises NotFound unless the owner may see that campaign.

The campaigns feature provides it (``service.app`` passes it in): events sit below campaigns, which record them.
"""


def event_info(event: Event) -> EventInfo:
    return EventInfo(
        id=event.id,
        kind=event.kind,
        state=event.state,
        campaign_id=event.campaign_id,
        realization=event.realization,
        plan_id=event.plan_id,
        created_at=event.created_at,
        data=event.data or {},
    )


def _start_after(last_event_id: str | None, after: int | None) -> int | None:
    if last_event_id is not None and last_event_id.strip():
        try:
            position = int(last_event_id.strip())
        except ValueError:
            raise Invalid("header Last-Event-ID: must be the integer id of an event") from None
        if position > MAX_ROW_ID:  # checked before the stream starts: inside it, only a broken connection
            raise Invalid(f"header Last-Event-ID: must be an event id, at most {MAX_ROW_ID}")
        return max(position, 0)
    return after


def events_router(check_campaign: CampaignCheck) -> APIRouter:
    """The ``/events`` routes: the SSE stream and its JSON twin, ``/events/log``."""
    router = APIRouter(
        prefix="/events", tags=["events"], responses={401: {"model": ErrorBody}, 404: {"model": ErrorBody}}
    )

    @router.get(
        "",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "An endless SSE stream"}},
    )
    async def stream_events(
        request: Request,
        user: CurrentUser,
        settings: SettingsDep,
        campaign_id: RowIdQuery = None,
        after: EventPositionQuery = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
    ) -> StreamingResponse:
        return await open_event_stream(request, user, settings, campaign_id, after, last_event_id, check_campaign)

    @router.get("/log", response_model=list[EventInfo])
    def event_log(
        user: CurrentUser,
        session: ReadSessionDep,
        campaign_id: RowIdQuery = None,
        after: EventPosition = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[EventInfo]:
        """The same events as the stream, as a JSON page: ids after ``after``, oldest first."""
        if campaign_id is not None:
            check_campaign(session, user.user_id, campaign_id)
        return [
            event_info(event)
            for event in events_after(
                session=session, after_id=after, owner_id=user.user_id, campaign_id=campaign_id, limit=limit
            )
        ]

    return router


async def open_event_stream(
    request: Request,
    user: Principal,
    settings: Settings,
    campaign_id: int | None,
    after: int | None,
    last_event_id: str | None,
    check_campaign: CampaignCheck,
) -> StreamingResponse:
    """The SSE answer for ``user``: this endpoint's, and the dashboard's (which authenticates by cookie)."""
    database = get_database(request)
    start = _start_after(last_event_id, after)

    def first_position() -> int:
        with database.session(write=False) as session:
            if campaign_id is not None:
                check_campaign(session, user.user_id, campaign_id)  # 404 if not theirs
            return latest_event_id(session=session) if start is None else start

    position = await anyio.to_thread.run_sync(first_position)
    return StreamingResponse(
        _sse(request, database, user, campaign_id, position, settings.events_poll_s, settings.sse_keepalive_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


PAGE = 500  # events per poll of a stream


def next_page(
    *, session: Session, after_id: int, owner_id: int, campaign_id: int | None
) -> tuple[list[EventInfo], int]:
    """A stream's next events for ``owner_id``, and the position to poll from next.

    Event ids follow commit order (one writer at a time: SQLite, or the
    advisory lock of :mod:`service.events.service` on PostgreSQL), so every
    event up to the newest id read *before* the query is already visible.
    When the page is not full the position moves past them all, other users'
    events included: each poll then reads only what is new, instead of
    scanning again every event since this user's last one.
    """
    newest = latest_event_id(session=session)
    events = events_after(session=session, after_id=after_id, owner_id=owner_id, campaign_id=campaign_id, limit=PAGE)
    infos = [event_info(event) for event in events]
    caught_up = len(infos) < PAGE
    return infos, max([after_id, *(e.id for e in infos), *([newest] if caught_up else [])])


async def _sse(
    request: Request,
    database: Database,
    user: Principal,
    campaign_id: int | None,
    position: int,
    poll_s: float,
    keepalive_s: float,
) -> AsyncIterator[str]:
    def fetch(after_id: int) -> tuple[list[EventInfo], int]:
        with database.session(write=False) as session:
            return next_page(session=session, after_id=after_id, owner_id=user.user_id, campaign_id=campaign_id)

    yield f"retry: 2000\n: stream of events after id {position}\n\n"
    quiet = 0.0
    closing = getattr(request.app.state, "closing", None)  # the server is stopping (service.app)
    while not await request.is_disconnected() and not (closing is not None and closing.is_set()):
        events, position = await anyio.to_thread.run_sync(fetch, position)
        for event in events:
            yield f"id: {event.id}\nevent: {event.kind}\ndata: {event.model_dump_json()}\n\n"
        if events:
            quiet = 0.0
            continue
        await asyncio.sleep(poll_s)
        quiet += poll_s
        if quiet >= keepalive_s:
            quiet = 0.0
            yield ": keepalive\n\n"
