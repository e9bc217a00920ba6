"""Hooks called after a realisation's result is accepted and committed.

The Monte Carlo aggregates (mean and scatter of spectra, noise bias, transfer
function) and quick-look images will register here::

    from service.campaigns.hooks import on_result_accepted

    @on_result_accepted
    def update_aggregates(accepted: AcceptedResult) -> None: ...

A hook runs in the request's worker thread after the commit; an exception in a
hook is logged and does not undo the accepted result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("mapcampaign.service")


@dataclass(frozen=True)
class AcceptedResult:
    campaign_id: int
    realization: int
    result: dict[str, Any]
    product_dir: Path = Path()
    settings: Any = None  # service.config.Settings of the process that accepted it


ResultHook = Callable[[AcceptedResult], None]
_HOOKS: list[ResultHook] = []


def on_result_accepted(hook: ResultHook) -> ResultHook:
    if hook not in _HOOKS:
        _HOOKS.append(hook)
    return hook


def remove_result_hook(hook: ResultHook) -> None:
    if hook in _HOOKS:
        _HOOKS.remove(hook)


def run_result_hooks(accepted: AcceptedResult) -> None:
    for hook in _HOOKS:
        try:
            hook(accepted)
        except Exception:
            log.exception(
                "result hook %s failed for campaign %d realisation %d",
                getattr(hook, "__name__", hook),
                accepted.campaign_id,
                accepted.realization,
            )
