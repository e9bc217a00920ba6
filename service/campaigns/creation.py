"""Creating a campaign: checks of its spec against the site's files, the idempotent insert, a clone's spec."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    BigInteger,
    Insert,
    Integer,
    String,
    insert,
    literal,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from schemas.instrument import FocalPlaneFileError, ScheduleFileError, instrument_summary, resolve_files
from schemas.io import problem_message
from schemas.spec import CampaignSpec, scan_key, spec_hash
from schemas.states import (
    CampaignState,
    RealizationState,
)
from service.campaigns.errors import (
    IdempotencyKeyReused,
)
from service.campaigns.models import Campaign, Realization
from service.campaigns.reads import get_campaign
from service.campaigns.specs import current_spec
from service.db import UTCDateTime, utcnow
from service.errors import InvalidField, InvalidFields
from service.events.service import record_event
from service.workers.models import Worker

log = logging.getLogger("mapcampaign.service")


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
        raise InvalidFields(
            # The message is made here, against the spec model ("did you mean"), not the request's.
            [(("body", "changes", *item["loc"]), problem_message(CampaignSpec, item)) for item in error.errors()]
        ) from None
