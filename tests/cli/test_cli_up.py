"""``mapcampaign up`` and ``mapcampaign demo``: the embedded default started, used and stopped as a whole."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import httpx
import pytest

from tests.cli.conftest import processes_using, run_cli, stdout_json
from tests.support.live_service import free_port, is_healthy, mapcampaign_command, service_env
from tests.support.worker_helpers import long_spec, tiny_spec

pytestmark = pytest.mark.integration


def wait_until(condition, timeout: float, what: str, process: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"mapcampaign exited ({process.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def assert_no_processes_left(data_dir, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := processes_using(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "processes left behind:\n" + "\n".join(left)


def test_up_serves_runs_a_realisation_and_stops_everything_on_sigterm(tmp_path):
    data_dir = tmp_path / "data"
    env = service_env(data_dir, free_port(), None, None)
    up = subprocess.Popen(
        mapcampaign_command("up"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{env['MAPCAMPAIGN_PORT']}"

        wait_until(lambda: is_healthy(url), 120, "the API", up)
        token_file = data_dir / "tokens" / "local-user.token"
        wait_until(token_file.exists, 30, "the local user token", up)
        # Later commands need neither --server nor --token: same data folder and port as `up`.
        spec_file = tmp_path / "long.json"
        # Long enough (tol never reached) to be running when `up` is stopped.
        spec = long_spec("long", realizations=1)
        spec["solver"] = {"tol": 1e-30, "max_iter": 10000}
        spec_file.write_text(json.dumps(spec))
        campaign_id = stdout_json(run_cli(env, "submit", "--json", str(spec_file)))[0]["campaign_id"]
        # Not even the port: a running `up` notes its address in the data folder.
        without_port = {k: v for k, v in env.items() if k not in ("MAPCAMPAIGN_PORT", "MAPCAMPAIGN_HOST")}
        assert [c["id"] for c in stdout_json(run_cli(without_port, "list", "--json"))] == [campaign_id]
        # A new dashboard link from the running `up`, found the same way, with nothing restarted.
        link = run_cli(without_port, "login").stdout.strip()
        assert link.startswith(f"{url}/login/link?secret=mcl_") and up.poll() is None

        def running():
            status = stdout_json(run_cli(env, "status", "--json", str(campaign_id)))
            return status["progress"]["counts"]["running"] == 1

        wait_until(running, 240, "a running realisation", up)
        wait_until(lambda: any("mapmaker" in line for line in processes_using(data_dir)), 60, "the MPI ranks", up)
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=180)
        assert up.returncode == 0, output
        assert "stopped" in output
        assert f"dashboard  {url}/login/link?secret=mcl_" in output  # the one-time login link
        assert_no_processes_left(data_dir)
        assert not (data_dir / "up" / "server.json").exists()
    finally:
        if up.poll() is None:
            up.kill()


def test_stopping_up_with_an_event_stream_open_leaves_no_traceback_in_serve_log(tmp_path):
    """A dashboard tab or a `watch` keeps an event stream open; stopping `up` (or the end of `demo`) made
    uvicorn cancel it after its grace period and log a CancelledError traceback. The stream now ends when
    the server is told to stop."""
    data_dir = tmp_path / "data"
    env = service_env(data_dir, free_port(), None, None)
    up = subprocess.Popen(
        mapcampaign_command("up"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    ended: list[str] = []
    try:
        url = f"http://127.0.0.1:{env['MAPCAMPAIGN_PORT']}"
        wait_until(lambda: is_healthy(url), 120, "the API", up)
        token_file = data_dir / "tokens" / "local-user.token"
        wait_until(token_file.exists, 30, "the local user token", up)
        token = token_file.read_text().strip()
        opened = threading.Event()

        def follow() -> None:
            try:
                with httpx.stream(
                    "GET", f"{url}/api/v1/events", headers={"Authorization": f"Bearer {token}"}, timeout=120
                ) as stream:
                    for line in stream.iter_lines():
                        opened.set()
                ended.append("closed by the server")
            except httpx.HTTPError as error:
                ended.append(f"{type(error).__name__}: {error}")

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert opened.wait(60), "the event stream did not open"
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=180)
        assert up.returncode == 0, output
        reader.join(60)
        assert ended == ["closed by the server"]
        log = (data_dir / "logs" / "serve.log").read_text()
        assert "MapCampaign API on" in log  # the log of this server, read after its stop
        assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
        assert_no_processes_left(data_dir)
    finally:
        if up.poll() is None:
            up.kill()


def test_a_killed_up_takes_its_api_and_worker_with_it(tmp_path):
    data_dir = tmp_path / "data"
    env = service_env(data_dir, free_port(), None, None)
    up = subprocess.Popen(
        mapcampaign_command("up"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{env['MAPCAMPAIGN_PORT']}"

        def api_and_worker_up():
            return is_healthy(url) and any("mapcampaign.cli worker" in line for line in processes_using(data_dir))

        wait_until(api_and_worker_up, 120, "the API and the worker", up)
        assert len(processes_using(data_dir)) >= 2, processes_using(data_dir)
        up.kill()  # SIGKILL: `up` cannot stop anything itself
        up.wait(timeout=30)
        assert_no_processes_left(data_dir, timeout=90)
    finally:
        if up.poll() is None:
            up.kill()


def test_up_refuses_a_taken_port(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = service_env(tmp_path / "data", taken.getsockname()[1], None, None)
        done = run_cli(env, "up", timeout=60)
    assert done.returncode == 2 and "is taken" in done.stderr and "--port" in done.stderr


def test_demo_runs_a_tiny_campaign_end_to_end(tmp_path):
    data_dir = tmp_path / "data"
    env = service_env(data_dir, free_port(), None, None)
    spec_file = tmp_path / "tiny.json"
    spec_file.write_text(json.dumps(tiny_spec("tiny demo", realizations=2, **{"resources.ranks": 1})))
    done = run_cli(env, "demo", "--spec", str(spec_file), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "campaign 1 succeeded: 2 of 2 realisations succeeded" in done.stdout
    assert f"{data_dir}/campaigns/1/realizations/<n>/map_iqu.fits (2 found)" in done.stdout
    products = data_dir / "demo" / "campaign-1-products"
    assert {p.name for p in products.iterdir()} >= {"mean_map.fits", "variance_map.fits", "mask.fits", "spectra.fits"}
    assert "dashboard: http://127.0.0.1:" in done.stdout
    assert "Traceback" not in (data_dir / "logs" / "serve.log").read_text()
    assert_no_processes_left(data_dir)
    # The demo left its token where later commands look (the service is stopped: they say so).
    later = run_cli(env, "list")
    assert later.returncode == 1 and "cannot reach the service" in later.stderr


def test_demo_refuses_an_invalid_spec_before_starting_anything(tmp_path):
    spec_file = tmp_path / "bad.toml"
    spec_file.write_text('name = "bad"\n[focal_plane]\ndetectors = []\n')
    env = service_env(tmp_path / "data", free_port(), None, None)
    done = run_cli(env, "demo", "--spec", str(spec_file), timeout=60)
    assert done.returncode == 2 and "bad.toml: focal_plane.detectors:" in done.stderr
    assert not (tmp_path / "data" / "logs").exists()


def test_a_second_up_on_the_same_data_folder_exits_2_naming_the_first(tmp_path):
    """The first `up` holds the data folder's lock: a second one on another port exits 2 naming the first's pid
    and address, and leaves its address record alone, so `list` still finds the first."""
    data_dir = tmp_path / "data"
    env = service_env(data_dir, free_port(), None, None)
    first = subprocess.Popen(
        mapcampaign_command("up"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{env['MAPCAMPAIGN_PORT']}"
        wait_until(lambda: is_healthy(url), 120, "the API", first)
        record = data_dir / "up" / "server.json"
        wait_until(record.exists, 60, "up's address record", first)
        second_port = free_port()
        second = run_cli({**env, "MAPCAMPAIGN_PORT": str(second_port)}, "up", timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and url in second.stderr, second.stderr
        assert str(data_dir) in second.stderr
        assert not is_healthy(f"http://127.0.0.1:{second_port}")
        assert json.loads(record.read_text())["url"] == url  # the first's record is kept
        without_port = {k: v for k, v in env.items() if k not in ("MAPCAMPAIGN_PORT", "MAPCAMPAIGN_HOST")}
        assert run_cli(without_port, "list", "--json").returncode == 0
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=180)
        assert first.returncode == 0, output
        assert_no_processes_left(data_dir)
    finally:
        if first.poll() is None:
            first.kill()
