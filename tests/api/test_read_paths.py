"""The read paths a collaboration polls: campaign status with its ETag, realisation pages by cursor, and who may read.

On SQLite and PostgreSQL (the ``database_url`` fixture): the token is checked in the read's own session
(a revoked token is refused at once, a worker token is refused), a status answer carries an ETag and a
repeated read with ``If-None-Match`` gets an empty 304 until something changes, and cursor pages give
every realisation once, in order, with or without a state filter, however the pages are cut.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import select, text, update

from service import db
from service.auth.models import ApiToken, User
from service.auth.service import hash_token
from service.campaigns import reads
from service.conditional import etag_of, tag_matches
from service.config import Settings
from service.db import Database
from tests.support.databases import statements_sent


def test_status_has_an_etag_and_answers_304_while_nothing_changed(api):
    campaign = api.create(realizations=6)
    path = f"/campaigns/{campaign['id']}"
    first = api.get(path)
    assert first.status_code == 200 and first.json()["progress"]["counts"]["queued"] == 6
    tag = first.headers["etag"]
    assert tag == etag_of(first.content) and first.headers["cache-control"] == "no-cache"
    again = api.get(path, headers={"If-None-Match": tag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == tag
    for header in (f'W/{tag}, "other"', f'"other", {tag}', "*"):  # weak form, lists and any-tag match too
        assert api.get(path, headers={"If-None-Match": header}).status_code == 304, header
    assert api.get(path, headers={"If-None-Match": '"stale"'}).status_code == 200
    assert api.post(f"{path}/cancel", json={"reason": "enough"}).status_code == 200
    changed = api.get(path, headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.json()["state"] == "cancelled"
    assert changed.headers["etag"] != tag and changed.headers["etag"] == etag_of(changed.content)


def test_a_304_is_never_given_to_another_user_or_without_a_token(api):
    campaign = api.create(realizations=2)
    path = f"/campaigns/{campaign['id']}"
    tag = api.get(path).headers["etag"]
    assert api.get(path, token=api.bob, headers={"If-None-Match": tag}).status_code == 404
    assert api.request("GET", path, None, headers={"If-None-Match": tag}).status_code == 401


def test_tag_matching_follows_rfc_9110():
    tag = '"abc"'
    assert tag_matches('"abc"', tag) and tag_matches('W/"abc"', tag) and tag_matches(' "x" ,W/"abc" ', tag)
    assert tag_matches("*", tag)
    assert not tag_matches(None, tag) and not tag_matches("", tag) and not tag_matches('"abcd"', tag)
    assert not tag_matches("abc", tag)  # an unquoted value is not the tag


def _all_pages(api, campaign_id: int, limit: int, **params) -> list[list[int]]:
    pages, cursor = [], None
    while True:
        answer = api.get(
            f"/campaigns/{campaign_id}/realizations",
            params={"limit": limit, **params, **({"cursor": cursor} if cursor else {})},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append([item["index"] for item in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_cursor_pages_give_every_realisation_once_in_order(api):
    campaign = api.create(realizations=23)
    worker = api.register()
    api.build_plan(worker)
    claimed = api.claim(worker, max_tasks=4)
    for task in claimed[:2]:
        assert api.succeed(task).status_code == 200
    for limit in (1, 5, 22, 23, 500):
        pages = _all_pages(api, campaign["id"], limit)
        assert [index for page in pages for index in page] == list(range(23)), limit
        assert all(len(page) == limit for page in pages[:-1]) and 0 < len(pages[-1]) <= limit
    succeeded = sorted(task["realization"] for task in claimed[:2])
    still_claimed = sorted(task["realization"] for task in claimed[2:])
    assert _all_pages(api, campaign["id"], 1, state="succeeded") == [[succeeded[0]], [succeeded[1]]]
    assert [i for page in _all_pages(api, campaign["id"], 1, state="claimed") for i in page] == still_claimed
    queued = [i for page in _all_pages(api, campaign["id"], 7, state="queued") for i in page]
    assert queued == sorted(set(range(23)) - set(succeeded) - set(still_claimed))
    items = api.get(f"/campaigns/{campaign['id']}/realizations", params={"state": "claimed"}).json()["items"]
    assert {item["lease_holder"] for item in items} == {"w1"} and all(item["attempts"] == 1 for item in items)


def test_an_empty_page_is_200_for_the_owner_and_404_for_anyone_else(api):
    campaign = api.create(realizations=3)
    path = f"/campaigns/{campaign['id']}/realizations"
    empty = api.get(path, params={"state": "failed"})
    assert empty.status_code == 200 and empty.json() == {"items": [], "next_cursor": None}
    cursor = api.get(path, params={"limit": 1}).json()["next_cursor"]
    assert api.get(path, token=api.bob, params={"limit": 1}).status_code == 404
    assert api.get(path, token=api.bob, params={"cursor": cursor}).status_code == 404  # a cursor opens nothing
    assert api.get("/campaigns/999999/realizations").status_code == 404
    assert api.get(path, params={"cursor": "bm90IGEgY3Vyc29y"}).status_code == 422


def test_read_routes_check_the_token_in_their_own_session(api):
    campaign = api.create(realizations=2)
    paths = [
        f"/campaigns/{campaign['id']}",
        f"/campaigns/{campaign['id']}/realizations",
        f"/campaigns/{campaign['id']}/realizations/0",
        "/campaigns",
    ]
    for path in paths:
        assert api.get(path).status_code == 200, path
        assert api.request("GET", path, None).status_code == 401, path
        assert api.get(path, token="mcu_not-a-token").status_code == 401, path
        worker = api.get(path, token=api.alice_worker)
        assert worker.status_code == 403 and worker.json()["code"] == "wrong_token_kind", path
    with api.database.session() as session:
        session.execute(
            update(ApiToken).where(ApiToken.token_hash == hash_token(api.alice)).values(revoked_at=datetime.now(UTC))
        )
        session.commit()
    for path in paths:  # revoked: refused on the very next read (no cache of tokens)
        answer = api.get(path)
        assert answer.status_code == 401 and answer.json()["code"] == "invalid_token", path


@pytest.mark.postgres
def test_a_pooled_connection_is_pinged_after_lying_idle_and_replaced_when_dead(pg_url, tmp_path, monkeypatch):
    settings = Settings(database_url=pg_url, data_dir=tmp_path)
    database = Database(settings.effective_database_url, settings)
    now = [1_000.0]
    monkeypatch.setattr(db, "_monotonic", lambda: now[0])
    try:
        with database.session(write=False) as session:
            first = session.scalar(text("SELECT pg_backend_pid()"))
        with database.session(write=False) as session:  # in steady use: the same connection, no ping
            assert session.scalar(text("SELECT pg_backend_pid()")) == first
        with psycopg.connect(pg_url, autocommit=True) as admin:  # the server drops it, as a restart would
            assert admin.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone() == (True,)
        now[0] += db.PING_AFTER_IDLE_S + 0.5
        with database.session(write=False) as session:  # idle long enough: pinged, found dead, replaced
            second = session.scalar(text("SELECT pg_backend_pid()"))
        assert second is not None and second != first
    finally:
        database.dispose()


def test_a_status_read_and_a_page_are_one_statement_each(api):
    """The polled reads are bound by round trips: the token's check, the campaign and its progress (or
    the page) in one statement. A refused or empty read may take more (the ordinary checks say why)."""
    campaign = api.create(realizations=12)
    worker = api.register()
    api.build_plan(worker)
    api.claim(worker, max_tasks=3)
    reads = [
        (f"/campaigns/{campaign['id']}", {}),
        (f"/campaigns/{campaign['id']}/realizations", {"limit": 5}),
        (f"/campaigns/{campaign['id']}/realizations", {"limit": 5, "state": "claimed"}),
    ]
    cursor = api.get(reads[1][0], params={"limit": 5}).json()["next_cursor"]
    reads.append((reads[1][0], {"limit": 5, "cursor": cursor}))
    for path, params in reads:
        api.get(path, params=params)  # the spec is validated and kept on the first status read
        with statements_sent(api.database.engine) as seen:
            assert api.get(path, params=params).status_code == 200
        queries = [statement for statement in seen if not statement.startswith("BEGIN")]  # SQLite's own BEGIN
        assert len(queries) == 1, (path, params, queries)


def test_the_one_statement_status_is_the_status_of_the_ordinary_reads(api, clock, monkeypatch):
    """Counts, throughput and ETA from the one statement equal those of ``reads.detail`` (the answer of
    the writing endpoints), for a running campaign and for one that ended (its span, not the window)."""
    running = api.create(realizations=10)
    ended = api.create(realizations=2)
    worker = api.register(capacity=20)
    api.build_plan(worker)
    tasks = api.claim(worker, max_tasks=12)
    clock.advance(120)
    for task in tasks[:5]:
        assert api.succeed(task).status_code == 200
    for task in tasks:
        if task["campaign_id"] == ended["id"] and task not in tasks[:5]:
            assert api.succeed(task).status_code == 200
    clock.advance(30)
    now = clock()
    monkeypatch.setattr(db, "clock", lambda: now)  # both reads at one instant: throughputs and ETAs equal exactly
    with api.database.session(write=False) as session:
        owner = session.scalar(select(User).where(User.name == "alice"))
        expected = {
            campaign_id: reads.detail(
                session=session,
                campaign=reads.get_campaign(session=session, owner_id=owner.id, campaign_id=campaign_id),
                owner="alice",
                window_s=Settings().throughput_window_s,
            ).model_dump(mode="json")
            for campaign_id in (running["id"], ended["id"])
        }
    states = set()
    for campaign_id, detail in expected.items():
        answer = api.get(f"/campaigns/{campaign_id}").json()
        assert answer == detail
        states.add(answer["state"])
        assert answer["progress"]["throughput_per_hour"] is not None
    assert states == {"running", "succeeded"}
