"""Service functions on the real databases, each test inside a transaction rolled back at its end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from schemas.api import parse_task_id, preprocess_task_id, realize_task_id
from schemas.spec import CampaignSpec
from service.auth.models import User
from service.auth.service import create_token, principal_for_token
from service.campaigns.creation import create_campaign
from service.campaigns.lifecycle import settle_campaign
from service.campaigns.models import Campaign, Realization
from service.campaigns.reads import list_campaigns
from service.db import make_engine
from service.pagination import BadCursor, decode_cursor, encode_cursor
from tests.support.service_helpers import spec_data


@pytest.fixture
def session(database_url: str) -> Iterator[Session]:
    engine = make_engine(database_url)
    connection = engine.connect()
    outer = connection.begin()
    session = Session(bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False)
    try:
        yield session
    finally:
        session.close()
        outer.rollback()
        connection.close()
        engine.dispose()


def make_campaign(session: Session, owner: str = "alice", **changes) -> Campaign:
    create_token(session=session, user_name=owner, kind="user")
    owner_id = session.scalar(select(User.id).where(User.name == owner))
    campaign, created = create_campaign(
        session=session, owner_id=owner_id, spec=CampaignSpec.model_validate(spec_data(**changes))
    )
    assert created
    return campaign


def set_states(session: Session, campaign: Campaign, states: list[str]) -> None:
    for index, state in enumerate(states):
        session.execute(
            update(Realization)
            .where(Realization.campaign_id == campaign.id, Realization.index == index)
            .values(state=state)
        )


@pytest.mark.parametrize(
    "states, expected",
    [
        (["queued", "queued", "queued"], "queued"),
        (["claimed", "queued", "queued"], "running"),
        (["succeeded", "queued", "queued"], "running"),
        (["succeeded", "succeeded", "succeeded"], "succeeded"),
        (["succeeded", "failed", "succeeded"], "failed"),
        (["succeeded", "running", "failed"], "running"),
    ],
)
def test_campaign_state_follows_its_realisations(session, states, expected):
    campaign = make_campaign(session, realizations=3)
    set_states(session, campaign, states)
    settle_campaign(session=session, campaign=campaign)
    assert campaign.state == expected
    assert (campaign.finished_at is not None) == (expected in ("succeeded", "failed"))
    if expected == "failed":
        assert campaign.failure_cause == "1 of 3 realisations failed"


def test_cancelled_campaign_stays_cancelled(session):
    campaign = make_campaign(session, realizations=1)
    campaign.state = "cancelled"
    set_states(session, campaign, ["succeeded"])
    settle_campaign(session=session, campaign=campaign)
    assert campaign.state == "cancelled"


def test_idempotency_key_is_per_owner(session):
    first = make_campaign(session, "alice")
    alice = session.scalar(select(User.id).where(User.name == "alice"))
    spec = CampaignSpec.model_validate(spec_data(realizations=2))
    one, created_one = create_campaign(session=session, owner_id=alice, spec=spec, idempotency_key="k")
    two, created_two = create_campaign(session=session, owner_id=alice, spec=spec, idempotency_key="k")
    assert created_one and not created_two and one.id == two.id != first.id
    items, cursor = list_campaigns(session=session, owner_id=alice, limit=1)
    assert [c.id for c in items] == [one.id] and cursor is not None
    items, _ = list_campaigns(session=session, owner_id=alice, cursor=cursor, limit=5)
    assert [c.id for c in items] == [first.id]


def test_tokens_resolve_to_their_principal(session):
    token = create_token(session=session, user_name="dora", kind="worker")
    principal = principal_for_token(session=session, token=token)
    assert principal.user_name == "dora" and principal.kind == "worker"
    assert principal_for_token(session=session, token=token + "x") is None


def test_cursors_and_task_ids_round_trip():
    assert decode_cursor(encode_cursor({"before_id": 7}), keys=("before_id",)) == {"before_id": 7}
    for bad in ("%%%", encode_cursor({"after_index": 1}), encode_cursor({"before_id": "7"})):
        with pytest.raises(BadCursor):
            decode_cursor(bad, keys=("before_id",))
    assert parse_task_id(realize_task_id(42)) == ("realize", 42, None)
    assert parse_task_id(preprocess_task_id(3, 2)) == ("preprocess", 3, 2)
    assert parse_task_id("realize-") is None and parse_task_id("preprocess-1") is None
