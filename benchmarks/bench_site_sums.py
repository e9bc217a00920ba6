"""Maps kept at the site: bytes a realisation uploads in each mode, and the service's merge of site partial sums.

    .venv/bin/python benchmarks/bench_site_sums.py                      # nside 1024, fsky 0.5, two sites
    .venv/bin/python benchmarks/bench_site_sums.py --nside 256 --json sums.json

Upload bytes per realisation: the three maps (``map_iqu``, ``hits``, ``rcond``) written by the
map-maker's own writer (:func:`mapmaker.programs.products.write_cut_sky`, float64 maps) over a sky
fraction ``--fsky``, which ``products.maps = "upload"`` sends and ``"keep"`` does not; both modes send
the spectra, the mask (once per coupling) and the result alike, left out of both figures. Keep mode
sends instead the site's partial sums (:mod:`campaignlib.sitesums`) at most once per
``products.sums_interval_s``: their size over the same pixels, and that size shared by the
``--realizations-per-send`` realisations one send carries.

Merge: ``--sites`` sites, each with partial sums over its own ``--fsky`` of the sky (shifted rings of
pixels, so they overlap in part), stored through :func:`service.products.mapsums.store_site_sums`
beside uploaded-map sums over the whole sky; wall seconds of
:func:`service.products.mapsums.mean_and_variance_maps` (the merge plus the mean and variance maps),
the minimum and the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from campaignlib import sitesums
from campaignlib.sitesums import SiteSums
from mapmaker.programs.products import write_cut_sky
from service.products.aggregates import AggregateState, save_state
from service.products.mapsums import mean_and_variance_maps, store_site_sums
from service.storage import CampaignProducts


def upload_bytes(nside: int, fsky: float, folder: Path, rng: np.random.Generator) -> dict[str, int]:
    npix = 12 * nside**2
    pixels = np.arange(int(fsky * npix), dtype=np.int64)
    common = {"nside": nside, "coord": "E", "header": []}
    iqu = {name: rng.normal(size=pixels.size) for name in ("I_STOKES", "Q_STOKES", "U_STOKES")}
    write_cut_sky(folder / "map_iqu.fits", pixels, iqu, unit="K", **common)
    write_cut_sky(folder / "hits.fits", pixels, {"HITS": np.ones(pixels.size, np.int32)}, **common)
    write_cut_sky(folder / "rcond.fits", pixels, {"RCOND": np.ones(pixels.size, np.float32)}, **common)
    maps = sum((folder / name).stat().st_size for name in ("map_iqu.fits", "hits.fits", "rcond.fits"))
    sums = SiteSums(nside, pixels, np.full(pixels.size, 2, np.int64), np.vstack(list(iqu.values())),
                    np.ones((3, pixels.size)), [[0, 2]])  # fmt: skip
    sitesums.write(folder / "sums.npz", sums)
    return {"maps_bytes": maps, "sums_bytes": (folder / "sums.npz").stat().st_size}


def merge_seconds(
    nside: int, fsky: float, sites: int, repeats: int, folder: Path, rng: np.random.Generator
) -> list[float]:
    npix = 12 * nside**2
    files = CampaignProducts(folder / "products", 1)
    files.root.mkdir(parents=True)
    np.savez(files.map_sums_path(1), count=np.full(npix, 3, np.int64), mean=rng.normal(size=(3, npix)),
             m2=np.ones((3, npix)))  # fmt: skip
    state = AggregateState(campaign_id=1, generation=1)
    state.maps = {"file": files.map_sums_path(1).name, "nside": nside, "n": 3, "ledger": [[0, 3]]}
    per_site = 10
    for site in range(sites):
        first = 3 + site * per_site
        state.kept[f"s{site}"] = [[first, first + per_site]]
    save_state(files, state)
    for site in range(sites):
        first = 3 + site * per_site
        pixels = (np.arange(int(fsky * npix), dtype=np.int64) + site * npix // (2 * sites)) % npix
        pixels.sort()
        sums = SiteSums(nside, pixels, np.full(pixels.size, per_site, np.int64), rng.normal(size=(3, pixels.size)),
                        np.ones((3, pixels.size)), [[first, first + per_site]])  # fmt: skip
        sitesums.write(folder / "send.npz", sums)
        store_site_sums(files, site=f"s{site}", received=folder / "send.npz", nside=nside)
    from service.products.aggregates import load_state

    state = load_state(files)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        mean_and_variance_maps(files, state)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nside", type=int, default=1024)
    parser.add_argument("--fsky", type=float, default=0.5, help="Sky fraction a realisation (and a site) observes")
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--realizations-per-send", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="Also write the figures here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        sizes = upload_bytes(args.nside, args.fsky, Path(scratch), rng)
    with tempfile.TemporaryDirectory() as scratch:
        seconds = merge_seconds(args.nside, args.fsky, args.sites, args.repeats, Path(scratch), rng)
    figures = {
        "nside": args.nside,
        "fsky": args.fsky,
        "upload_mode_map_bytes_per_realization": sizes["maps_bytes"],
        "keep_mode_sums_bytes_per_send": sizes["sums_bytes"],
        "keep_mode_sums_bytes_per_realization": sizes["sums_bytes"] / args.realizations_per_send,
        "realizations_per_send": args.realizations_per_send,
        "sites": args.sites,
        "merge_seconds_min": min(seconds),
        "merge_seconds_median": statistics.median(seconds),
    }
    mib = 2**20
    print(f"nside {args.nside}, fsky {args.fsky}:")
    print(f"  upload mode: {sizes['maps_bytes'] / mib:8.1f} MiB of maps per realisation (plus spectra and result)")
    print(f"  keep mode:   {sizes['sums_bytes'] / mib:8.1f} MiB of partial sums per send, "
          f"{figures['keep_mode_sums_bytes_per_realization'] / mib:.2f} MiB per realisation at "
          f"{args.realizations_per_send} realisations per send (plus spectra and result)")  # fmt: skip
    print(f"  merge of {args.sites} sites' sums into the mean and variance maps: "
          f"{figures['merge_seconds_min']:.2f} s (min), {figures['merge_seconds_median']:.2f} s (median of {args.repeats})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
