"""The bandpowers' mode couplings, recorded as realisation results that used them are accepted.

The worker names one coupling file per (site, coupling key) (``schemas.spec.coupling_key``); the first
realisation to need it builds and writes it, the next ones read it, and each result says which and
gives the file's SHA-256 and size. The service keeps one row per (site, coupling key): the file's
identity, the build time (from the builder's result), the accepted results that used it, and the
campaigns they belong to. A result whose file checksum differs from the recorded one (the file was
removed and built again, or replaced) is recorded as a ``coupling`` event in state ``warning``, and the
row then describes the file the newest result used.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from schemas.api import CouplingCampaignRef, CouplingInfo
from schemas.result import RealizationResult
from schemas.spec import CampaignSpec, coupling_key
from service.campaigns.models import Campaign
from service.db import utcnow
from service.events.service import record_event
from service.events.transitions import EventKind
from service.queue.models import CouplingCampaign, ModeCoupling

log = logging.getLogger("mapcampaign.queue")


def _insert(session: Session) -> Any:
    return pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


def record_coupling_use(*, session: Session, campaign: Campaign, site: str, result: RealizationResult) -> None:
    """Count one accepted result against its coupling at ``site``; no-op for a result without a coupling file.

    Called inside the transaction that accepts the result (the campaign's row is locked), so the row is
    written if and only if the result is accepted.
    """
    bandpowers = result.spectra.bandpowers if result.spectra is not None else None
    if bandpowers is None or bandpowers.coupling_sha256 is None or bandpowers.coupling_bytes is None:
        return
    key = coupling_key(CampaignSpec.model_validate(campaign.spec))
    now = utcnow()
    built = bandpowers.coupling_source == "built"
    insert = _insert(session)
    session.execute(
        insert(ModeCoupling)
        .values(
            coupling_key=key,
            site=site,
            scan_key=result.scan_key,
            mask_sha256=bandpowers.mask_sha256,
            file_sha256=bandpowers.coupling_sha256,
            size_bytes=bandpowers.coupling_bytes,
            build_time_s=bandpowers.coupling_build_s if built else None,
            built_at=now if built else None,
            uses=0,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=["site", "coupling_key"])
    )
    # Row lock on PostgreSQL: two results of one coupling accepted at once compare checksums in turn.
    row = session.scalars(
        select(ModeCoupling)
        .where(ModeCoupling.site == site, ModeCoupling.coupling_key == key)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    changes: dict[str, Any] = {"uses": ModeCoupling.uses + 1, "updated_at": now}
    if row.file_sha256 != bandpowers.coupling_sha256:
        log.warning(
            "coupling %s at site %r: realisation %d of campaign %d used a file with sha256 %s, recorded %s",
            key[:12], site, result.realization, campaign.id, bandpowers.coupling_sha256, row.file_sha256,
        )
        record_event(
            session,
            EventKind.COUPLING,
            state="warning",
            owner_id=campaign.owner_id,
            campaign_id=campaign.id,
            realization=result.realization,
            data={
                "coupling_key": key,
                "site": site,
                "recorded_sha256": row.file_sha256,
                "reported_sha256": bandpowers.coupling_sha256,
                "reason": "the coupling file differs from the one recorded for this site and key",
            },
        )
        changes |= {
            "file_sha256": bandpowers.coupling_sha256,
            "size_bytes": bandpowers.coupling_bytes,
            "mask_sha256": bandpowers.mask_sha256,
        }
    if built:
        changes |= {"build_time_s": bandpowers.coupling_build_s, "built_at": now}
    session.execute(
        update(ModeCoupling).where(ModeCoupling.id == row.id).values(**changes).execution_options(synchronize_session=False)
    )
    session.execute(
        insert(CouplingCampaign)
        .values(coupling_id=row.id, campaign_id=campaign.id)
        .on_conflict_do_nothing(index_elements=["coupling_id", "campaign_id"])
    )


def list_couplings(
    *, session: Session, owner_id: int, site: str | None = None, scan_key: str | None = None, limit: int = 200
) -> list[CouplingInfo]:
    """The couplings the owner's campaigns used, newest first, each with those campaigns (newest first).

    Couplings are shared by every campaign with the same pointing and settings at a site; ``uses``
    counts every user's results, and only the caller's own campaigns are named.
    """
    query = (
        select(ModeCoupling)
        .where(
            ModeCoupling.id.in_(
                select(CouplingCampaign.coupling_id)
                .join(Campaign, Campaign.id == CouplingCampaign.campaign_id)
                .where(Campaign.owner_id == owner_id)
            )
        )
        .order_by(ModeCoupling.id.desc())
        .limit(limit)
    )
    if site is not None:
        query = query.where(ModeCoupling.site == site)
    if scan_key is not None:
        query = query.where(ModeCoupling.scan_key == scan_key)
    couplings = list(session.scalars(query))
    campaigns: dict[int, list[tuple[int, str]]] = {coupling.id: [] for coupling in couplings}
    if couplings:
        for coupling_id, campaign_id, name in session.execute(
            select(CouplingCampaign.coupling_id, Campaign.id, Campaign.name)
            .join(Campaign, Campaign.id == CouplingCampaign.campaign_id)
            .where(CouplingCampaign.coupling_id.in_(list(campaigns)), Campaign.owner_id == owner_id)
            .order_by(Campaign.id.desc())
        ):
            campaigns[coupling_id].append((campaign_id, name))
    return [
        CouplingInfo(
            id=coupling.id,
            coupling_key=coupling.coupling_key,
            site=coupling.site,
            scan_key=coupling.scan_key,
            mask_sha256=coupling.mask_sha256,
            file_sha256=coupling.file_sha256,
            size_bytes=coupling.size_bytes,
            build_time_s=coupling.build_time_s,
            built_at=coupling.built_at,
            uses=coupling.uses,
            campaigns=[CouplingCampaignRef(id=i, name=n) for i, n in campaigns[coupling.id]],
            created_at=coupling.created_at,
            updated_at=coupling.updated_at,
        )
        for coupling in couplings
    ]
