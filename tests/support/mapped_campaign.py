"""Real map-maker outputs for service tests, delivered through the worker API as a test worker would.

``map_realizations`` runs the map-maker's realisations for real under
``mpiexec -n 2`` (what ``python -m mapmaker realize`` runs, all of them in one
process start) on a tiny noise-only spec (nside 16, white noise); ``deliver``
uploads a realisation's product files (``PUT /tasks/{id}/artifacts/{name}``
with their sha256) and reports its ``result.json`` (``POST
/tasks/{id}/succeeded``). Works with the in-process ``TestClient``
(``prefix="/api/v1"``) and with an ``httpx.Client`` on a live
service (``prefix=""``).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schemas.api import ARTIFACT_SHA256_HEADER
from schemas.io import load_spec

REPO = Path(__file__).resolve().parents[2]
RUN_REALIZATIONS = REPO / "tests" / "mpi" / "drivers" / "run_realizations.py"

SPEC = """
name = "products service test"
kind = "noise-only"
realizations = 6
seed = 5

[scan]
kind = "satellite"
duration_s = 3600.0
chunk_s = 900.0
spin_period_s = 60.0
spin_angle_deg = 50.0
precession_period_s = 600.0
precession_angle_deg = 45.0
drift_deg_per_day = 1440.0

[focal_plane]
sample_rate_hz = 4.0
detectors = [
  { name = "D0", offset_x_deg = 0.5, pol_angle_deg = 0.0 },
  { name = "D45", offset_x_deg = 0.5, pol_angle_deg = 45.0 },
  { name = "D90", offset_x_deg = 0.5, pol_angle_deg = 90.0 },
  { name = "D135", offset_x_deg = 0.5, pol_angle_deg = 135.0 },
]

[pixelization]
nside = 16

[sky]
kind = "none"

[noise]
net_k_sqrt_s = 100e-6

[products]
ell_bin_width = 8
apodization_deg = 6.0

[resources]
ranks = 2
walltime_s = 600.0
"""


def write_spec(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.toml"
    path.write_text(SPEC)
    return path


def spec_json(path: Path) -> dict[str, Any]:
    return load_spec(path).model_dump(mode="json")


def map_realizations(spec_path: Path, out: Path, indexes: list[int]) -> dict[int, Path]:
    """Map realisations ``indexes`` (consecutive) under ``mpiexec -n 2``; return the product folders by index.

    One process start maps them all (tests/mpi/drivers/run_realizations.py: ``realize_to_folder`` per
    realisation, what ``python -m mapmaker realize`` runs): the start-up of the interpreter, its libraries
    and MPI costs more than these tiny solves.
    """
    first, last = indexes[0], indexes[-1] + 1
    if list(indexes) != list(range(first, last)):
        raise ValueError(f"realisations {indexes} are not consecutive")
    mpiexec = Path(sys.executable).with_name("mpiexec")
    command = [
        str(mpiexec), "-n", "2", sys.executable, "-m", "mpi4py", str(RUN_REALIZATIONS),
        str(spec_path), str(out), str(first), str(last),
    ]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300 * len(indexes), cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"mapmaker realize {first}..{last - 1} failed:\n{done.stderr[-3000:]}")
    return {index: out / f"r{index:04d}" for index in indexes}


def read_result(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "result.json").read_text())


def deliver(client: Any, task: dict[str, Any], folder: Path, *, prefix: str = "", headers: dict | None = None):
    """Upload the products of ``folder`` for ``task`` (not those kept at the site) and report it succeeded;
    return the report's answer."""
    headers = headers or {}
    result = read_result(folder)
    assert result["realization"] == task["realization"], (result["realization"], task["realization"])
    for product in result["products"]:
        if product.get("kept"):
            continue
        payload = (folder / product["path"]).read_bytes()
        answer = client.put(
            f"{prefix}/tasks/{task['task_id']}/artifacts/{product['path']}",
            content=payload,
            headers={
                **headers,
                ARTIFACT_SHA256_HEADER: hashlib.sha256(payload).hexdigest(),
                "Content-Type": "application/octet-stream",
            },
        )
        assert answer.status_code == 201, answer.text
    return client.post(f"{prefix}/tasks/{task['task_id']}/succeeded", json={"result": result}, headers=headers)


def deliver_all(worker: Any, worker_id: int, folders: Sequence[Path] | dict[int, Path]) -> None:
    """Claim as ``worker_id`` until every realisation of ``folders`` (its product folder by index) is delivered;
    a preprocess task on the way is reported built (no plan file is needed to deliver made products)."""
    delivered = 0
    while delivered < len(folders):
        tasks = worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 8}).json()["tasks"]
        assert tasks, "nothing to claim"
        for task in tasks:
            if task["kind"] == "preprocess":
                built = {"path": "/p.h5", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1}
                worker.post(f"/tasks/{task['task_id']}/plan-built", json=built).raise_for_status()
                continue
            answer = deliver(worker, task, folders[task["realization"]])
            assert answer.status_code == 200, answer.text
            delivered += 1
