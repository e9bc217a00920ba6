"""Bad input against the live service on PostgreSQL: a property-based run of the OpenAPI schema, then
hand-made hostile requests. Every answer is a clear 4xx (never a 5xx), and a refused request stores nothing.

Issue 10, part 3. ``MAPCAMPAIGN_FUZZ_EXAMPLES`` (default 10) sets the examples per operation and
generation mode of the schemathesis run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.reliability.conftest import row_counts
from tests.support.databases import empty_pg_tables
from tests.support.fake_worker import FakeWorker
from tests.support.figures import record
from tests.support.live_service import LiveService, start_live_service
from tests.support.service_helpers import spec_data

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]

FUZZ_EXAMPLES = int(os.environ.get("MAPCAMPAIGN_FUZZ_EXAMPLES", "10"))

# The spectrum endpoint takes a raw FITS map (application/fits), which schemathesis cannot make from a
# schema: give it arbitrary bytes and truncated FITS headers, each of which must be a 4xx.
_FITS_CARD = b"SIMPLE  =                    T" + b" " * 50
schemathesis.openapi.media_type(
    "application/fits",
    st.one_of(st.binary(max_size=4096), st.binary(max_size=2000).map(lambda tail: _FITS_CARD + tail)),
)
# The instrument-file upload takes raw HDF5 (application/x-hdf5) or ECSV text: arbitrary bytes, and bytes after an
# HDF5 signature, each of which must be a 4xx (the service has an instrument_root, so they are read and refused).
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
schemathesis.openapi.media_type(
    "application/x-hdf5",
    st.one_of(st.binary(max_size=4096), st.binary(max_size=2000).map(lambda tail: _HDF5_SIGNATURE + tail)),
)
STATUS_SEEN: dict[int, int] = {}


@pytest.fixture(scope="module")
def fuzzed_service(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """One live service for the whole schema run, with a campaign, a worker and a stored product to aim at."""
    empty_pg_tables(pg_url)
    instruments = tmp_path_factory.mktemp("fuzzed-instruments")
    service = start_live_service(tmp_path_factory.mktemp("fuzzed"), pg_url, env={"MAPCAMPAIGN_INSTRUMENT_ROOT": str(instruments)})
    with service.client(service.user_token) as user:
        user.post("/campaigns", json=spec_data(name="target", realizations=3)).raise_for_status()
    worker = FakeWorker(service.api_url, service.worker_token, name="w-fuzz")
    worker.build_plan()
    task = worker.claim_one()
    worker.start(task)
    worker.succeed(task)
    worker.close()
    try:
        yield service
    finally:
        service.stop()
        record(
            "bad input",
            f"schemathesis (positive + negative, {FUZZ_EXAMPLES} examples per operation and mode): "
            f"{sum(STATUS_SEEN.values())} requests, answers {dict(sorted(STATUS_SEEN.items()))}",
        )
        empty_pg_tables(pg_url)


def token_for(service: LiveService, method: str, path: str) -> str:
    worker_side = method != "GET" and path.startswith(("/api/v1/workers", "/api/v1/tasks"))
    return service.worker_token if worker_side else service.user_token


def test_no_request_from_the_schema_gets_a_server_error(fuzzed_service):
    # Hypothesis strategies straight from schemathesis: its pytest plugin does not run under pytest 9.
    schema = schemathesis.openapi.from_url(fuzzed_service.api_url + "/openapi.json")
    failures: list[str] = []
    operations = 0
    for loaded in schema.get_all_operations():
        operation = loaded.ok()
        if operation.path.endswith("/events"):
            continue  # the event stream never ends by design; the dashboard tests read it
        operations += 1
        token = token_for(fuzzed_service, operation.method.upper(), operation.path)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                database=None,
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case) -> None:
                response = case.call(  # called within this iteration, so `token` is this operation's
                    base_url=fuzzed_service.url, headers={"Authorization": f"Bearer {token}"}, timeout=30  # noqa: B023
                )
                STATUS_SEEN[response.status_code] = STATUS_SEEN.get(response.status_code, 0) + 1
                if response.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.formatted_path} query={case.query} body={str(case.body)[:300]}: "
                        f"{response.status_code} {response.text[:300]}"
                    )

            try:
                call()
            except Unsatisfiable:
                pass  # no invalid input exists for this operation (e.g. no parameters to break)
    record("bad input", f"schemathesis covered {operations} operations of the OpenAPI schema")
    assert not failures, "\n".join(failures[:20])
    assert fuzzed_service.process.poll() is None  # and the service is still up


# --------------------------------------------------------------------------- hand-made hostile requests

TRAVERSALS = ["../../etc/passwd.fits", "/etc/passwd.fits", "~root/sky.fits", "skies/../../x.fits", "a\\..\\b.fits", "sky\x00.fits"]
LONG = "x" * 200_000


def hostile_specs() -> list[tuple[str, object]]:
    """(label, JSON body) pairs that must each be refused with a 4xx."""
    cases: list[tuple[str, object]] = [
        ("realizations 0", spec_data(realizations=0)),
        ("realizations -1", spec_data(realizations=-1)),
        ("realizations 10**12", spec_data(realizations=10**12)),
        ("nside not a power of two", spec_data(**{"pixelization.nside": 12})),
        ("nside 2**40", spec_data(**{"pixelization.nside": 2**40})),
        ("ranks 0", spec_data(**{"resources.ranks": 0})),
        ("negative walltime", spec_data(**{"resources.walltime_s": -1.0})),
        ("unknown field", {**spec_data(), "shell": "rm -rf /"}),
        ("wrong type", spec_data(realizations="four")),
        ("spec is a list", [spec_data()]),
        ("spec is null", None),
        ("very long name", spec_data(name=LONG)),
        ("NUL in name", spec_data(name="bad\x00name")),
        ("RTL override in name", spec_data(name="invoice\u202egnp.exe")),
        ("bidi isolate in name", spec_data(name="a\u2066b\u2069")),
        ("NUL in detector name", spec_data(**{"focal_plane.detectors": [{"name": "A\x00", "offset_x_deg": 0.0}]})),
    ]
    cases += [(f"sky path {path!r}", spec_data(sky={"kind": "map", "path": path})) for path in TRAVERSALS]
    return cases


def test_hostile_specs_are_refused_and_store_nothing(pg_service, pg_url):
    before = row_counts(pg_url)
    codes = {}
    with pg_service.client(pg_service.user_token) as user:
        for label, body in hostile_specs():
            answer = user.post("/campaigns", json=body)
            codes[label] = answer.status_code
            assert 400 <= answer.status_code < 500, (label, answer.status_code, answer.text[:300])
            assert answer.json()["code"] in ("invalid_request", "invalid", "too_large"), (label, answer.text[:300])
        raw = {
            "malformed JSON": b'{"name": "x", ',
            "lone surrogate": b'{"name": "\\ud800 bad", "realizations": 1}',
            "NaN": b'{"name": "nan", "realizations": NaN}',
            "Infinity in an unbounded field": json.dumps(spec_data(**{"noise.interval_s": float("inf")})).encode(),
            "not UTF-8": b'{"name": "\xff\xfe"}',
        }
        for label, content in raw.items():
            answer = user.post("/campaigns", content=content, headers={"Content-Type": "application/json"})
            codes[label] = answer.status_code
            assert 400 <= answer.status_code < 500, (label, answer.status_code, answer.text[:300])
        # Over the 1 MiB JSON limit: declared, and streamed without a Content-Length.
        oversized = user.post("/campaigns", json=spec_data(description="y" * (2 << 20)))
        assert oversized.status_code == 413, oversized.text[:200]

        def chunks():
            yield b'{"name": "'
            for _ in range(40):
                yield b"z" * 65_536
            yield b'"}'

        streamed = user.post("/campaigns", content=chunks(), headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413, streamed.text[:200]
        codes["oversized (declared, streamed)"] = (oversized.status_code, streamed.status_code)
    assert row_counts(pg_url) == before
    assert pg_service.process.poll() is None
    record("bad input", f"{len(codes)} hostile campaign bodies refused with a 4xx, nothing stored: {codes}")


def test_path_traversal_in_product_fields_is_refused(pg_service, pg_url, tmp_path):
    user_api = pg_service.client(pg_service.user_token)
    campaign = user_api.post("/campaigns", json=spec_data(realizations=2)).json()
    worker = FakeWorker(pg_service.api_url, pg_service.worker_token, name="w-traversal")
    worker.build_plan()
    task = worker.claim_one()
    worker.start(task)
    secret = pg_service.data_dir / "secret.fits"
    secret.write_bytes(b"not yours")
    before = row_counts(pg_url)
    refused = 0
    try:
        # Uploads: the name is one path segment; encoded slashes and dots must not climb out. The body and
        # its checksum are right (a control upload of the same body under a plain name is stored), so a
        # refusal that reaches the endpoint is the name's: 404 (no route) or the artifact-name rule.
        payload = b"payload"
        upload_headers = {"X-Content-SHA256": hashlib.sha256(payload).hexdigest(), "Content-Type": "application/octet-stream"}
        control = worker.client.put(f"/tasks/{task['task_id']}/artifacts/iqu.fits", content=payload, headers=upload_headers)
        assert control.status_code == 201, control.text[:200]
        for name in ["..%2F..%2F..%2Fescape.fits", "%2e%2e", ".hidden.fits", "a%00b.fits", "x" * 300 + ".fits"]:
            answer = worker.client.put(f"/tasks/{task['task_id']}/artifacts/{name}", content=payload, headers=upload_headers)
            assert answer.status_code == 404 or (
                answer.status_code == 422 and "artifact name" in answer.text
            ), (name, answer.status_code, answer.text[:200])
            refused += 1
        assert not list(pg_service.data_dir.rglob("escape.fits"))
        # A result naming files outside the staging folder, with the checksum and size of the uploaded file.
        from tests.support.fake_worker import fabricated_result

        for path in ["../../../secret.fits", "/etc/passwd", "..", "sub/../../x.fits", "../iqu.fits"]:
            product = {"name": "iqu", "path": path, "sha256": hashlib.sha256(payload).hexdigest(), "size_bytes": len(payload)}
            result = fabricated_result(task["spec"], task["realization"], [product])
            answer = worker.client.post(f"/tasks/{task['task_id']}/succeeded", json={"result": result})
            assert 400 <= answer.status_code < 500 and "not a valid artifact name" in answer.text, (
                path, answer.status_code, answer.text[:200]
            )
            refused += 1
        # Downloads: the API's format parameter and the dashboard's product name.
        for fmt in ["../../secret", "fits/../../x"]:
            answer = user_api.get(f"/campaigns/{campaign['id']}/products/mean-map", params={"format": fmt})
            assert answer.status_code == 422, answer.text[:200]
            refused += 1
        with httpx.Client(base_url=pg_service.url, headers={"Origin": pg_service.url}) as browser:
            browser.post("/login", data={"token": pg_service.user_token})
            for name in ["..%2F..%2F..%2F..%2Fsecret.fits", "..%2F..%2F..%2Ftokens", "%2e%2e%2f%2e%2e%2fsecret.fits"]:
                answer = browser.get(f"/campaigns/{campaign['id']}/realizations/{task['realization']}/products/{name}")
                assert answer.status_code == 404 and b"not yours" not in answer.content, name
                refused += 1
        assert row_counts(pg_url) == before
        realization = user_api.get(f"/campaigns/{campaign['id']}/realizations/{task['realization']}").json()
        assert realization["state"] == "running" and realization["result"] is None
    finally:
        worker.close()
        user_api.close()
    record("bad input", f"path traversal: {refused} attempts (uploads, result products, downloads) refused with a 4xx")
