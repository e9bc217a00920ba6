"""The worker's HTTP client against a real HTTP server on loopback: retries resend whole bodies."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from worker.client import ServiceClient


@pytest.fixture
def busy_once_server():
    """Answers the first PUT 503 (busy), every later one 200; records the size of each body it read."""
    received: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802
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
