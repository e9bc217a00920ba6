"""``python -m mapmaker preprocess``: build the overlap plan of a spec for the communicator's rank count.

Steps (collective; every rank):

1. the decomposition of the spec into ``comm.size`` ranks and each rank's
   sorted unique pixels, from its own chunks' pointing -- the same code as
   ``realize`` (:func:`mapmaker.solve.local_data.build_local_data`);
2. the plan: buffered Allgatherv of pixel ids, sift, index set-up
   (:func:`mapmaker.parallel.overlap.build_overlap_plan`);
3. the plan file, written with MPI-IO into a temporary sibling and renamed
   into place (:func:`mapmaker.parallel.planfile.write_plan`);
4. on rank 0: the sha256 of the file and the report
   (:class:`schemas.plan.PlanReport`), written atomically when asked for.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mapmaker.model.decomposition import chunk_layout, decompose, decomposition_fingerprint
from mapmaker.model.noise import NoiseModel
from mapmaker.parallel.overlap import OverlapPlan, build_overlap_plan, butterfly_schedule, multiplicity_histogram_pairs
from mapmaker.parallel.planfile import PLAN_FORMAT_VERSION, PlanIdentity, write_plan
from mapmaker.programs.versions import mapcampaign_version
from mapmaker.solve.local_data import build_local_data
from schemas.files import atomic_write_json, sha256_file
from schemas.plan import OverlapStatistics, PlanPhases, PlanReport, RankSpread
from schemas.spec import CampaignSpec, scan_key

Progress = Callable[[str], None]


def plan_identity(spec: CampaignSpec, ranks: int) -> PlanIdentity:
    """What a plan for ``spec`` on ``ranks`` ranks must record."""
    return PlanIdentity(
        scan_key=scan_key(spec),
        ranks=ranks,
        decomposition=decomposition_fingerprint(decompose(chunk_layout(spec), ranks)),
    )


def rank_local_pixels(spec: CampaignSpec, comm) -> np.ndarray:
    """This rank's sorted unique observed pixels [n_local] int64, exactly as ``realize`` computes them."""
    layout = chunk_layout(spec)
    decomposition = decompose(layout, comm.Get_size())
    local = build_local_data(spec, layout, decomposition.chunks_of(comm.Get_rank()), NoiseModel(spec, layout))
    return local.local_pixels


def overlap_statistics(comm, plan: OverlapPlan) -> OverlapStatistics:
    """Collective: the overlap figures of the whole decomposition (every rank gets them)."""
    schedule = butterfly_schedule(plan)
    working = len(schedule.fold_local) if schedule.is_extra else schedule.n_work
    row = np.array([plan.n_local, plan.n_shared, len(plan.neighbours), working], dtype=np.float64)
    rows = np.empty((comm.Get_size(), len(row)))
    comm.Allgather(row, rows)
    fraction = np.divide(rows[:, 1], rows[:, 0], out=np.zeros(len(rows)), where=rows[:, 0] > 0)

    def spread(values: np.ndarray) -> RankSpread:
        return RankSpread(min=float(values.min()), mean=float(values.mean()), max=float(values.max()))

    histogram = plan.histogram
    if histogram is None:
        raise TypeError("overlap_statistics needs a plan built in this run: a loaded plan has no histogram")
    return OverlapStatistics(
        ranks=comm.Get_size(),
        observed_pixels=int(histogram[1:].sum()),
        total_local_pixels=int(rows[:, 0].sum()),
        local_pixels=spread(rows[:, 0]),
        shared_pixels=spread(rows[:, 1]),
        shared_fraction=spread(fraction),
        neighbours=spread(rows[:, 2]),
        butterfly_working_set=spread(rows[:, 3]),
        multiplicity_histogram=multiplicity_histogram_pairs(histogram),
    )


def run_preprocess(
    spec: CampaignSpec,
    out: str | Path,
    comm,
    *,
    report_path: str | Path | None = None,
    buffer_pixels: int | None = None,
    progress: Progress | None = None,
) -> PlanReport | None:
    """Build and write the plan of ``spec`` for ``comm``'s rank count; the report on rank 0, None elsewhere."""
    rank, size = comm.Get_rank(), comm.Get_size()
    say = progress if (progress is not None and rank == 0) else (lambda message: None)
    comm.Barrier()
    started = time.perf_counter()
    out = Path(out).absolute()
    buffer_pixels = int(buffer_pixels or spec.solver.allreduce_buffer_pixels)
    npix = spec.pixelization.npix
    identity = plan_identity(spec, size)

    # 1. this rank's pixels.
    tick = time.perf_counter()
    local_pixels = rank_local_pixels(spec, comm)
    pointing_s = time.perf_counter() - tick
    say(f"pointing: {spec.total_samples} samples on {size} ranks ({len(local_pixels)} pixels on rank 0)")

    # 2. the plan.
    plan = build_overlap_plan(comm, local_pixels, npix, buffer_pixels)
    statistics = overlap_statistics(comm, plan)
    say(
        f"overlap: {statistics.observed_pixels} pixels observed, n_all {statistics.total_local_pixels}, "
        f"shared per rank up to {statistics.shared_pixels.max:.0f} with up to {statistics.neighbours.max:.0f} ranks"
    )

    # 3. the file.
    tick = time.perf_counter()
    extra = {
        "npix": npix,
        "nside": spec.pixelization.nside,
        "buffer_pixels": buffer_pixels,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "observed_pixels": statistics.observed_pixels,
        "total_local_pixels": statistics.total_local_pixels,
        "mapmaker": mapcampaign_version(),
    }
    document = write_plan(comm, out, plan, identity, extra)
    write_s = time.perf_counter() - tick
    phases = np.array([pointing_s, plan.timings["allgather"], plan.timings["sift"], plan.timings["index"], write_s])
    comm.Allreduce(MPI.IN_PLACE, phases, op=MPI.MAX)
    comm.Barrier()
    build_time = time.perf_counter() - started

    # 4. checksum and report, on rank 0; its outcome is broadcast, so that a failure there (the report
    # cannot be written, say) ends every rank alike instead of leaving rank 0 alone in a collective.
    problem: OSError | None = None
    report = None
    if rank == 0:
        try:
            report = PlanReport(
                path=str(out),
                checksum=sha256_file(out),
                size_bytes=out.stat().st_size,
                build_time_s=build_time,
                header_checksum=document["header_sha256"],
                format_version=PLAN_FORMAT_VERSION,
                scan_key=identity.scan_key,
                ranks=size,
                decomposition=identity.decomposition,
                npix=npix,
                buffer_pixels=buffer_pixels,
                phases=PlanPhases(
                    pointing=phases[0], allgather=phases[1], sift=phases[2], index=phases[3], write=phases[4]
                ),
                overlap=statistics,
            )
            if report_path is not None:
                atomic_write_json(report_path, json.loads(report.model_dump_json()), indent=2)
        except OSError as error:
            problem = error
    problem = comm.bcast(problem, root=0)
    if problem is not None:
        raise problem
    if rank != 0:
        return None
    assert report is not None  # rank 0 built it, or raised the broadcast problem above
    say(f"plan: {out} ({report.size_bytes} bytes, sha256 {report.checksum[:16]}...) in {build_time:.2f} s")
    return report
