"""``mapcampaign up`` and ``mapcampaign demo``: the embedded default in one command (API, dashboard, one local worker)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mapcampaign.cli._utilities import fail, load_settings

HostOption = Annotated[
    str | None,
    typer.Option("--host", help="Listen address [env MAPCAMPAIGN_HOST, default 127.0.0.1: this machine only]"),
]
PortOption = Annotated[int | None, typer.Option("--port", help="Port [env MAPCAMPAIGN_PORT, default 8765]")]
SiteOption = Annotated[
    Path | None,
    typer.Option("--site", help="Site file for the worker (default: this machine, written to <data dir>/up/)"),
]
MaxTasksOption = Annotated[
    int | None,
    typer.Option("--max-tasks", min=1, help="Tasks the local worker runs at once (default: cores / 2)"),
]


def _login_link(url: str, token_file: Path) -> str | None:
    """A one-time dashboard login link for the local user (POST /login-links); None if the service says no."""
    import httpx

    try:
        answer = httpx.post(
            f"{url}/api/v1/login-links",
            headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
            timeout=30.0,  # the API has just started, beside a worker registering: the first answers are slow
        )
    except (OSError, httpx.HTTPError):
        return None
    return str(answer.json()["url"]) if answer.status_code == 201 else None


def _describe_stack(stack: object) -> None:
    from mapcampaign.cli._stack import LocalStack

    assert isinstance(stack, LocalStack)
    typer.echo(f"API        {stack.url}/api/v1   (OpenAPI: {stack.url}/api/v1/docs)", err=True)
    link = _login_link(stack.url, stack.user_token_file)
    if link:
        typer.echo(
            f"dashboard  {link}   (a one-time login link, valid 10 min; `mapcampaign login` makes another)",
            err=True,
        )
    else:
        typer.echo(f"dashboard  {stack.url}/   (log in with the token in {stack.user_token_file})", err=True)
    typer.echo(f"data       {stack.data_dir}   (logs in {stack.log_dir})", err=True)


def up(
    host: HostOption = None,
    port: PortOption = None,
    site: SiteOption = None,
    max_tasks: MaxTasksOption = None,
) -> None:
    """Run the API, the dashboard and one local worker together (the embedded default: SQLite in the data
    folder, MPI on this machine) until Ctrl-C or SIGTERM, which stop all of it, the worker's MPI jobs included.

    The user token is written to <data dir>/tokens/local-user.token (and reused), so `mapcampaign submit`,
    `list`, `watch` ... work from another terminal without --server or --token.

    One `up` per data folder: it holds <data dir>/up/up.lock while it runs, and a second `up` (or `demo`) on
    the same folder exits 2 naming the first one's pid and address.
    """
    from mapcampaign.cli._stack import LocalStack, StackInterrupted

    settings = load_settings(host=host, port=port)
    stack = LocalStack(settings, site=site, max_tasks=max_tasks)
    try:
        stack.start()
        _describe_stack(stack)
        typer.echo("running; Ctrl-C stops everything", err=True)
        stack.wait()
        typer.echo("stopping: worker (its MPI jobs are ended and handed back), then the API", err=True)
    except StackInterrupted:
        pass
    finally:
        stack.stop()
    typer.echo("stopped", err=True)


def demo(
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Campaign spec to run (default: the bundled demo campaign)")
    ] = None,
    host: HostOption = None,
    port: PortOption = None,
    max_tasks: MaxTasksOption = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for the Monte Carlo products (default <data dir>/demo/campaign-ID-products)"),
    ] = None,
    stay: Annotated[
        bool, typer.Option("--stay", help="Keep the API and dashboard running after the campaign, until Ctrl-C")
    ] = False,
) -> None:
    """Start the embedded default (as `up`), submit the bundled example campaign, show its progress to the
    end, and print where its maps and the dashboard are. Each run is a new campaign.

    Exit status: 0 when every realisation succeeded, 1 when any failed, 2 for a bad spec or a taken port.
    """
    from mapcampaign.cli._client import ApiClient
    from mapcampaign.cli._stack import LocalStack, StackInterrupted
    from mapcampaign.cli.watch import FINISHED, exit_code_for, watch_campaign
    from schemas.io import SpecError, load_example_spec, load_spec

    try:
        if spec is None:
            campaign_spec = load_example_spec("demo")
        else:
            campaign_spec = load_spec(spec)
    except SpecError as error:
        fail(str(error), code=2)

    settings = load_settings(host=host, port=port)
    stack = LocalStack(settings, max_tasks=max_tasks)
    code = 1
    try:
        stack.start()
        _describe_stack(stack)
        with ApiClient(server=stack.url, token=stack.user_token_file.read_text().strip(), timeout=30.0) as client:
            detail = client.request(
                "POST", "/campaigns", expected=(201,), json=campaign_spec.model_dump(mode="json")
            ).json()
            campaign_id = detail["id"]
            typer.echo(
                f"campaign {campaign_id} submitted: {campaign_spec.name} -- {campaign_spec.realizations} realisations "
                f"at nside {campaign_spec.pixelization.nside} on {campaign_spec.resources.ranks} MPI rank(s) each",
                err=True,
            )
            typer.echo(f"watch it in the dashboard: {stack.url}/campaigns/{campaign_id}", err=True)
            detail = watch_campaign(client, campaign_id)
            stack.check_children()
        code = exit_code_for(detail["state"]) if detail["state"] in FINISHED else 1
        products_dir = _download_products(stack, detail, out)
        _describe_results(stack, detail, products_dir, stay=stay)
        if stay:
            typer.echo(f"the dashboard stays at {stack.url}/campaigns/{campaign_id}; Ctrl-C stops it", err=True)
            stack.wait()
    except StackInterrupted:
        typer.echo("interrupted: stopping the worker and the API", err=True)
        code = 130
    finally:
        stack.stop()
    raise typer.Exit(code)


def _download_products(stack: object, detail: dict[str, Any], out: Path | None) -> Path | None:
    """Fetch the campaign's Monte Carlo products (FITS) while the service is still up; None when there are none."""
    from mapcampaign.cli._stack import LocalStack
    from mapcampaign.cli.products import Format, products

    assert isinstance(stack, LocalStack)
    if not detail["progress"]["counts"].get("succeeded"):
        return None
    target = out or stack.data_dir / "demo" / f"campaign-{detail['id']}-products"
    try:
        products(
            detail["id"], format=Format.fits, out=target, realization=None, as_json=False,
            url=stack.url, token_file=stack.user_token_file,
        )
    except typer.Exit:  # the products command said why on stderr; the demo still reports the rest
        return None
    return target


def _describe_results(stack: object, detail: dict[str, Any], products_dir: Path | None, *, stay: bool) -> None:
    from mapcampaign.cli._stack import LocalStack
    from schemas.programs import MAP_FILES
    from service.storage import CampaignStorage

    assert isinstance(stack, LocalStack)
    campaign_id = detail["id"]
    counts = detail["progress"]["counts"]
    folder = CampaignStorage(stack.settings.products_dir).realizations_dir(campaign_id)
    maps = sorted(folder.glob(f"*/{MAP_FILES['iqu']}"))
    lines = [
        f"campaign {campaign_id} {detail['state']}: {counts.get('succeeded', 0)} of {detail['realizations']} "
        f"realisations succeeded" + (f" ({detail['failure_cause']})" if detail.get("failure_cause") else ""),
        f"maps (HEALPix RING, K) of each realisation: {folder}/<n>/{MAP_FILES['iqu']} ({len(maps)} found)",
        (
            f"Monte Carlo products (mean and variance maps, mask, spectra): {products_dir}"
            if products_dir
            else "Monte Carlo products: none (no realisation succeeded)"
        ),
        f"dashboard: {stack.url}/campaigns/{campaign_id} (log in with the token in {stack.user_token_file}"
        + ("" if stay else "; the demo stops the service at its end, `mapcampaign up` starts it again")
        + ")",
    ]
    if counts.get("failed"):
        lines.append(f"why realisations failed: `mapcampaign logs {campaign_id}` (with `mapcampaign up` running)")
    typer.echo("\n".join(lines))
