"""``mapcampaign watch ID``: follow a campaign to its end with live progress bars.

The service's SSE stream (``GET /api/v1/events?campaign_id=ID``) says *when* something changed; the
counts always come from ``GET /campaigns/ID``, so a missed or repeated event never shows wrong
figures. When the stream cannot be opened or breaks, the campaign is polled instead (and the stream
retried now and then).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, Self

import typer

from mapcampaign.cli._client import ApiClient, duration, print_json
from schemas.states import FINISHED_CAMPAIGN_STATES, CampaignState, RealizationState

# Where following a campaign stops: it ended, or it is held (fail fast) until its owner's `retry`.
FINISHED = (*FINISHED_CAMPAIGN_STATES, CampaignState.HELD)
# One bar per state a realisation passes through (claimed counts as running); cancelled gets one when it happens.
BAR_STATES = tuple(
    state.value
    for state in (RealizationState.QUEUED, RealizationState.RUNNING, RealizationState.SUCCEEDED, RealizationState.FAILED)
)


def exit_code_for(state: str) -> int:
    """0 when every realisation succeeded, 1 when any failed, the campaign was cancelled or is held."""
    return 0 if state == CampaignState.SUCCEEDED else 1


class EventPoker:
    """Reads the SSE stream in a daemon thread and puts a token in ``pokes`` for every event."""

    def __init__(self, client: ApiClient, campaign_id: int):
        self.client = client
        self.campaign_id = campaign_id
        self.pokes: queue.Queue[str] = queue.Queue()
        self.connected = threading.Event()
        self.lost = threading.Event()  # the stream failed at least once: the watcher is polling
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sse", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        import httpx

        last_event_id: str | None = None
        while not self.stop.is_set():
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            try:
                # The read timeout outlasts the service's keep-alive comments (15 s by default).
                with self.client.http.stream(
                    "GET",
                    "/events",
                    params={"campaign_id": self.campaign_id},
                    headers=headers,
                    timeout=httpx.Timeout(10.0, read=60.0),
                ) as answer:
                    if answer.status_code != 200:
                        raise httpx.HTTPStatusError("no stream", request=answer.request, response=answer)
                    self.connected.set()
                    self.pokes.put("connected")
                    for line in answer.iter_lines():
                        if self.stop.is_set():
                            return
                        if line.startswith("id:"):
                            last_event_id = line[3:].strip()
                        elif line.startswith("data:"):
                            self.pokes.put("event")
            except Exception:  # noqa: BLE001, S110 - any failure of the stream: the watcher polls until it is back
                pass
            self.connected.clear()
            self.lost.set()
            self.pokes.put("lost")
            self.stop.wait(5.0)


class ProgressView:
    """Rich bars on stderr when it is a terminal; otherwise one line on stderr whenever the counts change."""

    def __init__(self, campaign_id: int, *, quiet: bool):
        from mapcampaign.cli._client import stderr_console

        self.campaign_id = campaign_id
        self.quiet = quiet
        self.console = stderr_console()
        self.live = self.console.is_terminal and not quiet
        self.last_line = ""
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Self:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.progress = Progress(
                TextColumn("{task.description:>10}"),
                BarColumn(bar_width=40),
                MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"),
                console=self.console,
                transient=False,
                refresh_per_second=4,
            )
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def say(self, text: str) -> None:
        """A one-off remark on stderr (how the campaign is followed), dim under the bars."""
        if self.progress is not None:
            self.progress.console.print(f"[dim]{text}[/]")
        elif not self.quiet:
            typer.echo(text, err=True)

    def show(self, detail: dict[str, Any], *, polling: bool = False, waiting_for: str = "") -> None:
        progress = detail["progress"]
        counts = dict(progress["counts"])
        counts["running"] = counts.get("running", 0) + counts.get("claimed", 0)
        eta = progress.get("eta_seconds")
        total = progress["total"]
        header = f"campaign {detail['id']} {detail['state']}"
        note = f"ETA {duration(eta)}" if eta is not None and detail["state"] not in FINISHED else ""
        if waiting_for and detail["state"] not in FINISHED:
            note = (note + "  " + waiting_for).strip()
        if polling and detail["state"] not in FINISHED:
            note = (note + "  (polling)").strip()
        if self.progress is not None:
            if not self.tasks:
                self.progress.console.print(f"[bold]campaign {detail['id']}[/]: {detail['name']}")
                for state in BAR_STATES:
                    self.tasks[state] = self.progress.add_task(state, total=total, note="")
                self.tasks["cancelled"] = None
            for state in BAR_STATES:
                self.progress.update(
                    self.tasks[state],
                    completed=counts.get(state, 0),
                    total=total,
                    note=note if state == RealizationState.QUEUED else (header if state == RealizationState.RUNNING else ""),
                )
            if counts.get("cancelled") and self.tasks["cancelled"] is None:
                self.tasks["cancelled"] = self.progress.add_task("cancelled", total=total, note="")
            if self.tasks["cancelled"] is not None:
                self.progress.update(self.tasks["cancelled"], completed=counts.get("cancelled", 0))
            return
        if self.quiet:
            return
        line = (
            f"{header}: "
            + ", ".join(f"{state} {counts.get(state, 0)}" for state in (*BAR_STATES, "cancelled"))
            + f" of {total}"
            + (f" ({waiting_for})" if waiting_for else "")
        )
        if line != self.last_line:  # a log, not a display: a new line only when the counts change
            eta = f", ETA {duration(eta)}" if eta is not None and detail["state"] not in FINISHED else ""
            typer.echo(line + eta + (" (polling)" if polling else ""), err=True)
            self.last_line = line


# Plan events carry no campaign, so a campaign's stream does not say when its plan changes: /plans is
# asked again when the campaign's counts change, or after this many seconds of the same wait.
PLAN_REFRESH_S = 10.0


def waiting(detail: dict[str, Any]) -> bool:
    """Realisations are queued and none runs: the campaign waits for something (a plan, a worker)."""
    counts = detail["progress"]["counts"]
    running = counts.get("running") or counts.get("claimed")
    return detail["state"] not in FINISHED and bool(counts.get("queued")) and not running


def plan_wait(client: ApiClient, detail: dict[str, Any]) -> str:
    """What queued realisations wait for when nothing runs: their overlap plan being built (or failed)."""
    if not waiting(detail):
        return ""
    plans = client.get("/plans", params={"scan_key": detail["scan_key"], "limit": 50})["items"]
    states = {plan["state"] for plan in plans if plan["ranks"] == detail["ranks"]}
    if "building" in states:
        return "overlap plan: building"
    if states == {"failed"}:
        return "overlap plan: failed, to be rebuilt"
    if not states:
        return "waiting for a worker"
    return ""


class PlanWait:
    """:func:`plan_wait`, asked of the service only when the campaign changed or the answer is PLAN_REFRESH_S old."""

    def __init__(
        self, client: ApiClient, *, refresh_s: float = PLAN_REFRESH_S, clock: Callable[[], float] = time.monotonic
    ):
        self.client = client
        self.refresh_s = refresh_s
        self.clock = clock  # seconds; tests move their own
        self.asked = 0  # GET /plans made
        self._key: tuple[Any, ...] | None = None
        self._answer = ""
        self._asked_at = float("-inf")

    def __call__(self, detail: dict[str, Any]) -> str:
        key = (detail["state"], tuple(sorted(detail["progress"]["counts"].items())))
        if key != self._key or self.clock() - self._asked_at >= self.refresh_s:
            self.asked += waiting(detail)
            self._answer = plan_wait(self.client, detail)
            self._key, self._asked_at = key, self.clock()
        return self._answer


def watch_campaign(
    client: ApiClient, campaign_id: int, *, poll_s: float = 2.0, quiet: bool = False
) -> dict[str, Any]:
    """Follow the campaign until it ends; return its final detail."""
    poker = EventPoker(client, campaign_id)
    detail: dict[str, Any] = client.get(f"/campaigns/{campaign_id}")  # 404 ends the command before any thread starts
    if detail["state"] in FINISHED:
        with ProgressView(campaign_id, quiet=quiet) as view:
            view.show(detail)
        return detail
    poker.start()
    waiting_for = PlanWait(client)
    try:
        with ProgressView(campaign_id, quiet=quiet) as view:
            view.show(detail)
            # Wait briefly for the stream (or its failure) so that an event right after the first read is not missed.
            try:
                poker.pokes.get(timeout=5.0)
            except queue.Empty:
                pass
            view.say(
                "following the service's event stream"
                if poker.connected.is_set()
                else f"event stream unavailable: polling every {poll_s:g} s"
            )
            while True:
                detail = client.get(f"/campaigns/{campaign_id}")
                view.show(
                    detail,
                    polling=poker.lost.is_set() and not poker.connected.is_set(),
                    waiting_for=waiting_for(detail),
                )
                if detail["state"] in FINISHED:
                    return detail
                # With the stream up, events wake us at once and the timeout is only a safety net.
                timeout = 10.0 if poker.connected.is_set() else poll_s
                try:
                    poker.pokes.get(timeout=timeout)
                    time.sleep(0.2)  # gather a burst of events into one read
                    while not poker.pokes.empty():
                        poker.pokes.get_nowait()
                except queue.Empty:
                    pass
    finally:
        poker.stop.set()


def watch(
    campaign_id: Annotated[int, typer.Argument(min=1, metavar="ID", help="Campaign id (see `mapcampaign list`)")],
    poll_s: Annotated[
        float, typer.Option("--poll", min=0.2, help="Seconds between status reads when the event stream is down")
    ] = 2.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final campaign status as JSON on stdout")] = False,
) -> None:
    """Follow a campaign to its end with live progress bars (queued, running, succeeded, failed, ETA).

    Exit status: 0 when every realisation succeeded, 1 when any failed, the campaign was cancelled or is
    held (fail fast: the same failure again and again; the reason is printed, `retry` releases it), 2 for
    an unknown campaign.
    """
    with ApiClient(timeout=30.0) as client:
        detail = watch_campaign(client, campaign_id, poll_s=poll_s, quiet=quiet)
    if as_json:
        print_json(detail)
    else:
        counts = detail["progress"]["counts"]
        typer.echo(
            f"campaign {campaign_id} {detail['state']}: {counts.get('succeeded', 0)} succeeded, "
            f"{counts.get('failed', 0)} failed, {counts.get('cancelled', 0)} cancelled"
            + (f" ({detail['failure_cause']})" if detail.get("failure_cause") else "")
        )
    raise typer.Exit(exit_code_for(detail["state"]))
