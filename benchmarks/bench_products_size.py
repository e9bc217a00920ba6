"""Bytes a realisation writes and uploads, before (full-sky float64) and after (cut-sky), and the service's update.

    .venv/bin/python benchmarks/bench_products_size.py                        # nside 256, 512; update at 1024 too
    .venv/bin/python benchmarks/bench_products_size.py --nsides 64 --update-nsides 128 --json sizes.json

Two campaigns from the bundled examples: ``ground.toml`` (Atacama constant-elevation scans, its
azimuth range ``--ground-azimuth-deg``, by default its own 120 deg centred on the south: fsky 0.11) and ``satellite.toml``
(its drift raised to ``--satellite-drift-deg-day``), at each nside, their 4 detectors copied
``--detector-copies`` times (default nside / 64, satellite nside / 32), each copy shifted by a pixel, so that
the tracks cover the sky at that resolution as a real focal plane does: fsky about 0.1 and 0.86 at nside 512.

The observed pixels are those of the campaign's real pointing (:class:`mapmaker.model.scan.ChunkPointing`
over every chunk). The map values are white noise of 1/sqrt(hits) (no solve: the file sizes depend on
the pixel count, precision and array shapes, not on the values), the analysis mask, coupling and
spectra are the map-maker's own (:mod:`mapmaker.model.spectra`), and the files are written by the
map-maker's writers (:mod:`mapmaker.programs.products`) into a product folder.

Per campaign and nside, in bytes: ``after`` what a realisation writes and the worker uploads
(map_iqu, hits, rcond, spectra; float64 and float32 maps), the mask (per coupling, not per realisation)
and the budget 48 per observed pixel + 1 MiB; ``before`` the former forms, computed: full-sky float64
maps, int64 hits, float64 rcond, the mask in every realisation and the bandpower windows in every
spectra file. ``--update-nsides``: the service's :func:`service.products.aggregates.include_realization`
of one cut-sky map into sums that hold one, wall seconds and tracemalloc peak in I/Q/U float64 maps.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import healpy as hp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mapmaker.model import bandpowers, spectra
from mapmaker.model.decomposition import chunk_layout
from mapmaker.model.scan import ChunkPointing
from mapmaker.programs import products
from schemas.files import atomic_write, sha256_file
from schemas.io import example_spec_path, load_spec
from schemas.spec import CampaignSpec

FITS_BLOCK = 2880
MIB = 2**20


def campaign(kind: str, nside: int, args: argparse.Namespace) -> CampaignSpec:
    """The bundled example of ``kind`` at ``nside``, scaled as the module says."""
    spec = load_spec(example_spec_path(kind))
    data = spec.model_dump(mode="json")
    data["pixelization"]["nside"] = nside
    if kind == "ground":
        half = args.ground_azimuth_deg / 2
        data["scan"]["azimuth_min_deg"], data["scan"]["azimuth_max_deg"] = 180.0 - half, 180.0 + half
    else:
        data["scan"]["drift_deg_per_day"] = args.satellite_drift_deg_day
    # The examples' 4 detectors leave gaps between their tracks finer than nside 64 resolves: copies shifted
    # by a pixel across and along fill them, as a real focal plane's hundreds of detectors do.
    per_64 = 2 if kind == "satellite" else 1  # the satellite's rings cross at a wider angle: twice the copies
    copies = max(1, per_64 * nside // 64) if args.detector_copies is None else args.detector_copies
    pixel_deg = math.degrees(hp.nside2resol(nside))
    data["focal_plane"]["detectors"] = [
        {**detector, "name": f"{detector['name']}c{copy}",
         "offset_x_deg": detector["offset_x_deg"] + copy * pixel_deg / 2,
         "offset_y_deg": detector["offset_y_deg"] + copy * pixel_deg}
        for copy in range(copies) for detector in data["focal_plane"]["detectors"]
    ]
    return CampaignSpec.model_validate(data)


def hit_map(spec: CampaignSpec) -> np.ndarray:
    """Samples per pixel [npix] int64 of the campaign's pointing."""
    layout = chunk_layout(spec)
    pointing = ChunkPointing(spec, layout)
    hits = np.zeros(hp.nside2npix(spec.pixelization.nside), dtype=np.int64)
    for chunk_id in range(layout.n_chunks):
        chunk = layout.chunk(chunk_id)
        pixels, _ = pointing(chunk.time_chunk, chunk.detector)
        hits += np.bincount(pixels, minlength=hits.size)
    return hits


def synthetic_maps(hits: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """I/Q/U [3, npix] (K, white noise of 1/sqrt(hits), UNSEEN unobserved) and rcond [npix]."""
    generator = np.random.default_rng(seed)
    observed = hits > 0
    iqu = np.full((3, hits.size), hp.UNSEEN)
    iqu[:, observed] = 1e-4 * generator.standard_normal((3, int(observed.sum()))) / np.sqrt(hits[observed])
    rcond = np.full(hits.size, hp.UNSEEN)
    rcond[observed] = generator.uniform(0.05, 0.33, int(observed.sum()))
    return iqu, rcond


def fits_bytes(table_bytes: int) -> int:
    """Size of a one-table FITS file: primary and table headers, data padded to whole blocks."""
    return 2 * FITS_BLOCK + math.ceil(table_bytes / FITS_BLOCK) * FITS_BLOCK


def sizes(kind: str, nside: int, args: argparse.Namespace, scratch: Path) -> dict:
    spec = campaign(kind, nside, args)
    started = time.perf_counter()
    hits = hit_map(spec)
    iqu, rcond = synthetic_maps(hits)
    npix, n_observed = hits.size, int(np.count_nonzero(hits))
    figures: dict = {"campaign": kind, "nside": nside, "npix": npix, "observed_pixels": n_observed,
                     "fsky": n_observed / npix}
    mask = spectra.campaign_mask(spec, iqu, hits)
    coupling = bandpowers.build_coupling(mask, spectra.campaign_binning(spec), purify_b=spec.products.purify_b)
    coupling_path = scratch / f"coupling-{kind}-{nside}.npz"
    atomic_write(coupling_path, coupling.write_npz)
    measured = spectra.for_campaign(spec, iqu, coupling)
    header = [("REALIZ", 1)]
    written = {}
    for precision in ("float64", "float32"):
        folder = products.ProductFolder(scratch / f"{kind}-{nside}-{precision}")
        records = products.write_maps(folder, iqu, hits, rcond, header, "C", precision)
        records += products.write_spectra(folder, measured, header, "C", with_mask=precision == "float64",
                                          coupling_sha256=sha256_file(coupling_path))
        written[precision] = {record.name: record.size_bytes for record in records}
    after = written["float64"]
    realisation = ("iqu", "hits", "rcond", "spectra")
    windows_bytes = int(coupling.bandpower_windows.nbytes)
    before = {
        "iqu": fits_bytes(24 * npix), "hits": fits_bytes(8 * npix), "rcond": fits_bytes(8 * npix),
        "mask": fits_bytes(8 * npix), "spectra": after["spectra"] + windows_bytes,
    }
    figures.update(
        after_bytes={name: after[name] for name in realisation},
        after_total=sum(after[name] for name in realisation),
        after_total_float32=sum(written["float32"][name] for name in realisation),
        after_per_observed_pixel=(sum(after[name] for name in ("iqu", "hits", "rcond"))) / n_observed,
        mask_bytes_per_coupling=after["mask"],
        budget=48 * n_observed + MIB,
        within_budget=sum(after[name] for name in realisation) <= 48 * n_observed + MIB,
        before_bytes=before,
        before_total=sum(before.values()),
        coupling_file_bytes=coupling_path.stat().st_size,
        seconds=time.perf_counter() - started,
    )
    figures["uploaded_after"] = figures["after_total"]  # the worker uploads the files result.json lists
    figures["uploaded_before"] = figures["before_total"]
    figures["shrink"] = figures["after_total"] / figures["before_total"]
    return figures


def update_figures(kind: str, nside: int, args: argparse.Namespace, scratch: Path) -> dict:
    """The service's update of one realisation's cut-sky map into sums that already hold one."""
    from service.products.aggregates import include_realization
    from service.storage import CampaignProducts

    spec = campaign(kind, nside, args)
    hits = hit_map(spec)
    files = CampaignProducts(scratch / f"service-{kind}-{nside}", 1)
    folders = []
    for index in range(2):
        iqu, rcond = synthetic_maps(hits, seed=index)
        folder = products.ProductFolder(scratch / f"update-{kind}-{nside}-{index}")
        records = products.write_maps(folder, iqu, hits, rcond, [("REALIZ", index)], "C")
        del iqu, rcond
        folders.append((folder.commit(), [record.model_dump() for record in records]))
    result = {"realization": 0, "spec_hash": "0" * 64, "products": folders[0][1]}
    include_realization(files, 0, result, folders[0][0])
    tracemalloc.start()
    started = time.perf_counter()
    include_realization(files, 1, {**result, "realization": 1, "products": folders[1][1]}, folders[1][0])
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    iqu_map = 24 * hits.size
    return {"campaign": kind, "nside": nside, "fsky": float(np.count_nonzero(hits) / hits.size),
            "update_seconds": seconds, "update_peak_bytes": peak, "update_peak_iqu_maps": peak / iqu_map}


def main(argv: list[str] | None = None) -> int:
    from benchmarks._support import add_json_option, write_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsides", default="256,512", help="nsides of the file sizes (comma-separated)")
    parser.add_argument("--update-nsides", default="256,512,1024", help="nsides of the service's update")
    parser.add_argument("--campaigns", default="ground,satellite")
    parser.add_argument("--ground-azimuth-deg", type=float, default=120.0, help="azimuth range of the ground scans (the example's 120: fsky 0.11)")
    parser.add_argument("--satellite-drift-deg-day", type=float, default=2880.0)
    parser.add_argument(
        "--detector-copies", type=int, default=None,
        help="copies of the examples' 4 detectors, each shifted by a pixel (default nside / 64; satellite nside / 32)",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    kinds = [kind for kind in args.campaigns.split(",") if kind]
    out: dict = {"sizes": [], "updates": []}
    with tempfile.TemporaryDirectory(prefix="bench-products-") as folder:
        scratch = Path(folder)
        for nside in [int(n) for n in args.nsides.split(",") if n]:
            for kind in kinds:
                row = sizes(kind, nside, args, scratch)
                out["sizes"].append(row)
                print(
                    f"{kind:9s} nside {nside:4d} fsky {row['fsky']:.3f}: written/uploaded {row['after_total'] / MIB:8.2f} MiB "
                    f"(float32 maps {row['after_total_float32'] / MIB:7.2f}) vs before {row['before_total'] / MIB:8.2f} MiB "
                    f"({row['shrink']:.3f}); {row['after_per_observed_pixel']:.1f} B per observed pixel + spectra "
                    f"{row['after_bytes']['spectra'] / MIB:.2f} MiB; budget {'met' if row['within_budget'] else 'MISSED'}; "
                    f"mask {row['mask_bytes_per_coupling'] / MIB:.2f} MiB per coupling",
                    flush=True,
                )
        for nside in [int(n) for n in args.update_nsides.split(",") if n]:
            for kind in kinds:
                row = update_figures(kind, nside, args, scratch)
                out["updates"].append(row)
                print(
                    f"{kind:9s} nside {nside:4d} fsky {row['fsky']:.3f}: service update {row['update_seconds']:.2f} s, "
                    f"peak {row['update_peak_bytes'] / MIB:.0f} MiB = {row['update_peak_iqu_maps']:.2f} I/Q/U maps",
                    flush=True,
                )
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
