"""Campaign commands: ``submit``, ``list``, ``status``, ``cancel``, ``retry``, ``logs``.

They talk to the service over HTTP with a user token (see ``mapcampaign/cli/_client.py`` for where the
server and the token come from). ``--json`` prints only JSON on stdout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mapcampaign.cli._client import (
    ApiClient,
    answer_detail,
    duration,
    fail_on_answer,
    field_problems,
    print_json,
    short_time,
    stdout_console,
)
from mapcampaign.cli._utilities import fail
from schemas.states import CampaignState

SPEC_SUFFIXES = (".toml", ".yaml", ".yml", ".json")  # schemas.io.SPEC_SUFFIXES; kept light for --help
JsonOption = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (for scripts)")]
CampaignId = Annotated[int, typer.Argument(min=1, metavar="ID", help="Campaign id (see `mapcampaign list`)")]


# --------------------------------------------------------------------------- submit


def spec_files(paths: list[Path]) -> tuple[list[Path], list[dict[str, Any]]]:
    """The spec files named by ``paths`` (a folder gives its *.toml, *.yaml, *.yml, *.json, sorted), and an
    outcome for each path that is neither."""
    files: list[Path] = []
    missing: list[dict[str, Any]] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SPEC_SUFFIXES)
            if not found:
                missing.append(_outcome(path, "invalid", problems=[("", "folder holds no .toml/.yaml/.yml/.json spec")]))
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            missing.append(_outcome(path, "invalid", problems=[("", "no such file or folder")]))
    return files, missing


def _outcome(path: Path, outcome: str, **fields: Any) -> dict[str, Any]:
    problems = fields.pop("problems", [])
    return {
        "file": str(path),
        "outcome": outcome,
        "problems": [{"field": field, "reason": reason} for field, reason in problems],
        **fields,
    }


def submit_one(client: ApiClient | None, path: Path, *, dry_run: bool, new: bool) -> dict[str, Any]:
    """Validate one file locally, then (unless ``dry_run``) create its campaign. Returns its outcome record."""
    import secrets

    import httpx

    from schemas.io import SpecError, load_spec

    try:
        spec = load_spec(path)
    except SpecError as error:
        return _outcome(path, "invalid", problems=error.problems)
    from mapcampaign.client import spec_file_key, spec_notes

    summary: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "realizations": spec.realizations}
    notes = spec_notes(spec)
    if notes:
        summary["notes"] = notes
    if dry_run or client is None:
        return _outcome(path, "valid", **summary)

    key = spec_file_key(path.read_bytes())
    if new:
        key += "-" + secrets.token_hex(8)
    try:
        answer = client.http.post(
            "/campaigns", json=spec.model_dump(mode="json"), headers={"Idempotency-Key": key}
        )
    except httpx.HTTPError as error:
        return _outcome(path, "error", reason=f"cannot reach the service at {client.server}: {error}", **summary)
    if answer.status_code == 422:
        return _outcome(path, "invalid", problems=field_problems(answer))
    if answer.status_code not in (200, 201):
        # A 4xx (bad token, conflict) is the user's to fix; a 5xx is the service's failure.
        outcome = "refused" if answer.status_code < 500 else "error"
        return _outcome(path, outcome, reason=f"{answer_detail(answer)} (HTTP {answer.status_code})", **summary)
    campaign = answer.json()
    return _outcome(
        path,
        "replayed" if answer.status_code == 200 else "submitted",
        campaign_id=campaign["id"],
        state=campaign["state"],
        **summary,
    )


def describe_outcome(record: dict[str, Any]) -> str:
    return _outcome_line(record) + "".join(f"\n  note: {note}" for note in record.get("notes", []))


def _outcome_line(record: dict[str, Any]) -> str:
    file, outcome = record["file"], record["outcome"]
    if outcome == "invalid":
        reasons = "; ".join(
            f"{problem['field']}: {problem['reason']}" if problem["field"] else problem["reason"]
            for problem in record["problems"]
        )
        return f"{file}: invalid: {reasons}"
    if outcome in ("error", "refused"):
        return f"{file}: not submitted: {record['reason']}"
    if outcome == "valid":
        return f"{file}: valid ({record['kind']}, {record['realizations']} realisations); dry run, nothing stored"
    if outcome == "replayed":
        return f"{file}: already submitted as campaign {record['campaign_id']} ({record['state']}); not duplicated"
    return f"{file}: submitted as campaign {record['campaign_id']} ({record['realizations']} realisations)"


def submit(
    paths: Annotated[
        list[Path],
        typer.Argument(metavar="SPEC", help="Spec files (TOML, YAML, JSON) or folders of them", show_default=False),
    ],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate only; send and store nothing")] = False,
    new: Annotated[
        bool, typer.Option("--new", help="Make a new campaign even if this file was submitted before")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Submit campaign specs, many at once: one line of outcome per file.

    Each file is validated before anything is sent; an invalid one is named with the field path and the
    reason, and the valid ones are still submitted. Every request carries an Idempotency-Key made from
    the file's bytes, so submitting the same file again gives back its campaign instead of a second one.

    Exit status: 0 all submitted (or valid, with --dry-run); 2 some file was invalid or refused (e.g. a
    bad token); 1 the service could not be reached or failed.
    """
    files, records = spec_files(paths)
    client = None if dry_run else ApiClient()
    try:
        for path in files:
            records.append(submit_one(client, path, dry_run=dry_run, new=new))
    finally:
        if client is not None:
            client.http.close()
    if as_json:
        print_json(records)
    else:
        for record in records:
            line = describe_outcome(record)
            typer.echo(line, err=record["outcome"] in ("invalid", "refused", "error"))
    outcomes = {record["outcome"] for record in records}
    raise typer.Exit(2 if outcomes & {"invalid", "refused"} else 1 if "error" in outcomes else 0)


# --------------------------------------------------------------------------- list, status


STATE_STYLE = {
    "queued": "yellow",
    "claimed": "cyan",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def list_campaigns(
    state: Annotated[
        str | None, typer.Option("--state", help="Only this state: queued, running, succeeded, failed, cancelled")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Name contains this (any case)")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="At most this many, newest first")] = 50,
    as_json: JsonOption = False,
) -> None:
    """List your campaigns, newest first."""
    params: dict[str, Any] = {"limit": limit}
    if state:
        params["state"] = state
    if name:
        params["name"] = name
    with ApiClient() as client:
        page = client.get("/campaigns", params=params)
    items = page["items"]
    if as_json:
        print_json(items)
        return
    if not items:
        typer.echo("no campaigns" + (" in that state" if state else "") + "; submit one with `mapcampaign submit FILE`")
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("id", "name", "kind", "state", "realisations", "ranks", "created", "finished"):
        table.add_column(column, justify="right" if column in ("id", "realisations", "ranks") else "left")
    for item in items:
        style = STATE_STYLE.get(item["state"], "")
        table.add_row(
            str(item["id"]),
            item["name"],
            item["kind"],
            f"[{style}]{item['state']}[/]" if style else item["state"],
            str(item["realizations"]),
            str(item["ranks"]),
            short_time(item["created_at"]),
            short_time(item.get("finished_at")),
        )
    stdout_console().print(table)


def describe_campaign(detail: dict[str, Any]) -> str:
    progress = detail["progress"]
    counts = progress["counts"]
    lines = [
        f"campaign {detail['id']}: {detail['name']}",
        f"  state        {detail['state']}" + (f" ({detail['failure_cause']})" if detail.get("failure_cause") else ""),
        f"  kind         {detail['kind']}, {detail['realizations']} realisations on {detail['ranks']} MPI rank(s) each",
        "  realisations " + ", ".join(f"{state} {counts.get(state, 0)}" for state in STATE_STYLE),
        f"  done         {progress['done']} of {progress['total']}",
    ]
    if progress.get("throughput_per_hour"):
        lines.append(f"  throughput   {progress['throughput_per_hour']:.1f} realisations/hour")
    if progress.get("eta_seconds") is not None:
        lines.append(f"  ETA          {duration(progress['eta_seconds'])}")
    lines.append(f"  created      {short_time(detail['created_at'])}")
    if detail.get("finished_at"):
        lines.append(f"  finished     {short_time(detail['finished_at'])}")
    if detail.get("cancel_reason"):
        lines.append(f"  cancelled    {detail['cancel_reason']}")
    lines.append(f"  scan key     {detail['scan_key'][:16]}")
    return "\n".join(lines)


def status(campaign_id: CampaignId, as_json: JsonOption = False) -> None:
    """Show a campaign: state, realisations per state, throughput and ETA."""
    with ApiClient() as client:
        detail = client.get(f"/campaigns/{campaign_id}")
    if as_json:
        print_json(detail)
        return
    typer.echo(describe_campaign(detail))


# --------------------------------------------------------------------------- cancel, retry


def cancel(
    campaign_id: CampaignId,
    reason: Annotated[str, typer.Option("--reason", help="Why; kept with the campaign")] = "cancelled by the owner",
    as_json: JsonOption = False,
) -> None:
    """Cancel a campaign: its unfinished realisations become cancelled and running jobs are stopped.
    A campaign already cancelled is what was asked for: said, exit 0."""
    with ApiClient() as client:
        answer = client.request(
            "POST", f"/campaigns/{campaign_id}/cancel", json={"reason": reason}, expected=(200, 409)
        )
        if answer.status_code == 409:
            detail = client.get(f"/campaigns/{campaign_id}")
            if detail["state"] != CampaignState.CANCELLED:  # succeeded or failed: nothing to cancel, and not what was asked
                fail_on_answer(answer, f"POST /campaigns/{campaign_id}/cancel")
            if as_json:
                print_json(detail)
            else:
                typer.echo(f"campaign {campaign_id} was already cancelled ({detail.get('cancel_reason') or 'no reason'})")
            return
        detail = answer.json()
    if as_json:
        print_json(detail)
        return
    typer.echo(f"campaign {campaign_id}: {detail['state']} ({detail['progress']['counts'].get('cancelled', 0)} cancelled)")


def retry(campaign_id: CampaignId, as_json: JsonOption = False) -> None:
    """Put a campaign's failed realisations back in the queue with a fresh attempt budget; release a held one."""
    with ApiClient() as client:
        answer = client.request("POST", f"/campaigns/{campaign_id}/retry").json()
    if as_json:
        print_json(answer)
        return
    typer.echo(
        f"campaign {campaign_id}: {answer['requeued']} failed realisation(s) queued again; {answer['campaign']['state']}"
    )


def extend(
    campaign_id: CampaignId,
    realizations: Annotated[int, typer.Argument(min=1, help="How many realisations to add")],
    as_json: JsonOption = False,
) -> None:
    """Add realisations to a campaign, running or finished: the same spec, aggregates and plan; new seeds."""
    with ApiClient() as client:
        detail = client.request("POST", f"/campaigns/{campaign_id}/extend", json={"realizations": realizations}).json()
    if as_json:
        print_json(detail)
        return
    typer.echo(
        f"campaign {campaign_id}: {realizations} realisation(s) added, {detail['realizations']} in all; {detail['state']}"
    )


def clone(
    campaign_id: CampaignId,
    assignments: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="FIELD=VALUE",
            help="A change to the spec, e.g. --set pixelization.nside=128 (VALUE read as JSON, else text); repeatable",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The new campaign's name [default: the original's]")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a new campaign from an existing one's spec with changes; it shares the plan when the scan allows."""
    from mapcampaign.client import changes_from_assignments

    try:
        changes = changes_from_assignments(assignments or [])
    except ValueError as error:
        fail(f"--set {error}", code=2)
    if name is not None:
        changes["name"] = name
    with ApiClient() as client:
        detail = client.request(
            "POST", f"/campaigns/{campaign_id}/clone", json={"changes": changes}, expected=(200, 201)
        ).json()
    if as_json:
        print_json(detail)
        return
    typer.echo(
        f"campaign {detail['id']}: cloned from {campaign_id}; {detail['realizations']} realisation(s) {detail['state']}"
    )


def delete(
    campaign_id: CampaignId,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask; needed when not on a terminal")] = False,
) -> None:
    """Delete a finished campaign with its realisations, maps and products (cancel a running one first)."""
    import sys

    if not yes:
        if not sys.stdin.isatty():
            fail(f"deleting campaign {campaign_id} removes its maps and products: pass --yes", code=2)
        typer.confirm(f"Delete campaign {campaign_id} with its maps and products?", abort=True)
    with ApiClient() as client:
        client.request("DELETE", f"/campaigns/{campaign_id}", expected=(204,))
    typer.echo(f"campaign {campaign_id}: deleted")


# --------------------------------------------------------------------------- logs


def logs(
    campaign_id: CampaignId,
    realization: Annotated[
        int | None,
        typer.Option("--realization", "-r", min=0, help="Realisation index; default: every failed realisation"),
    ] = None,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="Only this attempt number (default: all)")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", min=1, help="Last lines of each log tail")] = 40,
    as_json: JsonOption = False,
) -> None:
    """Show the attempts of a realisation (worker, host, exit code, failure class) with the tail of their logs."""
    with ApiClient() as client:
        if realization is not None:
            indexes = [realization]
        else:
            page = client.get(f"/campaigns/{campaign_id}/realizations", params={"state": "failed", "limit": 20})
            indexes = [item["index"] for item in page["items"]]
        details = [client.get(f"/campaigns/{campaign_id}/realizations/{index}") for index in indexes]
    for detail in details:
        if attempt is not None:
            detail["attempt_history"] = [a for a in detail["attempt_history"] if a["number"] == attempt]
    if as_json:
        print_json([{"realization": d["index"], "state": d["state"], "attempts": d["attempt_history"]} for d in details])
        return
    if not details:
        typer.echo(f"campaign {campaign_id} has no failed realisation; pass --realization N for any other")
        return
    for detail in details:
        history = detail["attempt_history"]
        typer.echo(f"== realisation {detail['index']} ({detail['state']}), {len(history)} attempt(s)")
        for item in history:
            typer.echo(
                f"-- attempt {item['number']} on {item.get('worker') or '-'}@{item.get('host') or '-'}: "
                f"{item.get('failure_class') or ('running' if not item.get('ended_at') else 'ok')}, "
                f"exit code {item.get('exit_code') if item.get('exit_code') is not None else '-'}, "
                f"{short_time(item.get('started_at') or item['claimed_at'])} -> {short_time(item.get('ended_at'))}"
            )
            tail = (item.get("log_tail") or "").rstrip("\n")
            if tail:
                typer.echo("\n".join(tail.splitlines()[-lines:]))
            else:
                typer.echo("(no log tail)")
    if realization is not None and not details[0]["attempt_history"]:
        fail(f"realisation {realization} of campaign {campaign_id} has no such attempt", code=2)
