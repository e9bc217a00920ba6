"""``mapcampaign watch``: follows a campaign through the service's events to its end; the exit status says how it ended."""

from __future__ import annotations

import json
import subprocess
import threading

import httpx

from tests.cli.conftest import drive_campaign, run_cli, stdout_json
from tests.support.live_service import mapcampaign_command
from tests.support.worker_helpers import tiny_spec, wait_for


def submit(env, tmp_path, name, **changes) -> int:
    spec_file = tmp_path / f"{name}.json"
    spec_file.write_text(json.dumps(tiny_spec(name, **changes)))
    return stdout_json(run_cli(env, "submit", "--json", str(spec_file)))[0]["campaign_id"]


class Watcher:
    """``mapcampaign watch`` in a subprocess; its stderr lines collected as they come."""

    def __init__(self, env, *args: str):
        self.process = subprocess.Popen(
            mapcampaign_command("watch", *args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, words: str, timeout: float = 60.0, *, after: int = 0) -> None:
        """Until a stderr line from number ``after`` on contains ``words``."""
        wait_for(lambda: any(words in line for line in self.lines[after:]) or self.process.poll() is not None,
                 timeout, f"the watcher to say {words!r}")
        assert any(words in line for line in self.lines[after:]), (self.process.returncode, self.lines)

    def wait_for_new_line(self, seen: int, timeout: float = 60.0) -> None:
        wait_for(lambda: len(self.lines) > seen or self.process.poll() is not None, timeout, "a new progress line")

    def finish(self, timeout: float = 120.0) -> tuple[str, str]:
        out = self.process.stdout.read()
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return out, "\n".join(self.lines)

    def paced_steps(self):
        """drive_campaign's ``after_step``: each of the campaign's steps waits until the watcher has shown it."""
        seen = [len(self.lines)]

        def after_step() -> None:
            self.wait_for_new_line(seen[0])
            seen[0] = len(self.lines)

        return after_step


def start_watch(env, campaign_id: int) -> Watcher:
    watcher = Watcher(env, "--json", str(campaign_id))
    watcher.wait_for_line("event stream")  # the stream is open: no step of the campaign can be missed
    return watcher


def test_watch_exits_0_when_every_realisation_succeeded(fresh_user, cli_service, tmp_path):
    campaign_id = submit(fresh_user, tmp_path, "all good", realizations=3)
    watcher = start_watch(fresh_user, campaign_id)
    drive_campaign(cli_service, campaign_id, name="good", after_step=watcher.paced_steps())
    out, err = watcher.finish()
    assert watcher.process.returncode == 0, err
    assert "following the service's event stream" in err
    final = json.loads(out)
    assert final["state"] == "succeeded" and final["progress"]["counts"]["succeeded"] == 3
    # Without a terminal the progress is a log on stderr: one line per change of the counts.
    assert "succeeded 3" in err and "running" in err


def test_watch_exits_1_when_a_realisation_failed(fresh_user, cli_service, tmp_path):
    campaign_id = submit(fresh_user, tmp_path, "one fails", realizations=3, max_attempts=1)
    watcher = start_watch(fresh_user, campaign_id)
    drive_campaign(cli_service, campaign_id, fail_indexes={1}, name="bad", after_step=watcher.paced_steps())
    out, err = watcher.finish()
    assert watcher.process.returncode == 1, err
    final = json.loads(out)
    assert final["state"] == "failed" and final["progress"]["counts"]["failed"] == 1


def test_watch_of_a_finished_or_cancelled_campaign_returns_at_once(fresh_user, tmp_path):
    campaign_id = submit(fresh_user, tmp_path, "cancel me", realizations=2)
    run_cli(fresh_user, "cancel", str(campaign_id))
    done = run_cli(fresh_user, "watch", str(campaign_id), timeout=60)
    assert done.returncode == 1 and "cancelled" in done.stdout
    missing = run_cli(fresh_user, "watch", "999999", timeout=60)
    assert missing.returncode == 2


def test_watch_polls_when_the_event_stream_is_unavailable(fresh_user, cli_service, tmp_path):
    """Through a proxy that refuses /events the watcher still follows the campaign by polling."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    upstream = cli_service.url

    class NoEvents(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/api/v1/events"):
                self.send_error(503, "no events here")
                return
            answer = httpx.get(upstream + self.path, headers={"Authorization": self.headers["Authorization"]})
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        def log_message(self, *args):
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), NoEvents)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        campaign_id = submit(fresh_user, tmp_path, "polled", realizations=2)
        env = {**fresh_user, "MAPCAMPAIGN_SERVER": f"http://127.0.0.1:{proxy.server_address[1]}"}
        watcher = Watcher(env, "--poll", "0.5", str(campaign_id))
        watcher.wait_for_line("event stream unavailable: polling every 0.5 s")
        drive_campaign(cli_service, campaign_id, name="polled", after_step=watcher.paced_steps())
        out, err = watcher.finish()
        assert watcher.process.returncode == 0, err
        assert "succeeded" in out and "(polling)" in err
    finally:
        proxy.shutdown()


def test_watch_says_what_a_queued_campaign_waits_for_and_asks_for_plans_only_when_due(fresh_user, cli_service, tmp_path):
    """No worker: "waiting for a worker"; a worker building the campaign's overlap plan: "overlap plan: building".
    The plan's state is read again only when the campaign's counts change or the last answer is old."""
    from mapcampaign.cli._client import ApiClient
    from mapcampaign.cli.watch import PlanWait
    from tests.support.fake_worker import FakeWorker

    # A scan of its own: no plan of an earlier test's campaign serves it.
    campaign_id = submit(fresh_user, tmp_path, "waits", realizations=2, **{"scan.duration_s": 480.0})
    with ApiClient(fresh_user["MAPCAMPAIGN_SERVER"], fresh_user["MAPCAMPAIGN_TOKEN"]) as client:
        detail = client.get(f"/campaigns/{campaign_id}")
        now = [0.0]  # the watcher's clock, in seconds, moved by the test
        waits = PlanWait(client, refresh_s=0.5, clock=lambda: now[0])
        assert waits(detail) == "waiting for a worker"
        assert waits(detail) == "waiting for a worker" and waits.asked == 1  # same counts, fresh answer: not asked
        worker = FakeWorker(cli_service.api_url, cli_service.worker_token, name="plan-builder")
        try:
            while True:  # other tests' leftovers are failed on the way, as drive_campaign does
                [task] = worker.claim(1)
                worker.start(task)
                if task["kind"] == "preprocess" and task["scan_key"] == detail["scan_key"]:
                    break
                if task["kind"] == "preprocess":
                    worker.client.post(f"/tasks/{task['task_id']}/plan-built", json={
                        "path": "/scratch/plan", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1,
                    }).raise_for_status()
                else:
                    worker.fail(task, "app_error", exit_code=1, log_tail="not this test's\n")
            assert waits(detail) == "waiting for a worker" and waits.asked == 1
            now[0] += 0.6
            assert waits(detail) == "overlap plan: building" and waits.asked == 2
            worker.client.post(f"/tasks/{task['task_id']}/plan-built", json={
                "path": "/scratch/plan", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1,
            }).raise_for_status()
        finally:
            worker.close()
    drive_campaign(cli_service, campaign_id, name="waits")
