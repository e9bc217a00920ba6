"""A campaign at a collaboration's resolution, run end to end through ``mapcampaign up`` on this machine.

    .venv/bin/python benchmarks/bench_campaign_up.py                                  # nside 1024, 4 realisations
    .venv/bin/python benchmarks/bench_campaign_up.py --nside 256 --realizations 2 --json up.json

The bundled ``satellite.toml`` at ``--nside``, its 4 detectors copied ``--detector-copies`` times (each copy
shifted by half a pixel across and a pixel along, as :mod:`benchmarks.bench_products_size` does), one day at
``--rate-hz``, ``--ranks`` ranks, ``--realizations`` realisations: a user's campaign, with everything the
service and the worker do (the overlap plan, the coupling built once, the aggregates, the uploads).

``mapcampaign up`` starts in a fresh data folder (SQLite, the local site); the campaign is submitted with
the Python client and followed until it ends (each realisation within ``--walltime-s``). Printed and written (``--json``): the
wall time from submit to done, the plan's and the coupling's build times, and per realisation its
samples, iterations, peak memory per rank, stage seconds (max over ranks) and the bytes of its products,
and from its attempt's timestamps where the rest of the campaign's time goes: ``outside_s``, from the
runner's start to the accepted result less the map-maker's own ``total_s`` (the MPI launch, the imports
before the map-maker's clock starts, the upload and the service's checks); ``idle_before_s``, from the
previous realisation's accepted result to this one's claim: negative when the worker claimed while that
result was still being uploaded and checked (it frees a slot when the runner ends: worker/agent/claims.py).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, free_port, is_healthy, mapcampaign_command, write_json
from mapcampaign.client import Client
from schemas.io import example_spec_path, load_spec
from schemas.result import Stage
from schemas.spec import CampaignSpec

STAGES = get_args(Stage)  # in the order a realisation runs them



def campaign_spec(args: argparse.Namespace) -> CampaignSpec:
    """The satellite example at ``args.nside``, with ``args.detector_copies`` copies of its detectors."""
    data = load_spec(example_spec_path("satellite")).model_dump(mode="json")
    data["name"] = f"satellite: nside {args.nside}, 1 day, {4 * args.detector_copies} detectors at {args.rate_hz:g} Hz"
    data["realizations"] = args.realizations
    data["pixelization"]["nside"] = args.nside
    data["focal_plane"]["sample_rate_hz"] = args.rate_hz
    data["resources"]["ranks"] = args.ranks
    data["resources"]["walltime_s"] = args.walltime_s
    pixel_deg = math.degrees(math.sqrt(4 * math.pi / (12 * args.nside**2)))
    data["focal_plane"]["detectors"] = [
        {**detector, "name": f"{detector['name']}c{copy}",
         "offset_x_deg": detector["offset_x_deg"] + copy * pixel_deg / 2,
         "offset_y_deg": detector["offset_y_deg"] + copy * pixel_deg}
        for copy in range(args.detector_copies) for detector in data["focal_plane"]["detectors"]
    ]  # fmt: skip
    return CampaignSpec.model_validate(data)


def start_up(data_dir: Path, port: int) -> tuple[subprocess.Popen, Path]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAPCAMPAIGN_")}
    env.update(MAPCAMPAIGN_DATA_DIR=str(data_dir), MAPCAMPAIGN_PORT=str(port), MAPCAMPAIGN_LOG_LEVEL="warning")
    log_path = data_dir / "up.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            mapcampaign_command("up", "--port", str(port)), env=env, stdout=log_file, stderr=subprocess.STDOUT,
            cwd=REPO, start_new_session=True,
        )  # fmt: skip
    return process, log_path


def stop_up(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # `up` stops the API, the worker and its MPI jobs
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def wait_healthy(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not is_healthy(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"mapcampaign up did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)


def attempt_timeline(attempts: list[Any]) -> dict[int, dict[str, float | None]]:
    """Per realisation index: ``started_to_ended_s`` of its last attempt and ``idle_before_s`` (module doc).

    ``attempts`` are ``(index, claimed_at, started_at, ended_at)`` of each realisation's last attempt.
    """
    timeline: dict[int, dict[str, float | None]] = {}
    previous_end = None
    for index, claimed, started, ended in sorted(attempts, key=lambda row: row[1]):
        timeline[index] = {
            "started_to_ended_s": (ended - started).total_seconds() if started and ended else None,
            "idle_before_s": (claimed - previous_end).total_seconds() if previous_end is not None else None,
        }
        previous_end = ended or previous_end
    return timeline


def realization_row(index: int, result: dict[str, Any], timeline: dict[str, float | None]) -> dict[str, Any]:
    stages = result.get("stages") or {}
    bandpowers = (result.get("spectra") or {}).get("bandpowers") or {}
    return {
        "realization": index,
        "samples": result["samples"],
        "observed_pixels": result["observed_pixels"],
        "iterations": result["iterations"],
        "total_s": result["timing"]["total"],
        "peak_mib_max": result["peak_memory_mb"]["max"],
        **{f"{stage}_s": stages[stage]["max"] for stage in STAGES if stage in stages},
        "coupling": bandpowers.get("coupling_source"),
        "coupling_build_s": bandpowers.get("coupling_build_s"),
        "product_mib": sum(p["size_bytes"] for p in result.get("products") or []) / 2**20,
        "outside_s": (
            timeline["started_to_ended_s"] - result["timing"]["total"]
            if timeline.get("started_to_ended_s") is not None else None
        ),
        "idle_before_s": timeline.get("idle_before_s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nside", type=int, default=1024)
    parser.add_argument("--realizations", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rate-hz", type=float, default=20.0)
    parser.add_argument("--detector-copies", type=int, default=2, help="copies of the example's 4 detectors")
    parser.add_argument("--walltime-s", type=float, default=3 * 3600.0, help="walltime of each realisation")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="keep the campaign here (default: a temporary folder)"
    )
    add_json_option(parser)
    args = parser.parse_args()

    spec = campaign_spec(args)
    with tempfile.TemporaryDirectory(prefix="bench-up-") as scratch:
        data_dir = args.data_dir or Path(scratch)
        data_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process, log_path = start_up(data_dir, port)
        try:
            wait_healthy(url, process, log_path)
            token = (data_dir / "tokens" / "local-user.token").read_text().strip()
            with Client(url, token, timeout=120.0) as client:
                submitted = time.monotonic()
                campaign = client.submit(spec)
                print(f"campaign {campaign.id}: {spec.name}, {spec.realizations} realisations", flush=True)
                detail = campaign
                try:
                    for detail in client.watch(campaign.id):  # returns once the campaign is finished or held
                        print(f"  {time.monotonic() - submitted:7.0f} s  {detail.state}  {dict(detail.progress.counts)}",
                              flush=True)  # fmt: skip
                except KeyboardInterrupt:
                    raise SystemExit(f"interrupted; campaign {campaign.id} left in {data_dir}") from None
                wall_s = time.monotonic() - submitted
                realizations = [client.realization(campaign.id, index) for index in range(spec.realizations)]
                timeline = attempt_timeline([
                    (r.index, a.claimed_at, a.started_at, a.ended_at)
                    for r in realizations if r.attempt_history for a in r.attempt_history[-1:]
                ])  # fmt: skip
                rows = [realization_row(r.index, r.result, timeline.get(r.index, {})) for r in realizations if r.result]
                plans = [
                    {"ranks": plan.ranks, "build_time_s": plan.build_time_s, "size_bytes": plan.size_bytes}
                    for plan in client.plans()
                ]
                couplings = [{"build_time_s": c.build_time_s, "size_bytes": c.size_bytes} for c in client.couplings()]
        finally:
            stop_up(process)

    figures = {
        "nside": spec.pixelization.nside,
        "realizations": spec.realizations,
        "ranks": spec.resources.ranks,
        "detectors": len(spec.focal_plane.detectors),
        "rate_hz": spec.focal_plane.sample_rate_hz,
        "state": str(detail.state),
        "succeeded": len(rows),
        "wall_s": round(wall_s, 1),
        "plans": plans,
        "couplings": couplings,
        "realizations_run": rows,
    }
    print(f"\n{figures['state']}: {len(rows)}/{spec.realizations} realisations in {wall_s:.0f} s "
          f"(nside {spec.pixelization.nside}, {spec.resources.ranks} ranks)")  # fmt: skip
    for plan in plans:
        print(f"  overlap plan: {plan['build_time_s']} s, {plan['size_bytes']} bytes")
    for coupling in couplings:
        print(f"  coupling: built in {coupling['build_time_s']} s, {coupling['size_bytes'] / 2**20:.0f} MiB")
    columns = ["realization", "samples", "iterations", "total_s", "peak_mib_max",
               *[f"{s}_s" for s in STAGES], "product_mib", "outside_s", "idle_before_s"]  # fmt: skip
    print("  " + " ".join(f"{c:>12}" for c in columns))
    for row in rows:
        print("  " + " ".join(f"{float('nan') if row.get(c) is None else row[c]:>12.4g}" for c in columns))
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
