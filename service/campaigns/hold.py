"""Fail fast: a campaign whose attempts keep failing the same way is held instead of burning every attempt.

A missing input, a bad option or a broken installation fails every realisation alike; retrying each up to
``max_attempts`` only multiplies the wasted allocations. When the last K ended attempts of a campaign (K the
spec's ``hold_after_failures``), counted since it was last queued or released, are failures with one
signature, of more than one realisation, the campaign goes to ``held``: the claim no longer hands out its queued
realisations, the running ones finish, and the reason is kept as its ``failure_cause`` and in a ``campaign``
event. ``retry`` releases it (:func:`service.campaigns.lifecycle.retry_failed`).

The signature is the failure class with the last line of the log tail, digits and hexadecimal runs
blanked: "realisation 3 ... FileNotFoundError: sky_0003.fits" and the same for realisation 7 match.
Failures that are the site's doing, not the spec's (a lost or drained worker, a site error, a cancel), do
not count and do not break a run of alike failures. One realisation failing again and again alike (a seed
the solver cannot converge on) is left to its own ``max_attempts``: the run must span two realisations.
A worker that claims one task at a time gets a requeued realisation back first, so with the default K = 3
and ``max_attempts`` = 3 a campaign is held after four attempts (three of realisation 0, one of 1), not
after all its realisations' attempts.
"""

from __future__ import annotations

import re

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas.spec import CampaignSpec
from schemas.states import CampaignState, Entity, advance
from service.campaigns.models import Attempt, Campaign
from service.events.service import record_event

NOT_THE_SPECS_DOING = ("lost_worker", "node_failure", "drained", "site_error", "cancelled")
_VARIABLE = re.compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}|\d+")
SIGNATURE_CHARS = 300


def failure_signature(failure_class: str | None, log_tail: str | None) -> str:
    """``class: last line`` with the parts that differ between realisations (numbers, hashes) blanked."""
    lines = [line.strip() for line in (log_tail or "").splitlines() if line.strip()]
    last = _VARIABLE.sub("#", lines[-1])[:SIGNATURE_CHARS] if lines else ""
    return f"{failure_class}: {last}" if last else str(failure_class)


def hold_after(campaign: Campaign) -> int:
    """The campaign's K (0: never hold); a spec stored before the field existed gets the default."""
    value = campaign.spec.get("hold_after_failures")
    if value is None:
        return int(CampaignSpec.model_fields["hold_after_failures"].default)
    return int(value)


def hold_if_failing_alike(*, session: Session, campaign: Campaign) -> bool:
    """Hold the (locked) campaign if its last K counted attempts failed alike (two realisations or more);
    True if so."""
    k = hold_after(campaign)
    if k <= 0 or campaign.state != CampaignState.RUNNING:  # a failure report: the campaign has started
        return False
    session.flush()  # the attempt just ended is among those read
    recent = session.execute(
        select(Attempt.realization_id, Attempt.failure_class, Attempt.log_tail)
        .where(
            Attempt.campaign_id == campaign.id,
            Attempt.ended_at.is_not(None),
            Attempt.ended_at >= campaign.queued_at,
            (Attempt.failure_class.is_(None)) | (Attempt.failure_class.not_in(NOT_THE_SPECS_DOING)),
        )
        .order_by(Attempt.ended_at.desc(), Attempt.id.desc())
        .limit(k)
    ).all()
    if len(recent) < k or any(failure_class is None for _, failure_class, _ in recent):  # None: a success
        return False
    signatures = {failure_signature(failure_class, tail) for _, failure_class, tail in recent}
    if len(signatures) != 1 or len({realization for realization, _, _ in recent}) < min(k, 2):
        return False
    [signature] = signatures
    before = campaign.state
    campaign.state = advance(Entity.CAMPAIGN, before, CampaignState.HELD)
    campaign.failure_cause = (
        f"held: the last {k} attempts failed alike ({signature}); "
        f"fix the cause, then `mapcampaign retry {campaign.id}` releases it"
    )
    record_event(
        session,
        "campaign",
        state=campaign.state,
        owner_id=campaign.owner_id,
        campaign_id=campaign.id,
        data={"from": before, "failure_cause": campaign.failure_cause, "signature": signature, "failures": k},
    )
    return True
