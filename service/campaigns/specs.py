"""Campaign specs as validated models, kept per process.

A stored spec is validated again on every read that returns it (a status poll, each claim's tasks); a
spec is never changed after submit, only extended, so the model is kept by the spec's hash (all of it
but the count) and its current count, and the stored JSON is read only when it is not here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from schemas.spec import CampaignSpec


class SpecKey(Protocol):
    """What names a campaign's spec as it stands: a Campaign row or a statement's row with these columns."""

    @property
    def spec_hash(self) -> str: ...

    @property
    def realizations(self) -> int: ...


class KnownSpec(NamedTuple):
    spec: CampaignSpec  # shared between requests: read-only
    json_bytes: int  # size of its JSON, what it adds to an answer that carries it (claims cap the sum)


_KEPT = 512
_known: OrderedDict[tuple[str, int], KnownSpec] = OrderedDict()
_lock = threading.Lock()  # reads run in the thread pool


def known_spec(campaign: SpecKey, submitted: Callable[[], Mapping[str, Any] | None]) -> KnownSpec:
    """The campaign's spec as it stands: as submitted (``submitted()``, its stored JSON, called only when the
    spec is not kept here), with the realisations of extensions added; the least recently used of more than
    512 are dropped."""
    key = (campaign.spec_hash, campaign.realizations)
    with _lock:
        known = _known.get(key)
        if known is not None:
            _known.move_to_end(key)
            return known
    spec = CampaignSpec.model_validate({**(submitted() or {}), "realizations": campaign.realizations})
    known = KnownSpec(spec, len(spec.model_dump_json()))
    with _lock:
        _known[key] = known
        if len(_known) > _KEPT:
            _known.popitem(last=False)
    return known


def current_spec(campaign: SpecKey, submitted: Callable[[], Mapping[str, Any] | None]) -> CampaignSpec:
    """:func:`known_spec`'s model."""
    return known_spec(campaign, submitted).spec
