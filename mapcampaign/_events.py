"""A campaign's server-sent events as wake-up calls for :meth:`mapcampaign.Client.watch`.

The stream (``GET /api/v1/events?campaign_id=ID``) says *when* something changed; the figures always
come from ``GET /campaigns/ID``, so a missed or repeated event never shows a wrong count. When the stream
cannot be opened or breaks, the watcher polls, and the stream is tried again every few seconds.
"""

from __future__ import annotations

import threading
from typing import Self

import httpx

RECONNECT_S = 5.0
# The read timeout outlasts the service's keep-alive comments (15 s by default).
STREAM_TIMEOUT = httpx.Timeout(10.0, read=60.0)


class CampaignEvents:
    """Reads the SSE stream of one campaign in a daemon thread; :meth:`wait` returns when something happened."""

    def __init__(self, http: httpx.Client, campaign_id: int):
        self.http = http
        self.campaign_id = campaign_id
        self.connected = threading.Event()
        self._poked = threading.Event()  # set by every event, connection and loss; cleared by wait()
        self._stopped = threading.Event()
        self._answer: httpx.Response | None = None
        self._thread = threading.Thread(target=self._run, name=f"mapcampaign-events-{campaign_id}", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopped.set()
        answer = self._answer
        if answer is not None:
            answer.close()  # ends the blocked read at once instead of at the next keep-alive

    def wait(self, timeout: float) -> bool:
        """Block until an event (or a change of the connection) or ``timeout`` seconds; True when woken."""
        woken = self._poked.wait(timeout)
        self._poked.clear()
        return woken

    def _run(self) -> None:
        last_event_id: str | None = None
        while not self._stopped.is_set():
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            try:
                with self.http.stream(
                    "GET",
                    "/events",
                    params={"campaign_id": self.campaign_id},
                    headers=headers,
                    timeout=STREAM_TIMEOUT,
                ) as answer:
                    self._answer = answer
                    if self._stopped.is_set():  # stopped while connecting: stop() found no answer to close
                        return
                    if answer.status_code == 200:
                        self.connected.set()
                        self._poked.set()
                        for line in answer.iter_lines():
                            if self._stopped.is_set():
                                return
                            if line.startswith("id:"):
                                last_event_id = line[3:].strip()
                            elif line.startswith("data:"):
                                self._poked.set()
            except Exception:  # noqa: BLE001, S110 - any failure of the stream: the watcher polls until it is back
                pass
            finally:
                self._answer = None
            self.connected.clear()
            self._poked.set()
            self._stopped.wait(RECONNECT_S)
