"""The admission middleware: never more admitted requests than permits; a request that waits too long gets 503."""

from __future__ import annotations

import anyio
import httpx
import pytest

from service.admission import AdmissionMiddleware, counted


class Probe:
    """An ASGI app that counts the requests inside it at once and can hold them until released."""

    def __init__(self) -> None:
        self.inside = 0
        self.most_inside = 0
        self.release = anyio.Event()

    async def __call__(self, scope, receive, send) -> None:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            if scope["path"] != "/healthz":
                await self.release.wait()
        finally:
            self.inside -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.anyio
async def test_no_more_requests_inside_than_permits():
    probe = Probe()
    app = AdmissionMiddleware(probe, permits=3, timeout_s=60)
    statuses: list[int] = []

    async with client(app) as http, anyio.create_task_group() as group:

        async def get() -> None:
            statuses.append((await http.get("/api/v1/campaigns/1")).status_code)

        for _ in range(20):
            group.start_soon(get)
        with anyio.fail_after(30):
            while probe.inside < 3:
                await anyio.sleep(0.01)
        await anyio.sleep(0.1)  # give the other 17 every chance to get in, wrongly
        assert probe.inside == 3
        probe.release.set()
    assert probe.most_inside == 3
    assert statuses == [200] * 20


@pytest.mark.anyio
async def test_a_request_waiting_past_the_timeout_is_answered_busy_and_uncounted_paths_pass():
    probe = Probe()
    app = AdmissionMiddleware(probe, permits=1, timeout_s=0.2)
    async with client(app) as http, anyio.create_task_group() as group:
        first: list[httpx.Response] = []

        async def hold() -> None:
            first.append(await http.get("/api/v1/campaigns"))

        group.start_soon(hold)
        with anyio.fail_after(30):
            while probe.inside < 1:
                await anyio.sleep(0.01)
        refused = await http.get("/api/v1/campaigns/2")
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["code"] == "busy"
        assert (await http.get("/healthz")).status_code == 200  # not counted: passes the full house
        probe.release.set()
    assert first[0].status_code == 200


def test_event_streams_and_static_files_take_no_permit():
    assert not counted("/api/v1/events")
    assert not counted("/ui/events")
    assert not counted("/static/app.js")
    assert not counted("/api/v1/tasks/7f3a/artifacts/map.fits", "PUT")  # streamed for minutes, no session held
    assert not counted("/api/v1/instrument-files", "POST")  # streamed; token and media type checked first
    assert not counted("/api/v1/spectrum", "POST")  # streamed; its work has a per-user limit
    assert counted("/api/v1/instrument-files", "GET")  # the list: an ordinary read
    assert counted("/api/v1/tasks/7f3a/succeeded")
    assert counted("/api/v1/campaigns")
    assert counted("/ui/campaigns/3")


class Echo:
    """An ASGI app that answers with the request body it reads, counting the requests inside it."""

    def __init__(self) -> None:
        self.inside = 0

    async def __call__(self, scope, receive, send) -> None:
        self.inside += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.inside -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.anyio
async def test_a_slow_body_is_read_before_its_request_waits_for_a_permit_and_ends_with_408():
    from service.config import Settings
    from service.limits import BodyLimitMiddleware

    echo = Echo()
    settings = Settings(body_timeout_s=0.5, max_json_body_bytes=1_024)
    app = BodyLimitMiddleware(AdmissionMiddleware(echo, permits=1, timeout_s=0.2), settings)
    never = anyio.Event()  # the slow clients' rest of the body
    answers: list[list[dict]] = []

    async def slow_request() -> None:
        sent: list[dict] = []
        answers.append(sent)
        first = True

        async def receive() -> dict:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": b'{"na', "more_body": True}
            await never.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/api/v1/campaigns", "headers": [(b"content-length", b"100")]}
        await app(scope, receive, send)

    with anyio.fail_after(30):
        async with client(app) as http, anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(slow_request)
            # The one permit is free for a request whose body is complete (and the body reaches the app whole).
            answer = await http.post("/api/v1/campaigns", content=b'{"name": "quick"}')
            assert answer.status_code == 200 and answer.content == b'{"name": "quick"}'
            assert echo.inside == 0
            oversized = await http.post("/api/v1/campaigns", content=b"x" * 2_048)
            assert oversized.status_code == 413 and oversized.headers["connection"] == "close"
    statuses = [next(m["status"] for m in sent if m["type"] == "http.response.start") for sent in answers]
    assert statuses == [408] * 8
    assert all((b"connection", b"close") in sent[0]["headers"] for sent in answers)
