"""``mapcampaign products ID``: download a campaign's Monte Carlo products (or one realisation's).

Talks to the service over HTTP with a user token:

* the service: ``--url``, or the global ``--server`` / ``MAPCAMPAIGN_SERVER`` (see ``mapcampaign/cli/_client.py``);
* the token: the global ``--token`` / ``MAPCAMPAIGN_TOKEN``, or the file ``--token-file`` /
  ``MAPCAMPAIGN_TOKEN_FILE``, or the embedded default ``<data dir>/tokens/local-user.token``.

Files (``--format``, into ``--out``, default ``./campaign-ID-products``; each written to a temporary
file and renamed):

* ``fits``: ``spectra.fits`` (binary table: per bin mean and scatter of TT, EE, BB, TE, EB, TB, and
  N_l or F_l), ``mean_map.fits``, ``variance_map.fits``, ``mask.fits`` (HEALPix, ``healpy.read_map``);
* ``npz``: the same as numpy ``.npz`` archives;
* ``json``: ``spectra.json`` only (the summary of ``GET /campaigns/ID/products``); maps come as fits or npz.

With ``--realization N``: that realisation's binned spectra, its map and its mask.

Exit status: 0 downloaded; 1 nothing to download (no products yet, the realisation did not succeed, the
campaign is not found) or the service cannot be reached; 2 bad usage. ``--json`` prints only JSON on
stdout: what was downloaded, with each file's path, size and sha256, and the summary.
"""

from __future__ import annotations

import enum
import hashlib
import json
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from mapcampaign.cli._utilities import fail
from schemas.files import atomic_write


class Format(str, enum.Enum):
    fits = "fits"
    npz = "npz"
    json = "json"


def _connection(url: str | None, token_file: Path | None) -> tuple[str, str]:
    from mapcampaign.cli._client import server_url, user_token

    return server_url(url), user_token(token_file)


def _answer_error(answer: Any, what: str) -> None:
    try:
        detail = answer.json().get("detail", answer.text)
    except ValueError:
        detail = answer.text
    code = 2 if answer.status_code in (401, 403, 422) else 1
    hint = {
        401: "the token is unknown or revoked",
        403: "use a user token, not a worker token",
    }.get(answer.status_code)
    fail(f"{what}: {detail} (HTTP {answer.status_code})", hint=hint, code=code)


def _save(client: Any, path: str, params: dict[str, str], target: Path) -> dict[str, Any]:
    """Stream one download to ``target``, whole or not at all; return its record."""
    # The checksum is taken from the bytes as they are written, so the file is not read back.
    digest = hashlib.sha256()
    size = 0
    with client.stream("GET", path, params=params) as answer:
        if answer.status_code != 200:
            answer.read()
            _answer_error(answer, f"GET {path}")

        def write(handle: IO[bytes]) -> None:
            nonlocal size
            for block in answer.iter_bytes():
                digest.update(block)
                size += len(block)
                handle.write(block)

        atomic_write(target, write)
    return {"name": target.name, "path": str(target), "size_bytes": size, "sha256": digest.hexdigest()}


def products(
    campaign_id: Annotated[int, typer.Argument(min=1, help="Campaign id")],
    format: Annotated[Format, typer.Option("--format", "-f", help="fits, npz or json (spectra only)")] = Format.fits,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write into (default ./campaign-ID-products)")
    ] = None,
    realization: Annotated[
        int | None, typer.Option("--realization", "-r", min=0, help="One realisation's spectra, map and mask")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout")] = False,
    url: Annotated[str | None, typer.Option("--url", help="Service root URL (default: the global --server)")] = None,
    token_file: Annotated[Path | None, typer.Option("--token-file", help="File holding a user API token")] = None,
) -> None:
    """Download a campaign's Monte Carlo products: mean and scatter of the spectra with the noise bias or the
    transfer function, the mean and variance maps and the mask."""
    import httpx

    target = out or Path(f"campaign-{campaign_id}-products")
    if target.exists() and not target.is_dir():
        fail(f"--out {target} exists and is not a folder", code=2)
    base, token = _connection(url, token_file)
    api = f"{base}/api/v1/campaigns/{campaign_id}/products"
    files: list[dict[str, Any]] = []
    fmt = format.value
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:
            if realization is not None:
                answer = client.get(f"{api}/realizations/{realization}/spectra")
                if answer.status_code != 200:
                    _answer_error(answer, f"realisation {realization} of campaign {campaign_id}")
                summary = answer.json()
                target.mkdir(parents=True, exist_ok=True)
                prefix = f"r{realization}_"
                files.append(
                    _save(
                        client,
                        f"{api}/realizations/{realization}/spectra",
                        {"format": fmt},
                        target / f"{prefix}spectra.{fmt}",
                    )
                )
                if fmt != "json":
                    for item, name in (("map", "map_iqu"), ("mask", "mask")):
                        files.append(
                            _save(
                                client,
                                f"{api}/realizations/{realization}/{item}",
                                {"format": fmt},
                                target / f"{prefix}{name}.{fmt}",
                            )
                        )
            else:
                answer = client.get(api)
                if answer.status_code != 200:
                    _answer_error(answer, f"campaign {campaign_id}")
                summary = answer.json()
                if not summary["ready"]:
                    fail(
                        f"campaign {campaign_id} has no Monte Carlo products yet: "
                        f"{summary['succeeded']} realisation(s) succeeded, campaign {summary['campaign_state']}",
                        hint="products appear as realisations succeed; "
                        + (
                            "this campaign ended without any"
                            if summary["campaign_state"] in ("failed", "cancelled")
                            else "try again later"
                        ),
                    )
                target.mkdir(parents=True, exist_ok=True)
                downloads = summary["downloads"]
                wanted = [("spectra", "spectra")]
                if fmt != "json":
                    wanted += [("mean_map", "mean_map"), ("variance_map", "variance_map"), ("mask", "mask")]
                for key, name in wanted:
                    if downloads.get(key):
                        files.append(_save(client, base + downloads[key], {"format": fmt}, target / f"{name}.{fmt}"))
    except httpx.HTTPError as error:
        fail(f"cannot reach the service at {base}: {error}", hint="is `mapcampaign serve` running? set --url")
    report = {
        "campaign_id": campaign_id,
        "realization": realization,
        "format": fmt,
        "out": str(target),
        "files": files,
        "summary": summary,
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    typer.echo(_describe(report))


def _describe(report: dict[str, Any]) -> str:
    summary = report["summary"]
    lines = []
    if report["realization"] is None:
        lines.append(
            f"campaign {report['campaign_id']} ({summary['kind']}, {summary['campaign_state']}): "
            f"{summary['included']} of {summary['succeeded']} succeeded realisation(s) in the aggregates"
        )
        bins = summary.get("bins")
        for key, label in (("noise_bias", "N_l TT (uK^2)"), ("transfer_function", "F_l TT")):
            block = summary.get(key)
            if block and bins:
                values = block["spectra"]["TT"]["value"]
                scale = 1e12 if key == "noise_bias" else 1.0
                shown = ", ".join(
                    f"{lo}-{hi}: {'n/a' if v is None else format(v * scale, '.4g')}"
                    for lo, hi, v in zip(bins["ell_min"], bins["ell_max"], values, strict=True)
                )
                lines.append(f"{label} by ell bin: {shown}")
    else:
        lines.append(f"realisation {report['realization']} of campaign {report['campaign_id']}")
    for record in report["files"]:
        lines.append(f"  {record['path']}  ({record['size_bytes']} bytes)")
    return "\n".join(lines)
