"""``python -m mapmaker realize``: one realisation solved (:mod:`mapmaker.solve.realization`), then its products.

After the collective solve, root computes the analysis mask and the
pseudo-spectra (:mod:`mapmaker.model.spectra`), writes the maps and spectra
into a product folder that appears whole or not at all
(:mod:`mapmaker.programs.products`), gathers every rank's figures and writes
``result.json`` (:class:`schemas.result.RealizationResult`) last.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mpi4py import MPI

from mapmaker.kernels import implementation
from mapmaker.model import rng, spectra
from mapmaker.model.decomposition import chunk_layout
from mapmaker.model.noise import NoiseModel
from mapmaker.model.sky import sky_stream_key
from mapmaker.model.spectra import RealizationSpectra
from mapmaker.parallel.commodel import Machine, Selection
from mapmaker.parallel.overlap import OverlapPlan
from mapmaker.programs import products
from mapmaker.programs.products import ProductFolder
from mapmaker.programs.versions import package_versions
from mapmaker.solve.realization import Progress, SolveOutcome, run_realization
from mapmaker.solve.timing import Timers, peak_memory_mib
from schemas.result import ProductFile, RealizationResult
from schemas.spec import CampaignSpec, scan_key, spec_hash


def realize_to_folder(
    spec: CampaignSpec,
    realization: int,
    out: str | Path,
    comm: MPI.Comm,
    *,
    sky_root: str | Path | None = None,
    threads: int = 1,
    progress: Progress | None = None,
    plan: OverlapPlan | None = None,
    plan_document: dict[str, Any] | None = None,
    machine: Machine | None = None,
    kernels: str = implementation.DEFAULT,
) -> RealizationResult | None:
    """Run one realisation and write its products atomically into ``out`` (root writes).

    Returns the validated :class:`schemas.result.RealizationResult` on root,
    None on the other ranks. ``out`` must not exist (checked by the caller
    before the run, and again at the rename). ``plan_document`` is the plan
    file's JSON header (its checksum goes into the result).
    """
    timers = Timers()
    outcome = run_realization(
        spec, realization, comm, sky_root=sky_root, threads=threads, progress=progress, timers=timers, plan=plan,
        machine=machine, kernels=kernels,
    )
    folder, records, measured = None, [], None
    if comm.Get_rank() == 0:
        folder, records, measured = write_products(spec, realization, out, outcome, timers)
    per_rank = gather_rank_figures(comm, outcome, timers)
    if comm.Get_rank() != 0:
        return None
    result = realization_result(
        spec, realization, outcome, per_rank, ranks=comm.Get_size(), threads=threads, kernels=kernels,
        plan_checksum=None if plan_document is None else plan_document["header_sha256"],
        product_records=records, measured=measured,
    )
    try:
        products.write_result(folder, result)
        folder.commit()
    except BaseException:
        folder.discard()
        raise
    return result


def write_products(
    spec: CampaignSpec, realization: int, out: str | Path, outcome: SolveOutcome, timers: Timers
) -> tuple[ProductFolder, list[ProductFile], RealizationSpectra]:
    """On root: the maps, the mask and the spectra, written into a new product folder for ``out``.

    Returns the folder (not yet committed: ``result.json`` goes in last), the
    files' records and the measured spectra.
    """
    with timers("io"):
        folder = ProductFolder(out)
        header = [("REALIZ", realization), ("SCANKEY", scan_key(spec))]
        coord = "C" if spec.scan.kind == "ground" else "E"  # equatorial / ecliptic
        records = products.write_maps(folder, outcome.iqu, outcome.hits, outcome.rcond, header, coord)
    with timers("calc"):
        measured = spectra.for_campaign(spec, outcome.iqu, outcome.hits)
    with timers("io"):
        records += products.write_spectra(folder, measured, header, coord)
    return folder, records, measured


def gather_rank_figures(comm: MPI.Comm, outcome: SolveOutcome, timers: Timers) -> list[dict[str, float]] | None:
    """Collective: each rank's seconds per kind, reduction figures per iteration and peak memory, on root."""
    return comm.gather(
        {
            **timers.seconds,
            "bytes": outcome.stats.reduce_bytes,
            "messages": outcome.stats.reduce_messages,
            "reduce_seconds": outcome.stats.reduce_seconds_in_solve / max(outcome.pcg.iterations, 1),
            "memory": peak_memory_mib(),
        },
        root=0,
    )


def realization_result(
    spec: CampaignSpec,
    realization: int,
    outcome: SolveOutcome,
    per_rank: list[dict[str, float]],
    *,
    ranks: int,
    threads: int,
    kernels: str,
    plan_checksum: str | None,
    product_records: list[ProductFile],
    measured: RealizationSpectra,
) -> RealizationResult:
    """The validated ``result.json`` of a realisation from its outcome and every rank's figures."""
    timers = outcome.timers
    streams, streams_total = rng_stream_records(spec, realization)
    return RealizationResult(
        realization=realization,
        spec_hash=spec_hash(spec),
        scan_key=scan_key(spec),
        ranks=ranks,
        threads_per_rank=threads,
        samples=outcome.samples,
        observed_pixels=outcome.observed_pixels,
        cut_pixels=outcome.cut_pixels,
        excluded_samples=outcome.excluded_samples,
        iterations=outcome.pcg.iterations,
        converged=outcome.pcg.converged,
        residual_history=outcome.pcg.residual_history,
        timing={
            "calc": _spread([r["calc"] for r in per_rank]),
            "comm": _spread([r["comm"] for r in per_rank]),
            "io": _spread([r["io"] for r in per_rank]),
            "total": timers.elapsed(),
        },
        communication={
            "strategy": outcome.strategy,
            "requested": outcome.requested,
            "bytes_per_iteration": _spread([r["bytes"] for r in per_rank]),
            "messages_per_iteration": _spread([r["messages"] for r in per_rank]),
            "reductions": outcome.stats.reductions,
            "bytes_counted": outcome.bytes_counted,
            "seconds_per_iteration": _spread([r["reduce_seconds"] for r in per_rank]),
            "plan": outcome.plan_source,
            "plan_build_s": outcome.plan_build_s,
            "details": outcome.details,
            "selection": None if outcome.selection is None else selection_record(outcome.selection),
        },
        peak_memory_mb=_spread([r["memory"] for r in per_rank]),
        kernels=kernels,
        rng_streams=streams,
        rng_scheme=rng.RNG_SCHEME,
        rng_streams_total=streams_total,
        decomposition=outcome.fingerprint,
        plan_checksum=plan_checksum,
        versions=package_versions(),
        products=product_records,
        spectra=spectra.result_record(spec, measured),
    )


def noise_stream_count(spec: CampaignSpec) -> int:
    """Number of distinct noise streams (detector x interval) a realisation draws."""
    if not spec.simulates_noise:
        return 0
    layout = chunk_layout(spec)
    noise = NoiseModel(spec, layout)
    _, last = layout.time_chunk_bounds(layout.n_time_chunks - 1)
    per_detector = (layout.n_time_chunks - 1) * noise.intervals_per_chunk + math.ceil(last / noise.samples_per_interval)
    return per_detector * layout.n_detectors


def rng_stream_records(spec: CampaignSpec, realization: int, cap: int = 64) -> tuple[list[dict], int]:
    """Keys of the run's streams (the sky first, then noise in time-major order), at most ``cap``, and the total."""
    records: list[dict] = []
    sky = sky_stream_key(spec, realization)
    if sky is not None:
        records.append({"stream": "sky", "key": list(sky)})
    total = len(records) + noise_stream_count(spec)
    if spec.simulates_noise:
        layout = chunk_layout(spec)
        noise = NoiseModel(spec, layout)
        names = [d.name for d in spec.focal_plane.detectors]
        for chunk_id in range(layout.n_chunks):
            if len(records) >= cap:
                break
            chunk = layout.chunk(chunk_id)
            for _, _, interval in noise.chunk_intervals(chunk):
                if len(records) >= cap:
                    break
                key = rng.noise_key(spec.seed, realization, chunk.detector, interval)
                records.append({"stream": "noise", "key": list(key), "detector": names[chunk.detector], "interval": interval})
    return records, total


def selection_record(selection: Selection) -> dict[str, Any]:
    """The result's ``communication.selection`` from a :class:`mapmaker.parallel.commodel.Selection`."""
    return {
        "requested": selection.requested,
        "chosen": selection.chosen,
        "reason": selection.reason,
        "machine": selection.machine,
        "iterations": selection.iterations,
        "realizations": selection.realizations,
        "modeled": selection.modeled,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"max": float(max(values)), "mean": float(sum(values) / len(values))}
