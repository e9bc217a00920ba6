"""A test worker that drives realisations through the real worker API with made-up but plausible results.

The real worker (Parsl + mapmaker) is built elsewhere; the dashboard tests need
realisations in every state with results shaped like the mapmaker's: a timing
split, a residual history that falls geometrically, communication figures, and
a real HEALPix I/Q/U FITS map uploaded as the ``iqu`` product so quick-looks
render. Everything goes over HTTP, exactly as a worker would do it::

    worker = FakeWorker(service.api_url, service.worker_token, name="w1")
    worker.build_plan()                        # claim the preprocess task and report the plan built
    task = worker.claim_one(); worker.start(task)
    worker.succeed(task)                       # upload map_iqu.fits, then report the result
    worker.fail(task, "app_error", exit_code=1, log_tail="Traceback ...")
"""

from __future__ import annotations

import hashlib
import math
import random
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx

from schemas.api import ARTIFACT_SHA256_HEADER
from schemas.spec import CampaignSpec, scan_key, spec_hash


@lru_cache(maxsize=8)
def iqu_map_fits(nside: int = 16, seed: int = 0, patch: tuple[float, float, float] | None = None) -> bytes:
    """A small CMB-like I/Q/U map (K) as FITS bytes, written with healpy; a cap around a pole unobserved.

    ``patch=(lon, lat, radius)`` in degrees: only a disc of the sky observed, as by a ground telescope.
    """
    # Deferred: healpy and numpy take about 3 s to import on the test machine, and most tests that use
    # a FakeWorker never ask for a map.
    import healpy as hp
    import numpy as np

    ell = np.arange(3 * nside)
    cl_tt = np.zeros(ell.size)
    cl_tt[2:] = 2 * np.pi * 1e-9 / (ell[2:] * (ell[2:] + 1.0))  # flat D_ell = 1e-9 K^2, about (32 uK)^2
    cls = np.array([cl_tt, cl_tt * 0.05, cl_tt * 0.005, cl_tt * 0.1])  # TT, EE, BB, TE
    np.random.seed(seed)
    maps = hp.synfast(cls, nside, new=True)
    theta, _ = hp.pix2ang(nside, np.arange(hp.nside2npix(nside)))
    maps[:, theta < np.radians(25)] = hp.UNSEEN  # never scanned: shows as grey
    if patch is not None:
        disc = hp.query_disc(nside, hp.ang2vec(patch[0], patch[1], lonlat=True), np.radians(patch[2]))
        outside = np.ones(maps.shape[1], dtype=bool)
        outside[disc] = False
        maps[:, outside] = hp.UNSEEN
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "map_iqu.fits"
        hp.write_map(
            str(path), maps, dtype=np.float64, column_names=["I_STOKES", "Q_STOKES", "U_STOKES"], column_units="K"
        )
        return path.read_bytes()


def fabricated_result(spec: dict[str, Any], index: int, products: list[dict[str, Any]]) -> dict[str, Any]:
    """A RealizationResult (as JSON) with plausible numbers, the same for the same realisation."""
    parsed = CampaignSpec.model_validate(spec)
    rng = random.Random(index * 7919 + 17)
    iterations = rng.randint(24, 48)
    rate = 10 ** (math.log10(parsed.solver.tol) / (iterations - 2))
    residuals = [1.0]
    for _ in range(iterations):
        residuals.append(residuals[-1] * rate * rng.uniform(0.7, 1.3))
    calc = rng.uniform(18.0, 26.0) * (1.6 if index % 17 == 5 else 1.0)  # an occasional slow one
    comm = rng.uniform(2.0, 4.5)
    io_s = rng.uniform(0.4, 1.2)
    ranks = parsed.resources.ranks
    return {
        "realization": index,
        "spec_hash": spec_hash(parsed),
        "scan_key": scan_key(parsed),
        "ranks": ranks,
        "threads_per_rank": parsed.resources.threads_per_rank,
        "samples": 864_000,
        "observed_pixels": 11_800,
        "cut_pixels": 12,
        "iterations": iterations,
        "converged": True,
        "residual_history": residuals,
        "timing": {
            "calc": {"max": calc * 1.08, "mean": calc},
            "comm": {"max": comm * 1.2, "mean": comm},
            "io": {"max": io_s * 1.1, "mean": io_s},
            "total": calc * 1.08 + comm * 1.2 + io_s * 1.1 + 0.3,
        },
        "communication": {
            "strategy": "alltoallv",
            "requested": "auto",
            "bytes_per_iteration": {"max": 98_304.0, "mean": 81_920.0},
            "messages_per_iteration": {"max": float(ranks - 1), "mean": float(ranks - 1)},
            "reductions": iterations + 2,
            "bytes_counted": "payload bytes sent per rank (shared pixels x 3 x 8)",
        },
        "peak_memory_mb": {"max": 412.0, "mean": 380.0},
        "preconditioner": {"name": "block-diagonal", "why": "as the spec says", "timed": False},
        "rng_streams": [{"stream": "noise", "key": [parsed.seed, index], "detector": "A0", "interval": 0}],
        "rng_scheme": "philox(seed, realization, detector, interval)",
        "versions": {"mapmaker": "0.1.0", "numpy": "2.x"},
        "products": products,
    }


class FakeWorker:
    def __init__(self, api_url: str, token: str, *, name: str = "test-worker", site: str = "local", host: str = ""):
        self.client = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        answer = self.client.post(
            "/workers", json={"name": name, "site": site, "host": host or f"{name}.cluster.example", "capacity": 8}
        )
        answer.raise_for_status()
        self.id = answer.json()["id"]
        self.host = host or f"{name}.cluster.example"

    def close(self) -> None:
        self.client.close()

    def claim(self, max_tasks: int = 1) -> list[dict[str, Any]]:
        answer = self.client.post(f"/workers/{self.id}/claim", json={"max_tasks": max_tasks})
        answer.raise_for_status()
        return answer.json()["tasks"]

    def claim_one(self) -> dict[str, Any]:
        tasks = self.claim(1)
        assert len(tasks) == 1, f"expected one task, got {tasks}"
        return tasks[0]

    def build_plan(self, build_time_s: float = 42.5) -> dict[str, Any]:
        task = self.claim_one()
        assert task["kind"] == "preprocess", task
        self.client.post(f"/tasks/{task['task_id']}/started", json={"host": self.host}).raise_for_status()
        self.client.post(
            f"/tasks/{task['task_id']}/plan-built",
            json={
                "path": f"/scratch/plans/{task['scan_key'][:12]}-{task['ranks']}.h5",
                "checksum": "sha256:" + hashlib.sha256(task["scan_key"].encode()).hexdigest(),
                "size_bytes": 3_276_800,
                "build_time_s": build_time_s,
            },
        ).raise_for_status()
        return task

    def start(self, task: dict[str, Any], job_id: str | None = None) -> None:
        self.client.post(
            f"/tasks/{task['task_id']}/started", json={"host": self.host, "scheduler_job_id": job_id}
        ).raise_for_status()

    def succeed(
        self,
        task: dict[str, Any],
        *,
        with_map: bool = True,
        nside: int = 16,
        patch: tuple[float, float, float] | None = None,
    ) -> None:
        products = []
        if with_map:
            payload = iqu_map_fits(nside=nside, seed=task["realization"] % 4, patch=patch)
            digest = hashlib.sha256(payload).hexdigest()
            self.client.put(
                f"/tasks/{task['task_id']}/artifacts/map_iqu.fits",
                content=payload,
                headers={ARTIFACT_SHA256_HEADER: digest, "Content-Type": "application/octet-stream"},
            ).raise_for_status()
            products.append({"name": "iqu", "path": "map_iqu.fits", "sha256": digest, "size_bytes": len(payload)})
        result = fabricated_result(task["spec"], task["realization"], products)
        self.client.post(f"/tasks/{task['task_id']}/succeeded", json={"result": result}).raise_for_status()

    def fail(
        self,
        task: dict[str, Any],
        failure_class: str = "app_error",
        *,
        exit_code: int | None = 1,
        log_tail: str = "",
        message: str | None = None,
    ) -> str:
        answer = self.client.post(
            f"/tasks/{task['task_id']}/failed",
            json={"failure_class": failure_class, "exit_code": exit_code, "log_tail": log_tail, "message": message},
        )
        answer.raise_for_status()
        return answer.json()["state"]

    def heartbeat(self, running: list[str]) -> dict[str, Any]:
        answer = self.client.post(f"/workers/{self.id}/heartbeat", json={"running": running})
        answer.raise_for_status()
        return answer.json()
