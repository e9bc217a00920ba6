"""``python -m mapmaker realize``: one realisation solved (:mod:`mapmaker.solve.realization`), then its products.

After the collective solve, root (with the cores of every rank on its node, the
others waiting idle: :mod:`mapmaker.parallel.rootwork`) computes the analysis mask, takes its mode
coupling (:func:`campaign_coupling`: read from ``--coupling`` or built), the
pseudo-spectra and the decoupled bandpowers (:mod:`mapmaker.model.spectra`),
writes the maps and spectra into a product folder that appears whole or not at
all (:mod:`mapmaker.programs.products`), gathers every rank's figures and
writes ``result.json`` (:class:`schemas.result.RealizationResult`) last.

The coupling file (``realize --coupling FILE``) is
:meth:`mapmaker.model.bandpowers.Coupling.write_npz`: the mask, its sha256, the
binning, ``purify_b`` and pspy's matrices. It depends on the pointing and the
products settings only, so every realisation of a campaign (and every campaign
with that scan and those settings) can share it: the first run that finds no
file builds the coupling and writes it atomically, the next ones read it. A
file built for another mask, binning or purification is refused
(:class:`mapmaker.model.bandpowers.CouplingMismatch`, exit ``COUPLING_REFUSED``),
never rebuilt silently: the binning and purification are checked before the
solve, the mask (known once the map is) after it. A missing file whose folder
cannot be written is refused before the solve as well
(:class:`mapmaker.programs.products.OutputUnusable`).
"""
from __future__ import annotations

import math
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from mapmaker.kernels import implementation
from mapmaker.model import rng, spectra
from mapmaker.model.bandpowers import Coupling, CouplingMismatch, build_coupling, mask_checksum
from mapmaker.model.decomposition import chunk_layout
from mapmaker.model.noise import NoiseModel
from mapmaker.model.sky import sky_stream_key
from mapmaker.model.spectra import RealizationSpectra
from mapmaker.parallel.commodel import Machine, Selection
from mapmaker.parallel.overlap import OverlapPlan
from mapmaker.parallel.rootwork import on_root_with_node_cores
from mapmaker.programs import products
from mapmaker.programs.products import OutputUnusable, ProductFolder, refuse_unwritable
from mapmaker.programs.versions import package_versions
from mapmaker.solve.realization import Progress, SolveOutcome, run_realization
from mapmaker.solve.timing import STAGES, Timers, peak_memory_mib
from schemas.files import atomic_write, sha256_file
from schemas.result import CoarseRecord, PreconditionerRecord, ProductFile, RealizationResult
from schemas.spec import CampaignSpec, scan_key, spec_hash

T = TypeVar("T")


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
    coupling_path: str | Path | None = None,
    coarse_cache: str | Path | None = None,
) -> RealizationResult | None:
    """Run one realisation and write its products atomically into ``out`` (root writes).

    Returns the validated :class:`schemas.result.RealizationResult` on root,
    None on the other ranks. ``out`` must not exist (checked by the caller
    before the run, and again at the rename). ``plan_document`` is the plan
    file's JSON header (its checksum goes into the result). ``coupling_path``
    is the coupling file to read, or to write when it does not exist (module
    doc); a mismatched one raises :class:`CouplingMismatch` on every rank.
    ``coarse_cache``: the two-level preconditioner's coarse operator file
    (:mod:`mapmaker.solve.coarsefile`; ignored with the block-diagonal one).
    """
    # Root reads an existing coupling file once, before the solve; after it only the mask is compared.
    coupling_in_file = (
        refuse_on_every_rank(comm, lambda: check_coupling_path(spec, Path(coupling_path)))
        if coupling_path is not None
        else None
    )
    timers = Timers()
    outcome = run_realization(
        spec, realization, comm, sky_root=sky_root, threads=threads, progress=progress, timers=timers, plan=plan,
        machine=machine, kernels=kernels, coarse_cache=coarse_cache,
    )
    written = refuse_on_every_rank(
        comm,
        lambda: write_products(spec, realization, out, outcome, timers, coupling_path, progress, coupling_in_file),
        threads=threads,
    )
    per_rank = gather_rank_figures(comm, outcome, timers)
    rank_hosts = comm.gather(MPI.Get_processor_name(), root=0)
    if comm.Get_rank() != 0:
        return None
    # on root: refuse_on_every_rank returns write_products' value, comm.gather the list of every rank's figures
    assert written is not None and per_rank is not None
    folder, records, measured, coupling_record = written
    result = realization_result(
        spec, realization, outcome, per_rank, ranks=comm.Get_size(), threads=threads, kernels=kernels,
        rank_hosts=rank_hosts,
        plan_checksum=None if plan_document is None else plan_document["header_sha256"],
        product_records=records, measured=measured, coupling_record=coupling_record,
    )
    try:
        products.write_result(folder, result)
        folder.commit()
    except BaseException:
        folder.discard()
        raise
    return result


REFUSALS = (CouplingMismatch, OutputUnusable)  # what root's checks raise on every rank (refuse_on_every_rank)


def refuse_on_every_rank(comm: MPI.Comm, on_root: Callable[[], T], *, threads: int = 1) -> T | None:
    """Collective: ``on_root()`` on root (its value there, None elsewhere). A refusal it raises
    (:data:`REFUSALS`) is raised on every rank, so that all of them exit with it instead of waiting for root.

    Root runs it with the cores of its node's ranks (``threads`` each) while the others wait idle
    (:func:`mapmaker.parallel.rootwork.on_root_with_node_cores`): the coupling build and the spectra
    are threaded transforms."""
    value, refusal = None, None

    def guarded() -> None:
        nonlocal value, refusal
        try:
            value = on_root()
        except REFUSALS as error:
            refusal = (next(i for i, kind in enumerate(REFUSALS) if isinstance(error, kind)), str(error))

    on_root_with_node_cores(comm, guarded, threads=threads)
    refusal = comm.bcast(refusal, root=0)
    if refusal is not None:
        kind, message = refusal
        raise REFUSALS[kind](message)
    return value


def check_coupling_path(spec: CampaignSpec, path: Path) -> Coupling | None:
    """Before the solve: the coupling in an existing file, refused when built for another binning or
    purification (:class:`CouplingMismatch`); None for a missing one, refused when it could not be
    written (:class:`OutputUnusable`)."""
    if path.exists():
        return read_coupling(path, binning=spectra.campaign_binning(spec), purify_b=spec.products.purify_b)
    refuse_unwritable(path, "--coupling")
    return None


def read_coupling(path: Path, **expected: Any) -> Coupling:
    """:meth:`Coupling.read_npz` of ``path``; a file that is not a coupling is refused like a mismatched one."""
    try:
        return Coupling.read_npz(str(path), **expected)
    except CouplingMismatch as error:
        raise CouplingMismatch(f"--coupling {str(path)!r}: {error}") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise CouplingMismatch(
            f"--coupling {str(path)!r} is not a readable coupling file ({type(error).__name__}: {error}); "
            "remove it to rebuild"
        ) from None


def campaign_coupling(
    spec: CampaignSpec,
    mask: np.ndarray,
    path: str | Path | None,
    progress: Progress | None = None,
    in_file: Coupling | None = None,
) -> tuple[Coupling, dict[str, Any]]:
    """The mode coupling of ``mask`` with the campaign's binning and ``products.purify_b``, and how it came.

    With ``path``: read it when it exists (refused with :class:`CouplingMismatch` unless it was
    built for this mask, binning and purification), else build it and write it atomically there.
    ``in_file`` is the coupling :func:`check_coupling_path` already read from ``path`` (binning and
    purification checked): only its mask is compared. Returns the coupling and
    ``{"source": "file" | "built", "build_s": seconds or None, "sha256": str or None, "bytes": int or None}``
    (the file's checksum and size, None without ``path``).
    """
    binning, purify_b = spectra.campaign_binning(spec), spec.products.purify_b
    say = progress or (lambda message: None)
    if in_file is not None:
        try:
            in_file.refuse_unless(mask_sha256=mask_checksum(mask))
        except CouplingMismatch as error:
            raise CouplingMismatch(f"--coupling {str(path)!r}: {error}") from None
        coupling = in_file
    elif path is not None and Path(path).exists():
        coupling = read_coupling(Path(path), mask_sha256=mask_checksum(mask), binning=binning, purify_b=purify_b)
    else:
        coupling = None
    if coupling is not None:
        say(f"coupling: read from {path} (mask sha256 {coupling.mask_sha256[:12]})")
        return coupling, {"source": "file", "build_s": None, **coupling_file_identity(path)}
    started = time.perf_counter()
    coupling = build_coupling(mask, binning, purify_b=purify_b, apodisation_deg=spec.products.apodization_deg)
    build_s = time.perf_counter() - started
    if path is not None:
        atomic_write(path, coupling.write_npz)
    where = f", written to {path}" if path is not None else ""
    say(f"coupling: built in {build_s:.2f} s (mask sha256 {coupling.mask_sha256[:12]}){where}")
    return coupling, {"source": "built", "build_s": build_s, **coupling_file_identity(path)}


def coupling_file_identity(path: str | Path | None) -> dict[str, Any]:
    """``{"sha256", "bytes"}`` of the coupling file at ``path`` (both None without one): what the service records."""
    if path is None:
        return {"sha256": None, "bytes": None}
    return {"sha256": sha256_file(path), "bytes": Path(path).stat().st_size}


def write_products(
    spec: CampaignSpec,
    realization: int,
    out: str | Path,
    outcome: SolveOutcome,
    timers: Timers,
    coupling_path: str | Path | None = None,
    progress: Progress | None = None,
    coupling_in_file: Coupling | None = None,
) -> tuple[ProductFolder, list[ProductFile], RealizationSpectra, dict[str, Any]]:
    """On root: the maps, the mask, the spectra and the bandpowers, written into a new product folder for ``out``.

    The coupling comes first (:func:`campaign_coupling`), so a refused one leaves no folder.
    Returns the folder (not yet committed: ``result.json`` goes in last), the files' records,
    the measured spectra and how the coupling came.
    """
    # run_realization gathers the maps on root, the rank that writes the products
    assert outcome.iqu is not None and outcome.hits is not None and outcome.rcond is not None
    with timers.stage("products"), timers("calc"):
        mask = spectra.campaign_mask(spec, outcome.iqu, outcome.hits, known=coupling_in_file)
        coupling, coupling_record = campaign_coupling(spec, mask, coupling_path, progress, coupling_in_file)
    with timers.stage("write"), timers("io"):
        folder = ProductFolder(out)
        header = [("REALIZ", realization), ("SCANKEY", scan_key(spec))]
        coord = "E" if spec.scan.kind in ("satellite", "satellite-schedule") else "C"  # ecliptic / equatorial
        records = products.write_maps(
            folder, outcome.iqu, outcome.hits, outcome.rcond, header, coord, spec.products.map_precision
        )
    with timers.stage("products"), timers("calc"):
        measured = spectra.for_campaign(spec, outcome.iqu, coupling)
    with timers.stage("write"), timers("io"):
        # The mask goes with the coupling: written by the realisation that built the site's coupling
        # file, and by realisation 0 so that every campaign's service receives it once.
        with_mask = realization == 0 or (coupling_record["source"] == "built" and coupling_path is not None)
        records += products.write_spectra(
            folder, measured, header, coord, with_mask=with_mask, coupling_sha256=coupling_record.get("sha256")
        )
    return folder, records, measured, coupling_record


def gather_rank_figures(comm: MPI.Comm, outcome: SolveOutcome, timers: Timers) -> list[dict[str, Any]] | None:
    """Collective: each rank's seconds per kind and per stage, reduction figures per iteration and peak memory, on root."""
    return comm.gather(
        {
            **timers.seconds,
            "stages": dict(timers.stages),
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
    per_rank: list[dict[str, Any]],
    *,
    ranks: int,
    threads: int,
    kernels: str,
    plan_checksum: str | None,
    product_records: list[ProductFile],
    measured: RealizationSpectra,
    coupling_record: dict[str, Any],
    rank_hosts: list[str] | None = None,
) -> RealizationResult:
    """The validated ``result.json`` of a realisation from its outcome and every rank's figures."""
    timers = outcome.timers
    streams, streams_total = rng_stream_records(spec, realization)
    return RealizationResult(
        realization=realization,
        spec_hash=spec_hash(spec),
        scan_key=scan_key(spec),
        ranks=ranks,
        rank_hosts=rank_hosts,
        threads_per_rank=threads,
        samples=outcome.samples,
        observed_pixels=outcome.observed_pixels,
        cut_pixels=outcome.cut_pixels,
        excluded_samples=outcome.excluded_samples,
        iterations=outcome.pcg.iterations,
        converged=outcome.pcg.converged,
        residual_history=outcome.pcg.residual_history,
        spectrum=outcome.pcg.spectrum(),
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
        stages=stage_spreads(per_rank),
        kernels=kernels,
        rng_streams=streams,
        rng_scheme=rng.RNG_SCHEME,
        rng_streams_total=streams_total,
        decomposition=outcome.fingerprint,
        plan_checksum=plan_checksum,
        versions=package_versions(),
        products=product_records,
        preconditioner=PreconditionerRecord(
            name=outcome.stats.preconditioner, why=outcome.stats.preconditioner_why, timed=outcome.stats.solve_timed
        ),
        coarse=coarse_record(outcome),
        spectra=spectra.result_record(
            spec,
            measured,
            coupling_source=coupling_record["source"],
            coupling_build_s=coupling_record["build_s"],
            coupling_sha256=coupling_record.get("sha256"),
            coupling_bytes=coupling_record.get("bytes"),
        ),
    )


def coarse_record(outcome: SolveOutcome) -> CoarseRecord | None:
    """The result's record of the two-level preconditioner's coarse space (None with the block-diagonal one)."""
    stats = outcome.stats
    if stats.coarse_source is None:
        return None
    return CoarseRecord(
        columns=stats.coarse_columns, source=stats.coarse_source, set_up_s=stats.coarse_setup_seconds,
        refused=stats.coarse_refused, written=stats.coarse_written, mib_rank0=stats.coarse_bytes / 2**20,
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
        names = [d.name for d in spec.focal_plane.detector_rows]
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


def stage_spreads(per_rank: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Seconds per stage over ranks (max and mean; 0 on a rank that did not run it), for the stages any rank ran."""
    return {
        stage: _spread([r["stages"].get(stage, 0.0) for r in per_rank])
        for stage in STAGES
        if any(stage in r["stages"] for r in per_rank)
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"max": float(max(values)), "mean": float(sum(values) / len(values))}
