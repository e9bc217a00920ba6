"""The event log as written at commit: every field kept, ids in recording order, on both databases."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select

from service.db import Database
from service.events.models import Event
from service.events.service import record_event


def _write(database: Database, count: int, tag: str) -> None:
    with database.session() as session:
        for number in range(count):
            record_event(
                session,
                "realization",
                state="claimed" if number % 2 else None,
                owner_id=7,
                campaign_id=None if number % 3 else 11,
                realization=number,
                plan_id=None,
                data={"tag": tag, "number": number, "nested": {"list": [1, 2.5, "x"], "none": None}},
            )
        session.commit()


def test_events_keep_every_field_and_their_recording_order(database_url):
    """One event, a claim's few, and more than the statement that takes the event lock carries (1,500: the
    rest follow in an executemany): each gets its fields back and an id above those recorded before it."""
    database = Database(database_url, pool=False)
    try:
        before = datetime.now(UTC)
        for count, tag in ((1, "one"), (7, "few"), (1_500, "many")):
            _write(database, count, tag)
        with database.session(write=False) as session:
            events = list(session.scalars(select(Event).order_by(Event.id)))
    finally:
        database.dispose()
    assert [(event.data["tag"], event.data["number"]) for event in events] == [
        (tag, number) for count, tag in ((1, "one"), (7, "few"), (1_500, "many")) for number in range(count)
    ]
    for event in events:
        number = event.data["number"]
        assert event.kind == "realization"
        assert event.state == ("claimed" if number % 2 else None)
        assert (event.owner_id, event.realization, event.plan_id) == (7, number, None)
        assert event.campaign_id == (None if number % 3 else 11)
        assert event.data["nested"] == {"list": [1, 2.5, "x"], "none": None}
        assert event.created_at.tzinfo is not None and before <= event.created_at <= datetime.now(UTC)
