"""The campaign's mean and variance maps: the service's sums of uploaded maps merged with the sites' partial sums.

A site that keeps its maps (site setting ``products.maps = "keep"``) sends its partial sums
(:mod:`campaignlib.sitesums`) at a bounded rate; :func:`store_site_sums` checks them and keeps the
latest of each site beside the aggregates, as one folder of ``.npy`` files per site
(``sitesums-<site>-<version>/``, read by memory map), named in ``state.json`` under the campaign's
lock like every other update. :func:`mean_and_variance_maps` merges them into the uploaded maps' sums
with Chan, Golub and LeVeque's pairwise formula (:func:`campaignlib.montecarlo.moments_merge`), in
slices of ``MAP_UPDATE_PIXELS`` pixels, so the merge's temporaries stay a fraction of one map and its
work grows with the number of sites, not of realisations.

What a send must satisfy (else it changes nothing): the campaign's nside and a well-formed file
(:func:`campaignlib.sitesums.read`); a ledger of realisations the service accepted with their map
kept at that site (``state.kept``, filled by :func:`service.products.aggregates.include_realization`),
so that no realisation is counted twice (not by two sites, not as an uploaded map too); a version
(realisations in the ledger) not below the one held, so an older send cannot replace a newer one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from campaignlib import montecarlo, sitesums
from campaignlib.sitesums import SiteSums, SiteSumsInvalid
from service.errors import Conflict, Invalid
from service.products.aggregates import (
    MAP_UPDATE_PIXELS,
    UNSEEN,
    AggregateState,
    _remove_stale,
    campaign_lock,
    load_map_sums,
    load_state,
    save_state,
)
from service.storage import CampaignProducts

ARRAYS = ("pixels", "count", "mean", "m2")


class SiteSumsRefused(Invalid):
    """Partial sums that cannot be used: the message names the member or the rule at fault."""

    code = "site_sums_invalid"


class SiteSumsOutdated(Conflict):
    """Partial sums older than those the service holds for the site (a send overtaken by a later one)."""

    code = "site_sums_outdated"


@dataclass(frozen=True)
class StoredSums:
    site: str
    version: int
    n_realizations: int
    pixels: int


def store_site_sums(
    files: CampaignProducts, *, site: str, received: Path, nside: int, spec_hash: str | None = None
) -> StoredSums:
    """Check the sums file ``received`` (a temporary file, removed) and make it the site's; see the module doc."""
    try:
        try:
            sums = sitesums.read(received, nside=nside)
        except SiteSumsInvalid as error:
            raise SiteSumsRefused(f"map sums: {error}") from None
        with campaign_lock(files):
            state = load_state(files) or AggregateState(campaign_id=files.campaign_id, spec_hash=spec_hash)
            _check_ledger(state, site, sums)
            held = state.site_sums.get(site)
            if held is not None and int(held["version"]) > sums.version:
                raise SiteSumsOutdated(
                    f"map sums of site {site!r} with {sums.version} realisations; the service holds {held['version']}"
                )
            folder = files.site_sums_dir(site, sums.version)
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            for name in ARRAYS:
                np.save(partial / f"{name}.npy", getattr(sums, name))
            shutil.rmtree(folder, ignore_errors=True)  # the same version again: the send is repeated
            os.rename(partial, folder)
            state.site_sums[site] = {
                "file": folder.name,
                "version": sums.version,
                "n": sums.version,
                "ledger": sums.ledger,
                "pixels": int(sums.pixels.size),
            }
            if state.maps is None and sums.pixels.size:
                state.maps = {"file": None, "nside": nside, "n": 0, "ledger": []}
            state.generation += 1
            state.updated_at = datetime.now(UTC).isoformat()
            save_state(files, state)  # the commit point
            _remove_stale(files, state)
            return StoredSums(site, sums.version, sums.version, int(sums.pixels.size))
    finally:
        received.unlink(missing_ok=True)


def _check_ledger(state: AggregateState, site: str, sums: SiteSums) -> None:
    uploaded = (state.maps or {}).get("ledger") or []
    twice = sitesums.ledgers_overlap(uploaded, sums.ledger)
    if twice:
        raise SiteSumsRefused(f"map sums: ledger: realisations {twice} are counted from uploaded maps already")
    for other, held in state.site_sums.items():
        if other != site:
            twice = sitesums.ledgers_overlap(held["ledger"], sums.ledger)
            if twice:
                raise SiteSumsRefused(f"map sums: ledger: realisations {twice} are in the sums of site {other!r}")
    kept = state.kept.get(site, [])
    outside = [
        index
        for start, stop in sums.ledger
        for index in range(start, stop)
        if not sitesums.ledger_contains(kept, index)
    ][:10]
    if outside:
        raise SiteSumsRefused(
            f"map sums: ledger: realisations {outside} are not accepted results whose map site {site!r} keeps"
        )


def load_site_sums(files: CampaignProducts, record: dict) -> dict[str, np.ndarray]:
    """A stored site's ``pixels``, ``count``, ``mean``, ``m2`` as read-only memory maps (shapes: campaignlib.sitesums)."""
    folder = files.root / record["file"]
    return {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS}


def merged_map_sums(files: CampaignProducts, state: AggregateState) -> dict[str, np.ndarray] | None:
    """``count [npix]``, ``mean`` and ``m2 [3, npix]`` over uploaded maps and every site's partial sums."""
    if not state.maps:
        return None
    merged = load_map_sums(files, state) if state.maps.get("file") else None
    if merged is None:
        npix = 12 * int(state.maps["nside"]) ** 2
        merged = {"count": np.zeros(npix, np.int64), "mean": np.zeros((3, npix)), "m2": np.zeros((3, npix))}
    for site in sorted(state.site_sums):
        site_sums = load_site_sums(files, state.site_sums[site])
        for start in range(0, site_sums["pixels"].size, MAP_UPDATE_PIXELS):
            part = slice(start, start + MAP_UPDATE_PIXELS)
            where = np.asarray(site_sums["pixels"][part])
            count, mean, m2 = montecarlo.moments_merge(
                merged["count"][where], merged["mean"][:, where], merged["m2"][:, where],
                site_sums["count"][part], site_sums["mean"][:, part], site_sums["m2"][:, part],
            )  # fmt: skip
            merged["count"][where], merged["mean"][:, where], merged["m2"][:, where] = count, mean, m2
    return merged


def mean_and_variance_maps(files: CampaignProducts, state: AggregateState) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean [3, npix] (K; UNSEEN where never observed) and sample variance [3, npix] (K^2; UNSEEN below 2)."""
    sums = merged_map_sums(files, state)
    if sums is None:
        return None
    count = sums["count"]
    mean = np.where(count > 0, sums["mean"], UNSEEN)
    with np.errstate(divide="ignore", invalid="ignore"):
        variance = np.where(count > 1, np.maximum(sums["m2"], 0.0) / (count - 1), UNSEEN)
    return mean, variance
