"""A site's measured communication figures: what ``python -m mapmaker calibrate --out FILE`` writes.

``realize --calibration FILE`` and ``model --calibration FILE`` read it. Each
operation is fitted to the alpha-beta form the reduction model uses for it
(``formula``): alpha in seconds per message, beta in seconds per byte.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

CALIBRATION_VERSION = 1


class CalibrationModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OperationFit(CalibrationModel):
    alpha_s: float = Field(ge=0, description="Latency per message (s)")
    beta_s_per_byte: float = Field(ge=0, description="Inverse bandwidth (s per byte)")
    formula: str = Field(description="The alpha-beta expression fitted, in the form the model uses it")
    r2: float | None = Field(None, description="Coefficient of determination of the least-squares fit")
    points: list[list[float]] = Field(
        default_factory=list, description="[bytes per rank, best seconds per call] measured"
    )


class SiteCalibration(CalibrationModel):
    calibration_version: int = CALIBRATION_VERSION
    site: str = Field("local", description="Name of the site the figures belong to")
    created: str
    host: str
    ranks: int = Field(ge=2, description="Ranks the collectives were measured on")
    mpi: str = Field(description="MPI library version string")
    load_average: list[float] = Field(default_factory=list, description="1, 5, 15-minute load at the start")
    p2p: OperationFit = Field(description="Ping-pong between ranks 0 and 1: alpha + n beta")
    allreduce: OperationFit
    alltoallv: OperationFit
    allgather: OperationFit
    sift_s_per_id: float = Field(gt=0, description="Seconds per received pixel id in the preprocessing sift")
    neighbor: OperationFit | None = Field(
        None, description="Neighbor_alltoallv on the complete graph; absent: the model uses the Alltoallv's fit"
    )
    pairwise: OperationFit | None = Field(
        None, description="XOR-ordered pairwise Sendrecv exchange; absent: the model uses the point-to-point fit"
    )
