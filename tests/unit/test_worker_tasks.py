"""One task from its work folder to its report, with a recording client in place of the service."""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from schemas.files import sha256_file
from schemas.programs import CANCEL_FILE, RUNNER_FILE, STATUS_FILE, CancelReason, MapmakerExit
from schemas.spec import CampaignSpec
from tests.support.service_helpers import result_for
from tests.support.task_run import RecordingClient, finish_with, make_run, runner_started, runner_status
from worker.client import ServiceError
from worker.outcome import Outcome
from worker.runner import read_cancel, write_cancel
from worker.stages import run as run_stage
from worker.tasks import TaskRun


def write_products(run: TaskRun, *, corrupt: bool = False) -> None:
    out = run.placement.out
    out.mkdir(parents=True)
    products = []
    for name in ("map_iqu.fits", "hits.fits"):
        payload = name.encode() * 10
        (out / name).write_bytes(payload)
        digest = hashlib.sha256(payload).hexdigest()
        products.append({"name": name.split(".")[0], "path": name, "sha256": digest, "size_bytes": len(payload)})
    if corrupt:
        (out / "hits.fits").write_bytes(b"x" * products[1]["size_bytes"])
    result = result_for(run.task.spec.model_dump(mode="json"), 0, products)
    (out / "result.json").write_text(json.dumps(result))


def test_prepare_makes_a_fresh_work_folder_and_clears_a_stale_product_folder(tmp_path):
    run = make_run(tmp_path, RecordingClient())
    out, workdir = run.placement.out, run.placement.workdir
    out.mkdir(parents=True)
    (out / "result.json").write_text("{}")  # left by an earlier incarnation of this attempt
    workdir.mkdir(parents=True)
    (workdir / "status.json").write_text("{}")
    run.prepare()
    assert not out.exists() and out.parent.is_dir()
    assert sorted(p.name for p in workdir.iterdir()) == ["liveness", "spec.json"]
    assert CampaignSpec.model_validate_json((workdir / "spec.json").read_text()) == run.task.spec
    command = run.prepared.command
    assert "--plan" in command and str(run.task.plan.path) in command and "--threads 1" in command
    assert "--marker local:w:run:realize-5 --walltime-s 300" in command
    assert run.prepared.resource_specification == {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2}
    assert (run.prepared.stdout, run.prepared.stderr) == (workdir / "stdout.txt", workdir / "stderr.txt")


def test_every_realisation_of_a_scan_pattern_names_the_same_coupling_file(tmp_path):
    """The site's coupling file is keyed by what the mask and binning depend on: campaigns of one scan and
    products settings share it (whatever their kind, noise or seed); other products settings do not."""
    from schemas.spec import coupling_key

    run = make_run(tmp_path, RecordingClient())
    run.prepare()
    coupling_file = run.placement.coupling_file
    assert coupling_file is not None and coupling_file.parent.is_dir()
    assert f"--coupling {coupling_file}" in run.prepared.command
    spec = run.task.spec
    same = spec.model_copy(update={"seed": spec.seed + 1, "kind": "noise-only", "realizations": 7})
    assert coupling_key(same) == coupling_key(spec)
    for products in ({"ell_bin_width": spec.products.ell_bin_width + 1}, {"purify_b": not spec.products.purify_b}):
        other = spec.model_copy(update={"products": spec.products.model_copy(update=products)})
        assert coupling_key(other) != coupling_key(spec), products
    cut = spec.model_copy(update={"solver": spec.solver.model_copy(update={"rcond_min": 0.2})})
    more = spec.model_copy(update={"resources": spec.resources.model_copy(update={"ranks": spec.resources.ranks + 1})})
    assert coupling_key(cut) != coupling_key(spec) and coupling_key(more) != coupling_key(spec)


def test_prechecks(tmp_path):
    too_wide = make_run(tmp_path / "a", RecordingClient(), **{"resources.ranks": 4, "resources.ranks_per_node": 2})
    verdict = too_wide.precheck()
    assert verdict.outcome is Outcome.LAUNCH_ERROR and "needs 2 nodes" in verdict.message
    no_plan = make_run(tmp_path / "b", RecordingClient(), plan_exists=False)
    assert no_plan.precheck().outcome is Outcome.PLAN_REFUSED
    assert make_run(tmp_path / "c", RecordingClient()).precheck() is None


def test_success_uploads_every_product_then_reports_and_tidies(tmp_path):
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    old = run.placement.out.with_name("attempt-1")
    old.mkdir()
    partial = run.placement.out.with_name(".attempt-1.partial-abc")
    partial.mkdir()
    write_products(run)
    timeline = finish_with(run, "exited", 0)
    assert client.calls == [
        ("started", "realize-5", "node7"),
        ("upload", "realize-5", "map_iqu.fits"),
        ("upload", "realize-5", "hits.fits"),
        ("succeeded", "realize-5", 0),
    ]
    assert timeline["outcome"] == "succeeded" and timeline["launched_at"] == 1.0 and timeline["exited_at"] == 2.0
    assert not old.exists() and not partial.exists() and run.placement.out.is_dir()  # earlier attempts' folders go
    assert not run.placement.workdir.exists()  # the work folder of a succeeded task goes


def test_a_success_the_service_never_heard_of_keeps_its_files(tmp_path):
    """Found by review: when the succeeded report could not be delivered the work folder was removed anyway.
    The service will retry the realisation (lease expiry), but nothing finished is thrown away here."""
    client = RecordingClient(unreachable={"succeeded"})
    run = make_run(tmp_path, client)
    run.prepare()
    old = run.placement.out.with_name("attempt-1")
    old.mkdir()
    write_products(run)
    timeline = finish_with(run, "exited", 0)
    assert [call[0] for call in client.calls] == ["started", "upload", "upload", "succeeded"]
    assert timeline["outcome"] == "succeeded" and "did not answer" in timeline["unreported"]
    assert run.placement.workdir.is_dir() and run.placement.out.is_dir() and old.is_dir()  # all kept
    assert json.loads((run.placement.workdir / "timeline.json").read_text())["unreported"]


def test_a_product_that_does_not_match_result_json_is_an_app_error(tmp_path):
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    write_products(run, corrupt=True)
    finish_with(run, "exited", 0)
    [failed] = [call for call in client.calls if call[0] == "failed"]
    assert failed[2:4] == ("app_error", 0) and "does not match" in failed[4]
    assert not any(call[0] in ("upload", "succeeded") for call in client.calls)
    assert run.placement.workdir.is_dir()  # kept for a look


class UploadRefusingClient(RecordingClient):
    def __init__(self, error: ServiceError):
        super().__init__()
        self.error = error

    def upload(self, task_id, name, path, sha256):
        self._call("upload", task_id, name)
        raise self.error


@pytest.mark.parametrize(
    ("error", "reported_failure"),
    [
        (ServiceError("507: no space left on device", status=507, code="insufficient_storage"), True),
        (ServiceError("the service did not answer: connection refused"), False),
        (ServiceError("503: the service is busy", status=503), False),
    ],
)
def test_a_refused_upload_is_an_app_error_but_an_unreachable_service_is_no_verdict(tmp_path, error, reported_failure):
    """The service saying it cannot store a product fails the attempt; a service out of reach reports nothing
    (the lease runs out and the task is retried as lost), since the product may well be stored later."""
    client = UploadRefusingClient(error)
    run = make_run(tmp_path, client)
    run.prepare()
    write_products(run)
    finish_with(run, "exited", 0)
    failed = [call for call in client.calls if call[0] == "failed"]
    assert not any(call[0] == "succeeded" for call in client.calls)
    if reported_failure:
        assert [call[2] for call in failed] == ["app_error"] and "did not store product" in failed[0][4]
    else:
        assert failed == []


def test_refused_plan_is_invalidated_before_the_failure_report(tmp_path):
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    finish_with(run, "exited", 3, stderr="mapmaker realize: plan refused: section 2 checksum mismatch\n")
    assert [call[0] for call in client.calls] == ["started", "plan_invalid", "failed"]
    assert client.calls[1] == ("plan_invalid", 3, "realize-5", "sha:plan")
    assert client.calls[2][2:4] == ("app_error", 3) and "section 2 checksum mismatch" in client.calls[2][5]


def test_a_two_level_realisation_names_the_sites_coarse_file_keyed_by_pointing_and_noise(tmp_path):
    """The coarse operator's file is named only for the two-level preconditioner; realisations and campaigns of
    one scan, noise model, rank count and coarse settings share it (whatever their seed or sky); another noise
    model, coarse nside, cut or rank count names another file."""
    from schemas.spec import coarse_key

    plain = make_run(tmp_path / "plain", RecordingClient(), solver={"preconditioner": "block-diagonal"})
    plain.prepare()
    assert plain.placement.coarse_file is None and "--coarse-cache" not in plain.prepared.command
    run = make_run(tmp_path / "two", RecordingClient(), solver={"preconditioner": "two-level"})
    run.prepare()
    coarse_file = run.placement.coarse_file
    assert coarse_file is not None and coarse_file.parent.is_dir()
    assert coarse_file == run.context.layout.coarse_file(coarse_key(run.task.spec))
    assert f"--coarse-cache {coarse_file}" in run.prepared.command
    spec = run.task.spec
    same = spec.model_copy(update={"seed": spec.seed + 1, "realizations": 9, "sky": spec.sky.model_copy(update={"seed": 5}),
                                   "solver": spec.solver.model_copy(update={"tol": 1e-9})})
    assert coarse_key(same) == coarse_key(spec)
    others = [
        spec.model_copy(update={"noise": spec.noise.model_copy(update={"f_knee_hz": 0.3})}),
        spec.model_copy(update={"solver": spec.solver.model_copy(update={"coarse_nside": 2})}),
        spec.model_copy(update={"solver": spec.solver.model_copy(update={"rcond_min": 0.2})}),
        spec.model_copy(update={"resources": spec.resources.model_copy(update={"ranks": spec.resources.ranks + 1})}),
        spec.model_copy(update={"kind": "signal-only"}),
    ]
    assert len({coarse_key(other) for other in others} | {coarse_key(spec)}) == len(others) + 1


def test_refused_coupling_file_is_removed_and_the_plan_left_alone(tmp_path):
    """A stale coupling file (exit 4) is not a refused overlap plan: the plan stays ready, the file goes, and the
    failure is the site's (``site_error``, requeued without using an attempt), so the next attempt rebuilds it."""
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    coupling_file = run.placement.coupling_file
    coupling_file.write_bytes(b"a coupling for another mask")
    refusal = f"mapmaker realize: --coupling {str(coupling_file)!r}: built for the mask with sha256 abc\n"
    finish_with(run, "exited", MapmakerExit.COUPLING_REFUSED, stderr=refusal)
    assert [call[0] for call in client.calls] == ["started", "failed"]  # no plan_invalid
    assert client.calls[1][2:4] == ("site_error", 4) and "built for the mask with sha256 abc" in client.calls[1][5]
    assert not coupling_file.exists()
    assert run.placement.plan_file.read_bytes() == b"plan"


def test_walltime_failure_reports_class_exit_code_and_log_tail(tmp_path):
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    partial = run.placement.out.with_name(f".{run.placement.out.name}.partial-xyz")
    partial.mkdir()
    stderr = "".join(f"iteration {i}\n" for i in range(150)) + "worker.runner: walltime: ending every process\n"
    finish_with(run, "walltime", -15, stderr=stderr)
    [failed] = [call for call in client.calls if call[0] == "failed"]
    assert failed[2:4] == ("walltime", -15)
    assert len(failed[5].splitlines()) == 100 and failed[5].endswith("ending every process")
    assert not partial.exists()  # every process of the attempt is gone: its temporary folder is garbage


@pytest.mark.parametrize(
    "reason, reported",
    [(CancelReason.CANCELLED, "cancelled"), (CancelReason.DRAIN, "drained"), (CancelReason.LOST, None)],
)
def test_stopped_tasks(tmp_path, reason, reported):
    client = RecordingClient(gone={"failed"})
    run = make_run(tmp_path, client)
    run.prepare()
    run.request_stop(reason)
    assert (run.placement.workdir / "cancel").read_text().strip() == reason.value
    finish_with(run, "cancelled", -15, cancel_reason=reason.value)
    failed = [call for call in client.calls if call[0] == "failed"]
    assert [call[2] for call in failed] == ([reported] if reported else [])  # a 409 answer is fine


def test_a_stop_asked_after_the_task_ended_does_not_change_how_it_ended(tmp_path):
    """Found by review: the drain deadline asked runs already being reported to stop, and a task the
    block lost (no status) was then reported as an uncharged ``drained``."""
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    run.finishing = concurrent.futures.Future()  # handed to the report threads
    run.request_stop(CancelReason.DRAIN)
    run.request_stop(CancelReason.CANCELLED)
    assert run.stop_reason is None and not (run.placement.workdir / "cancel").exists()
    run.request_stop(CancelReason.LOST)  # the service gave it away: still no report
    assert run.stop_reason is CancelReason.LOST


def test_an_unreadable_cancel_file_is_not_a_cancel(tmp_path):
    """Found by review: any read error of the cancel file (ESTALE on NFS) made the runner kill a healthy task."""
    assert read_cancel(tmp_path) is None
    (tmp_path / CANCEL_FILE).mkdir()  # reading it fails with IsADirectoryError, an OSError
    assert read_cancel(tmp_path) is None
    (tmp_path / CANCEL_FILE).rmdir()
    write_cancel(tmp_path, CancelReason.DRAIN)
    assert read_cancel(tmp_path) is CancelReason.DRAIN
    (tmp_path / CANCEL_FILE).write_text("stop it\n")  # an unknown reason is still a cancel
    assert read_cancel(tmp_path) is CancelReason.CANCELLED


def test_a_cancel_never_brings_back_a_removed_work_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_cancel(tmp_path / "gone", CancelReason.LOST)
    assert not (tmp_path / "gone").exists()


def test_a_status_that_shows_late_on_a_shared_file_system_is_waited_for(tmp_path, monkeypatch):
    """Found by review: the Parsl app had returned but status.json was not yet visible (NFS attribute
    cache), and a task that exited 0 was classified launch_error ("no status")."""
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    run.future = concurrent.futures.Future()
    run.future.set_result(0)  # the app returned normally
    status = runner_status("exited", 0)
    looks = []

    def status_shows_while_waiting(seconds):  # the worker's pause between looks: the file appears meanwhile
        looks.append(seconds)
        (run.placement.workdir / STATUS_FILE).write_text(status.model_dump_json())

    monkeypatch.setattr(run_stage.time, "sleep", status_shows_while_waiting)
    ended = run.conclude()
    assert looks == [run_stage.STATUS_LOOK_S]
    assert ended.status == status and ended.verdict.outcome is Outcome.SUCCEEDED


@pytest.mark.parametrize(
    ("status_text", "message"),
    [
        ('{"ending": "exploded", "exit_code": 0}', "unknown ending 'exploded' in status.json"),
        ("{not json", "status.json is damaged"),
        ('{"ending": "exited", "exit_code": 0}', "status.json is damaged: host: Field required"),
    ],
)
def test_a_status_that_does_not_read_is_a_launch_error_that_says_so(tmp_path, status_text, message):
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    (run.placement.workdir / STATUS_FILE).write_text(status_text)
    assert run.ended()
    run.finish()
    [failed] = [call for call in client.calls if call[0] == "failed"]
    assert failed[2] == "launch_error" and message in failed[4]


class SuccessRefusingClient(RecordingClient):
    """Answers the success report with ``error`` (every other call as RecordingClient)."""

    def __init__(self, error: ServiceError, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def succeeded(self, task_id, result):
        super().succeeded(task_id, result)
        raise self.error


@pytest.mark.parametrize(
    ("error", "reported_failure"),
    [
        (ServiceError("HTTP 422: the result does not match the task", status=422, code="result_mismatch"), True),
        (ServiceError("HTTP 413: request body too large", status=413, code="too_large"), True),
        (ServiceError("the service did not answer (ConnectError)"), False),
    ],
)
def test_a_refused_success_report_is_reported_as_a_failure_with_the_reason(tmp_path, error, reported_failure):
    """Found by review: a 4xx refusal of ``succeeded`` was only logged; the lease then expired and the
    attempt was charged lost_worker, every time, with the cause in the worker's log alone."""
    client = SuccessRefusingClient(error)
    run = make_run(tmp_path, client)
    run.prepare()
    write_products(run)
    timeline = finish_with(run, "exited", 0)
    failed = [call for call in client.calls if call[0] == "failed"]
    if reported_failure:
        assert [call[2] for call in failed] == ["app_error"] and "refused the result" in failed[0][4]
        assert str(error.status) in failed[0][4]
        assert "unreported" not in timeline
    else:
        assert failed == [] and "did not answer" in timeline["unreported"]


def test_a_start_report_that_cannot_be_sent_does_not_stop_the_final_report(tmp_path):
    """Found by review: any error but 409 on the late ``started`` report skipped the outcome's report."""
    client = RecordingClient(unreachable={"started"})
    run = make_run(tmp_path, client)
    run.prepare()
    run.request_stop(CancelReason.DRAIN)
    timeline = finish_with(run, "cancelled", -15, cancel_reason=CancelReason.DRAIN.value)
    assert [call[0] for call in client.calls] == ["started", "failed"]
    assert client.calls[1][2] == "drained"
    assert "unreported" not in timeline


def test_a_plan_that_cannot_be_read_here_is_refused_not_a_crash(tmp_path, monkeypatch):
    """Found by review: ``is_file()`` re-raises EACCES (a plan under a folder this worker may not enter;
    the tests run as root, whom permissions do not stop, hence the patch), which escaped the launch
    and stopped the whole worker."""
    run = make_run(tmp_path, RecordingClient())
    real_is_file = Path.is_file

    def forbidden(path):
        if path == run.placement.plan_file:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_is_file(path)

    monkeypatch.setattr(Path, "is_file", forbidden)
    verdict = run.precheck()
    assert verdict.outcome is Outcome.PLAN_REFUSED
    assert "cannot be read at this site" in verdict.message and "Permission denied" in verdict.message


def test_a_liveness_touch_that_fails_is_tried_again(tmp_path, monkeypatch):
    """Found by review: one EIO from utime ended the liveness thread for good."""
    run = make_run(tmp_path, RecordingClient())
    run.prepare()
    real_utime = os.utime
    failures = [OSError(errno.EIO, "Input/output error")]

    def flaky_utime(path, *args, **kwargs):
        if failures:
            raise failures.pop()
        return real_utime(path, *args, **kwargs)

    monkeypatch.setattr(os, "utime", flaky_utime)
    liveness = run.placement.workdir / "liveness"
    real_utime(liveness, (0, 0))
    run.touch()  # fails, is noted
    assert run.folder.touch_failed and liveness.stat().st_mtime == 0
    run.touch()
    assert not run.folder.touch_failed and liveness.stat().st_mtime > 0


def test_a_task_parsl_lost_while_its_runner_lives_is_told_to_end(tmp_path):
    """Found by review: a task whose Parsl manager was lost (its runner still up: runner.json, no
    status.json) was reported lost_worker and dropped, and the runner ran on until its liveness file
    went stale (120 s) while the service ran the realisation again elsewhere."""

    class ManagerLost(Exception):
        pass

    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    (run.placement.workdir / RUNNER_FILE).write_text(runner_started().model_dump_json())
    run.future = concurrent.futures.Future()
    run.future.set_exception(ManagerLost("the manager of block 0 was lost"))
    run.finish()
    [failed] = [call for call in client.calls if call[0] == "failed"]
    assert failed[2] == "lost_worker"
    assert (run.placement.workdir / "cancel").read_text().strip() == CancelReason.LOST.value


class ContendedLock:
    """A lock that tells when a second thread has to wait for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.contended = threading.Event()

    def __enter__(self):
        if not self.lock.acquire(blocking=False):
            self.contended.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc_info):
        self.lock.release()


def test_a_stop_asked_while_the_work_folder_is_removed_does_not_leave_it_behind(tmp_path, monkeypatch):
    """Found by CI: a heartbeat that reached the service just after it accepted a success answered
    "lost", the loop wrote a cancel file into the work folder while a report thread was removing it,
    and the folder stayed (``rmtree`` ignores the non-empty ``rmdir``)."""
    client = RecordingClient()
    run = make_run(tmp_path, client)
    run.prepare()
    write_products(run)
    run.folder.lock = lock = ContendedLock()
    stoppers = []

    def rmtree_interrupted_by_a_stop(path, ignore_errors=False):
        for entry in path.iterdir():  # rmtree's first half: the files go
            entry.unlink()
        stopper = threading.Thread(target=run.request_stop, args=(CancelReason.LOST,))
        stoppers.append(stopper)
        stopper.start()  # the loop thread asks for the stop now...
        assert lock.contended.wait(30), "the stop did not wait for the removal"  # ...and has to wait
        try:
            os.rmdir(path)  # rmtree's last step, which fails on a file written meanwhile
        except OSError:
            if not ignore_errors:
                raise

    monkeypatch.setattr(shutil, "rmtree", rmtree_interrupted_by_a_stop)
    timeline = finish_with(run, "exited", 0)
    [stopper] = stoppers
    stopper.join(30)
    assert not stopper.is_alive()
    assert timeline["outcome"] == "succeeded" and ("succeeded", "realize-5", 0) in client.calls
    assert not run.placement.workdir.exists()
    run.request_stop(CancelReason.LOST)  # asked again after the removal: nothing is written
    assert not run.placement.workdir.exists()


class SumsRecordingClient(RecordingClient):
    def put_map_sums(self, worker_id, campaign_id, path):
        from campaignlib import sitesums
        from schemas.api import SiteSumsReceipt

        version = sitesums.read(path).version
        self._call("put_map_sums", worker_id, campaign_id, version)
        return SiteSumsReceipt(campaign_id=campaign_id, site="local", version=version, pixels=1)


def test_a_keeping_site_keeps_the_maps_uploads_the_rest_and_adds_the_accepted_map_to_its_sums(tmp_path):
    import dataclasses

    import healpy as hp
    import numpy as np

    from campaignlib import sitesums
    from worker.keep import SiteStore

    client = SumsRecordingClient()
    run = make_run(tmp_path, client)
    store = SiteStore(tmp_path / "store", "local", interval_s=60.0)
    store.worker_id = 9
    run.context = dataclasses.replace(run.context, site_store=store)
    run.prepare()
    out = run.placement.out
    out.mkdir(parents=True)
    iqu = np.full((3, 12 * 4**2), hp.UNSEEN)
    iqu[:, 10:50] = 1e-6
    hp.write_map(str(out / "map_iqu.fits"), iqu, dtype=np.float64)
    (out / "spectra.npz").write_bytes(b"spectra")
    products = [
        {"name": role, "path": name, "sha256": sha256_file(out / name), "size_bytes": (out / name).stat().st_size}
        for role, name in (("iqu", "map_iqu.fits"), ("spectra", "spectra.npz"))
    ]
    (out / "result.json").write_text(json.dumps(result_for(run.task.spec.model_dump(mode="json"), 0, products)))
    finish_with(run, "exited", 0)
    assert client.calls == [
        ("started", "realize-5", "node7"),
        ("upload", "realize-5", "spectra.npz"),  # the map stays at the site
        ("succeeded", "realize-5", 0),
        ("put_map_sums", 9, 1, 1),  # the first send of the campaign's sums goes at once
    ]
    kept = store.campaign_dir(1) / "0" / "map_iqu.fits"
    assert sha256_file(kept) == products[0]["sha256"]
    sums = sitesums.read(store.campaign_dir(1) / "sums.npz")
    assert sums.ledger == [[0, 1]] and sums.pixels.tolist() == list(range(10, 50))
