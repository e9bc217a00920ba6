"""Hostile request bodies against the live service (``mapcampaign serve``), on SQLite and PostgreSQL.

Slow bodies (declared, then sent a few bytes at a time or not at all), oversized bodies (declared, or streamed
without a length), wrong media types and no token with a large body: each answered with its status (408, 413,
415, 401), nothing stored (no file under the instrument root, no row), and a bound on what the server spent
(its resident memory, the bytes it let a client send). A slow body holds no admission permit: with the
admission timeout at 1 s and two permits, a status read and a worker's claim answer 200 while sixteen slow
bodies are pending. No test sleeps: each waits for an answer with a deadline.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.figures import record
from tests.support.live_service import LiveService
from tests.support.service_helpers import spec_data

pytestmark = [pytest.mark.timeout(300)]

MIB = 1 << 20
BODY_TIMEOUT_S = 15  # long beside the reads that must pass meanwhile; waited for only by the 408 checks
MAX_UPLOAD_BYTES = 4 * MIB
MAX_SPECTRUM_BYTES = 8 * MIB


@dataclass
class Target:
    service: LiveService
    instruments: Path

    @property
    def port(self) -> int:
        return int(self.service.url.rsplit(":", 1)[1])

    def uploads_kept(self) -> list[str]:
        folder = self.instruments / "uploads"
        return sorted(path.name for path in folder.iterdir()) if folder.exists() else []

    def upload_records(self) -> list[dict]:
        with self.service.client(self.service.user_token) as client:
            answer = client.get("/instrument-files")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def memory_bytes(self) -> int:
        """Resident memory of the server process and its children (the spectrum program, if any)."""
        process = psutil.Process(self.service.process.pid)
        return sum(each.memory_info().rss for each in (process, *process.children(recursive=True)))


@pytest.fixture
def target(make_live_service, tmp_path: Path) -> Target:
    instruments = tmp_path / "instruments"
    instruments.mkdir()
    service = make_live_service(
        env={
            "MAPCAMPAIGN_INSTRUMENT_ROOT": str(instruments),
            "MAPCAMPAIGN_ADMISSION_TIMEOUT_S": "1",
            "MAPCAMPAIGN_MAX_CONCURRENT_REQUESTS": "2",
            "MAPCAMPAIGN_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
            "MAPCAMPAIGN_UPLOAD_IDLE_TIMEOUT_S": str(BODY_TIMEOUT_S),
            "MAPCAMPAIGN_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
            "MAPCAMPAIGN_MAX_SPECTRUM_BYTES": str(MAX_SPECTRUM_BYTES),
        }
    )
    return Target(service, instruments)


def open_request(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> socket.socket:
    """A raw HTTP/1.1 request: the head (with the given headers) and the first ``body`` bytes, nothing more."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    connection.sendall(head.encode() + b"\r\n" + body)
    return connection


def answered(connection: socket.socket) -> bool:
    """Whether the server has answered (or closed) yet, without waiting and without consuming the answer."""
    timeout = connection.gettimeout()
    connection.setblocking(False)  # with a timeout set, recv would first wait for data up to it
    try:
        connection.recv(1, socket.MSG_PEEK)
        return True  # data, or b"" for a closed connection
    except BlockingIOError:
        return False
    finally:
        connection.settimeout(timeout)


def status_of(connection: socket.socket, deadline_s: float = 60.0) -> tuple[int, bytes]:
    """The answer's status code and what was read of it, waiting at most ``deadline_s``."""
    connection.settimeout(deadline_s)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(65_536)
        if not chunk:
            break
        received += chunk
    assert received.startswith(b"HTTP/1.1 "), f"no HTTP answer: {received[:200]!r}"
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        chunk = connection.recv(65_536)
        if not chunk:
            break
        body += chunk
    return int(received.split(b" ", 2)[1]), head + b"\r\n\r\n" + body


def api(path: str) -> str:
    return "/api/v1" + path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def connections() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for connection in opened:
        connection.close()


def test_slow_bodies_hold_no_permit_and_end_with_408(target: Target, connections):
    service = target.service
    with service.client(service.worker_token) as worker:
        registered = worker.post("/workers", json={"name": "w", "site": "local", "host": "h", "capacity": 1})
        assert registered.status_code == 200, registered.text
        worker_id = registered.json()["id"]
    json_head = {"Content-Type": "application/json", "Content-Length": "2000"}
    slow = {
        "submit, no token": (api("/campaigns"), json_head, 6),
        "submit": (api("/campaigns"), {**json_head, **bearer(service.user_token)}, 4),
        "claim": (api(f"/workers/{worker_id}/claim"), {**json_head, **bearer(service.worker_token)}, 2),
        "upload": (
            api("/instrument-files?kind=focal-plane"),
            {"Content-Type": "application/x-hdf5", "Content-Length": str(MIB), **bearer(service.user_token)},
            4,
        ),
    }
    opened: list[tuple[str, socket.socket]] = []
    for name, (path, headers, count) in slow.items():
        first = b"\x89HDF\r\n\x1a\n" + b"\0" * 65_536 if name == "upload" else b'{"name": "sl'
        for _ in range(count):
            connection = open_request(target.port, "POST", path, headers, first)
            connections.append(connection)
            opened.append((name, connection))
    assert len(opened) == 16

    # Meanwhile, with two permits and a 1 s admission timeout: a status read and a claim (its body sent
    # promptly) are admitted and answered; a slow body would have made them 503 busy.
    with service.client(service.user_token, timeout=30) as user, service.client(service.worker_token) as worker:
        for _ in range(3):
            assert user.get("/campaigns").status_code == 200
            claim = worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 1})
            assert claim.status_code == 200, claim.text
        assert user.post("/campaigns", json=spec_data(realizations=1)).status_code == 201
    assert not any(answered(connection) for _, connection in opened), "a slow body was answered too early"

    record("request bodies", "16 slow bodies pending, 2 permits, admission timeout 1 s: status reads and claims 200")
    for name, connection in opened:
        status, received = status_of(connection, deadline_s=BODY_TIMEOUT_S + 45)
        assert status == 408, (name, received[:300])
        assert b"request_timeout" in received or b"connection: close" in received.lower()
    assert target.uploads_kept() == [] and target.upload_records() == []  # no file, no temporary file, no row
    with service.client(service.user_token) as user:
        assert len(user.get("/campaigns").json()["items"]) == 1  # only the campaign submitted in full


def send_until_refused(connection: socket.socket, total: int, chunked: bool, stall_s: float = 10.0) -> int:
    """Send up to ``total`` body bytes as fast as the server takes them, until it answers, closes, or takes
    nothing for ``stall_s``; return how many it took: what a client could make it hold at most."""
    block = b"\0" * MIB
    piece = (f"{len(block):x}\r\n".encode() + block + b"\r\n") if chunked else block
    sent, pending = 0, piece
    connection.setblocking(False)
    try:
        while sent < total:
            readable, writable, _ = select.select([connection], [connection], [], stall_s)
            if readable or not writable:  # answered (or closed), or stalled: the server reads no more
                break
            try:
                taken = connection.send(pending)
            except BlockingIOError:
                continue
            sent += taken
            pending = pending[taken:] or piece
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        connection.settimeout(60)
    return sent


@pytest.mark.parametrize("path", ["/instrument-files?kind=focal-plane", "/spectrum?transfer=1&noise=2"])
def test_a_large_body_without_a_token_is_refused_unread(target: Target, connections, path):
    before = target.memory_bytes()
    # Declared: over the endpoint's limit, refused from the head alone.
    declared = open_request(target.port, "POST", api(path), {"Content-Length": str(200 * MIB)})
    connections.append(declared)
    status, received = status_of(declared)
    assert status == 413, received[:300]
    # Streamed without a length (chunked): the token is checked before a byte is read.
    streamed = open_request(
        target.port, "POST", api(path), {"Transfer-Encoding": "chunked", "Content-Type": "application/fits"}
    )
    connections.append(streamed)
    sent = send_until_refused(streamed, 200 * MIB, chunked=True)
    status, received = status_of(streamed)
    assert status == 401, received[:300]
    assert sent < 64 * MIB, f"the server let a client without a token send {sent / MIB:.0f} MiB"
    growth = target.memory_bytes() - before
    assert growth < 48 * MIB, f"the server grew by {growth / MIB:.0f} MiB"
    record(
        "request bodies",
        f"POST {path.split('?')[0]} without a token, 200 MiB chunked: 401 after {sent / MIB:.1f} MiB taken "
        f"(socket buffers), server memory {growth / MIB:+.1f} MiB",
    )
    assert target.uploads_kept() == [] and target.upload_records() == []


def test_oversized_and_mislabelled_bodies_with_a_token_are_refused_and_nothing_is_kept(target: Target, connections):
    service = target.service
    token = bearer(service.user_token)
    upload = api("/instrument-files?kind=focal-plane")
    before = target.memory_bytes()
    # A declared length over the limit: 413 from the head.
    declared = open_request(target.port, "POST", upload, {**token, "Content-Type": "application/x-hdf5",
                                                          "Content-Length": str(MAX_UPLOAD_BYTES + 1)})  # fmt: skip
    connections.append(declared)
    assert status_of(declared)[0] == 413
    # No length, more than the limit streamed: cut off at the limit (413), the partial file removed.
    streamed = open_request(target.port, "POST", upload, {**token, "Content-Type": "application/x-hdf5",
                                                          "Transfer-Encoding": "chunked"})  # fmt: skip
    connections.append(streamed)
    sent = send_until_refused(streamed, 64 * MIB, chunked=True)
    status, received = status_of(streamed)
    assert status == 413 and b"too_large" in received, received[:300]
    assert sent < 48 * MIB, f"{sent / MIB:.0f} MiB taken past a {MAX_UPLOAD_BYTES / MIB:.0f} MiB limit"
    # The wrong media type, with a large body: 415 before the body is read.
    for headers, path in (
        ({"Content-Type": "text/x-ecsv"}, upload),
        ({"Content-Type": "application/json"}, api("/spectrum?transfer=1&noise=2")),
        ({}, upload),
    ):
        mislabelled = open_request(target.port, "POST", path, {**token, **headers, "Transfer-Encoding": "chunked"})
        connections.append(mislabelled)
        sent = send_until_refused(mislabelled, 64 * MIB, chunked=True)
        status, received = status_of(mislabelled)
        assert status == 415, (headers, path, received[:300])
        assert sent < 48 * MIB
    # A JSON body over its 1 MiB limit, streamed without a length: 413, no campaign.
    with httpx.Client(base_url=service.api_url, headers=token, timeout=60) as client:

        def chunks() -> Iterator[bytes]:
            yield b'{"name": "'
            for _ in range(4):
                yield b"x" * MIB
            yield b'"}'

        answer = client.post("/campaigns", content=chunks(), headers={"Content-Type": "application/json"})
        assert answer.status_code == 413, answer.text
        assert client.get("/campaigns").json()["items"] == []
    growth = target.memory_bytes() - before
    assert growth < 48 * MIB, f"the server grew by {growth / MIB:.0f} MiB"
    assert target.uploads_kept() == [] and target.upload_records() == []
    work = service.data_dir / "spectrum-work"
    assert not work.exists() or list(work.iterdir()) == []
    assert json.loads(httpx.get(service.url + "/healthz").text)["status"] == "ok"
