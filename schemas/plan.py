"""What ``python -m mapmaker preprocess --report FILE`` writes: the overlap plan as built.

The worker reads it to report the plan to the service (``path``,
``checksum``, ``size_bytes``, ``build_time_s`` are the fields of
:class:`schemas.api.PlanBuilt`). Times are seconds, sizes bytes.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PLAN_REPORT_VERSION = 1


class PlanModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RankSpread(PlanModel):
    """A per-rank quantity over the ranks."""

    min: float
    mean: float
    max: float


class PlanPhases(PlanModel):
    """Seconds of each phase of the build, the slowest rank's (the paper's Figure 3 split)."""

    pointing: float = Field(description="Pointing of the rank's chunks and its sorted unique pixels")
    allgather: float = Field(description="Buffered Allgather(v) of the pixel ids, range by range")
    sift: float = Field(description="Membership of every received id in the rank's pixels; multiplicities, masks")
    index: float = Field(description="Index set-up: shared lists grouped by rank")
    write: float = Field(description="Writing the plan file (MPI-IO) and renaming it into place")


class OverlapStatistics(PlanModel):
    """The overlap structure of the decomposition (the paper's o_ij, n_i, n_lmax)."""

    ranks: int
    observed_pixels: int = Field(description="Pixels observed by at least one rank")
    total_local_pixels: int = Field(description="n_all = sum over ranks of n_i")
    local_pixels: RankSpread = Field(description="n_i: pixels each rank observes")
    shared_pixels: RankSpread = Field(description="sum over j != i of o_ij: values a rank sends per Alltoallv")
    shared_fraction: RankSpread = Field(description="sum_j o_ij / n_i (0 for ranks without pixels)")
    neighbours: RankSpread = Field(description="Ranks a rank shares at least one pixel with")
    butterfly_working_set: RankSpread = Field(description="Pixels a rank holds at some butterfly step")
    multiplicity_histogram: list[list[int]] = Field(
        description="[m, pixels observed by exactly m ranks] for every m >= 1 with pixels"
    )


class PlanReport(PlanModel):
    report_version: int = PLAN_REPORT_VERSION
    path: str = Field(description="Absolute path of the plan file")
    checksum: str = Field(description="sha256 (hex) of the whole plan file")
    size_bytes: int
    build_time_s: float = Field(description="Wall time of the build, start of pointing to the file in place")
    header_checksum: str = Field(
        description="sha256 of the plan's header, which covers every section's sha256; realize records it as plan_checksum"
    )
    format_version: int = Field(description="Plan file format version")
    scan_key: str
    ranks: int
    decomposition: str = Field(description="Fingerprint of which chunks each rank owns")
    npix: int
    buffer_pixels: int = Field(description="Pixels per range of the buffered allgather")
    phases: PlanPhases
    overlap: OverlapStatistics
