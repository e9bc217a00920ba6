"""The worker's HTTP client against a real HTTP server on loopback: retries resend whole bodies."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from worker.client import ServiceClient, ServiceError, TaskGone


@pytest.fixture
def busy_once_server():
    """Answers the first PUT 503 (busy), every later one 200; records the size of each body it read."""
    received: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):
            length = int(self.headers["Content-Length"])
            body = self.rfile.read(length)
            received.append(len(body))
            status = 503 if len(received) == 1 else 200
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()


def test_a_retried_upload_sends_the_whole_file_again(busy_once_server, tmp_path):
    """Found by review: the retry after a 503 reused the spent stream and sent nothing, so the result was lost."""
    url, received = busy_once_server
    product = tmp_path / "map_iqu.fits"
    product.write_bytes(bytes(range(256)) * 12_000)  # 3 MB: three 1 MiB pieces
    client = ServiceClient(url, "token", retry_s=10)
    try:
        client.upload("realize-1", "map_iqu.fits", product, hashlib.sha256(product.read_bytes()).hexdigest())
    finally:
        client.close()
    assert received == [product.stat().st_size] * 2


@pytest.mark.parametrize(
    ("status", "code", "gone"),
    [
        (409, "lease_lost", True),
        (404, "task_not_found", True),
        (404, "worker_not_found", False),
        (422, "invalid", False),
    ],
)
def test_a_task_of_a_deleted_campaign_is_gone_like_a_lost_lease(status, code, gone):
    """A report on a task whose campaign was deleted (404 task_not_found) means, like a 409, that there is
    nothing more to report: the worker drops it instead of logging an error and keeping its folder."""
    body = json.dumps({"detail": "no", "code": code}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = ServiceClient(f"http://127.0.0.1:{server.server_address[1]}", "token", retry_s=0)
    try:
        with pytest.raises(ServiceError) as raised:
            client._post("/tasks/realize-1/failed")
    finally:
        client.close()
        server.shutdown()
    assert isinstance(raised.value, TaskGone) is gone
    assert raised.value.status == status and raised.value.code == code
