"""HTTP for workers of sites that keep their maps: their partial map sums (:mod:`service.products.mapsums`) and
the kept files the service asks them to send (:mod:`service.keptfiles`)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request

from schemas.api import ErrorBody, KeptFileFailure, KeptFileRequest, KeptFileRequests, SiteSumsReceipt
from schemas.spec import CampaignSpec
from service.campaigns.errors import CampaignNotFound
from service.campaigns.models import Campaign
from service.db import get_database, utcnow
from service.deps import CurrentWorker, RowId, SettingsDep
from service.errors import Invalid, NotFound
from service.keptfiles import accept_fetched, fail_request, pending_requests, read_request, request_path
from service.limits import receive_to_file, stream_body
from service.products.mapsums import store_site_sums
from service.products.reconcile import reconcile_campaign
from service.storage import CampaignProducts
from service.workers.service import hold_worker

_errors: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 408, 409, 413, 422, 507)
}
site_sums_router = APIRouter(prefix="/workers", tags=["workers"], responses=_errors)


@site_sums_router.put(
    "/{worker_id}/campaigns/{campaign_id}/map-sums",
    response_model=SiteSumsReceipt,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def put_map_sums(
    worker_id: RowId, campaign_id: RowId, request: Request, principal: CurrentWorker, settings: SettingsDep
) -> SiteSumsReceipt:
    """Replace the calling worker's site's partial map sums of the campaign (an npz, :mod:`campaignlib.sitesums`).

    The token, the worker and the campaign are checked before the body is read; the body may be
    ``MAPCAMPAIGN_MAX_ARTIFACT_BYTES`` long. Refused with 422 naming the member or the rule (wrong shape,
    pixel index, nside, a realisation counted elsewhere or not kept at the site), 409 when the service holds
    sums of more realisations for the site; a refusal changes nothing stored."""
    database = get_database(request)

    def check() -> tuple[str, int, str]:
        with database.session() as session:
            worker = hold_worker(session=session, principal=principal, worker_id=worker_id, now=utcnow())
            campaign = session.get(Campaign, campaign_id)
            if campaign is None:
                raise CampaignNotFound(f"campaign {campaign_id} does not exist")
            found = worker.site, CampaignSpec.model_validate(campaign.spec).pixelization.nside, campaign.spec_hash
            session.rollback()  # hold_worker's heartbeat is for claims; this call changes no row
            return found

    site, nside, spec_hash = await anyio.to_thread.run_sync(check)
    files = CampaignProducts(settings.products_dir, campaign_id)
    received = await receive_to_file(
        stream_body(request, max_bytes=settings.max_artifact_bytes, idle_timeout_s=settings.upload_idle_timeout_s),
        folder=files.root,
    )

    def store() -> SiteSumsReceipt:
        # The sums name realisations the service accepted; a result whose hook has not run yet joins first.
        reconcile_campaign(database=database, products_dir=settings.products_dir, campaign_id=campaign_id)
        stored = store_site_sums(files, site=site, received=received.path, nside=nside, spec_hash=spec_hash)
        return SiteSumsReceipt(campaign_id=campaign_id, site=site, version=stored.version, pixels=stored.pixels)

    try:
        return await anyio.to_thread.run_sync(store)
    finally:
        received.path.unlink(missing_ok=True)


def _worker_site(database, principal, worker_id: int) -> str:
    with database.session() as session:
        worker = hold_worker(session=session, principal=principal, worker_id=worker_id, now=utcnow())
        site = worker.site
        session.rollback()
        return site


@site_sums_router.get("/{worker_id}/fetches", response_model=KeptFileRequests)
async def list_fetches(
    worker_id: RowId, request: Request, principal: CurrentWorker, settings: SettingsDep
) -> KeptFileRequests:
    """The kept files of the worker's site that the service was asked for and cannot read: send each with
    ``PUT /workers/{id}/fetches/{campaign_id}/{realization}/{role}``, or say why not (``.../failed``)."""
    site = await anyio.to_thread.run_sync(lambda: _worker_site(get_database(request), principal, worker_id))
    found = await anyio.to_thread.run_sync(lambda: pending_requests(settings.products_dir, site))
    return KeptFileRequests(
        requests=[
            KeptFileRequest.model_validate({key: item[key] for key in KeptFileRequest.model_fields}) for item in found
        ]
    )


def _request_of(settings, site: str, campaign_id: int, realization: int, role: str) -> dict[str, Any]:
    request = read_request(request_path(settings.products_dir, site, campaign_id, realization, role))
    if request is None or request.get("state") != "pending":
        raise NotFound(f"no pending request for realisation {realization}'s {role} of campaign {campaign_id}")
    return request


@site_sums_router.put(
    "/{worker_id}/fetches/{campaign_id}/{realization}/{role}",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def put_fetch(
    worker_id: RowId,
    campaign_id: RowId,
    realization: int,
    role: str,
    request: Request,
    principal: CurrentWorker,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Send a requested kept file; kept (and served to whoever asked) once its size and SHA-256 are those
    the result recorded, else 422 and the request fails for good (the file is damaged at the site)."""
    site = await anyio.to_thread.run_sync(lambda: _worker_site(get_database(request), principal, worker_id))
    wanted = _request_of(settings, site, campaign_id, realization, role)
    files = CampaignProducts(settings.products_dir, campaign_id)
    received = await receive_to_file(
        stream_body(request, max_bytes=settings.max_artifact_bytes, idle_timeout_s=settings.upload_idle_timeout_s),
        folder=files.root,
    )
    try:
        accept_fetched(files, wanted, received.path, received.sha256, received.size_bytes)
    except ValueError as error:
        raise Invalid(str(error)) from None
    finally:
        received.path.unlink(missing_ok=True)
    return {"campaign_id": campaign_id, "realization": realization, "role": role, "sha256": received.sha256}


@site_sums_router.post("/{worker_id}/fetches/{campaign_id}/{realization}/{role}/failed", status_code=200)
async def fetch_failed(
    worker_id: RowId,
    campaign_id: RowId,
    realization: int,
    role: str,
    failure: KeptFileFailure,
    request: Request,
    principal: CurrentWorker,
    settings: SettingsDep,
) -> dict[str, Any]:
    """The site cannot send the file (gone, damaged): downloads of it answer 404 with this reason from now on."""
    site = await anyio.to_thread.run_sync(lambda: _worker_site(get_database(request), principal, worker_id))
    wanted = _request_of(settings, site, campaign_id, realization, role)
    fail_request(settings.products_dir, wanted, f"worker {worker_id}: {failure.reason}")
    return {"campaign_id": campaign_id, "realization": realization, "role": role, "state": "failed"}
