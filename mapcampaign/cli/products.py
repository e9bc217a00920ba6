"""``mapcampaign products ID``: download a campaign's Monte Carlo products (or one realisation's).

Talks to the service over HTTP with a user token:

* the service: ``--url``, or the global ``--server`` / ``MAPCAMPAIGN_SERVER`` (see ``mapcampaign/cli/_client.py``);
* the token: the global ``--token`` / ``MAPCAMPAIGN_TOKEN``, or the file ``--token-file`` /
  ``MAPCAMPAIGN_TOKEN_FILE``, or the embedded default ``<data dir>/tokens/local-user.token``.

Files (``--format``, into ``--out``, default ``./campaign-ID-products``; each written to a temporary
file and renamed):

* ``fits``: ``bandpowers.fits`` (the decoupled bandpowers: table BANDPOWERS with the mean, its error, the
  model, the transfer function F_b or the noise bias N_b; image COVARIANCE for a signal+noise campaign),
  ``spectra.fits`` (binary table: per bin mean and scatter of the pseudo-spectra TT, EE, BB, TE, EB, TB,
  and the pseudo-C_l N_l or F_l), ``mean_map.fits``, ``variance_map.fits``, ``mask.fits`` (HEALPix,
  ``healpy.read_map``);
* ``npz``: the same as numpy ``.npz`` archives;
* ``json``: ``bandpowers.json`` and ``spectra.json`` only; maps come as fits or npz.

Printed: the transfer function F_b (signal-only) or the noise bias N_b (noise-only) of TT, EE and BB by
bandpower bin, with a ``*`` on the bins not to be trusted (above 2 nside; F_b poorly determined).

With ``--realization N``: that realisation's binned spectra, its map and its mask.

Exit status: 0 downloaded; 1 nothing to download (no products yet, the realisation did not succeed) or the
service cannot be reached; 2 bad usage (no such campaign of yours, a bad token or option). ``--json`` prints only JSON on
stdout: what was downloaded, with each file's path, size and sha256, and the summary.
"""

from __future__ import annotations

import enum
import hashlib
import json
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from campaignlib.transport import retry_after_s
from mapcampaign.cli._utilities import fail
from schemas.files import atomic_write

if TYPE_CHECKING:
    import numpy as np


class Format(str, enum.Enum):
    fits = "fits"
    npz = "npz"
    json = "json"


def _connection(url: str | None, token_file: Path | None) -> tuple[str, str]:
    from mapcampaign.cli._client import server_url, user_token

    return server_url(url), user_token(token_file)


def _answer_error(answer: Any, what: str, *, campaign: bool = False) -> None:
    """Exit on a refused download: 2 for bad usage (the token, the campaign id: ``campaign`` says the request
    named only the campaign, so a 404 means there is no such campaign of the user's); 1 for what is not
    there yet."""
    try:
        detail = answer.json().get("detail", answer.text)
    except ValueError:
        detail = answer.text
    code = 2 if answer.status_code in (401, 403, 422) or (campaign and answer.status_code == 404) else 1
    hint = {
        401: "the token is unknown or revoked",
        403: "use a user token, not a worker token",
        404: "no such campaign of yours: `mapcampaign list` shows them"
        if campaign
        else "`mapcampaign status ID` shows which realisations succeeded",
    }.get(answer.status_code)
    fail(f"{what}: {detail} (HTTP {answer.status_code})", hint=hint, code=code)


def _save(client: Any, path: str, params: dict[str, str], target: Path, *, wait_s: float = 0.0) -> dict[str, Any]:
    """Stream one download to ``target``, whole or not at all; return its record. A 202 (a map kept at its
    site, being fetched) is asked again after its Retry-After, for up to ``wait_s`` seconds."""
    # The checksum is taken from the bytes as they are written, so the file is not read back.
    digest = hashlib.sha256()
    size = 0
    deadline = time.monotonic() + wait_s
    while True:
        with client.stream("GET", path, params=params) as answer:
            if answer.status_code != 202:
                break
            answer.read()
            pause = retry_after_s(answer)
        if time.monotonic() + pause > deadline:
            fail(f"GET {path}: {answer.json().get('detail')}", hint="the site has not sent it yet; try again later or "
                 "raise --wait-s")  # fmt: skip
        time.sleep(pause)
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
    wait_s: Annotated[
        float, typer.Option("--wait-s", min=0, help="How long to wait for a realisation map kept at its site")
    ] = 300.0,
) -> None:
    """Download a campaign's Monte Carlo products: the decoupled bandpowers with the transfer function F_b, the
    noise bias N_b or the covariance; the pseudo-spectra; the mean and variance maps and the mask."""
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
                                wait_s=wait_s,
                            )
                        )
            else:
                answer = client.get(api)
                if answer.status_code != 200:
                    _answer_error(answer, f"campaign {campaign_id}", campaign=True)
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
                wanted = [("bandpowers", "bandpowers"), ("spectra", "spectra")]
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


def _corrections(bandpowers: dict[str, Any]) -> list[str]:
    """The table of F_b (signal-only) or N_b (noise-only) of TT, EE, BB by bandpower bin, unreliable bins marked."""
    import numpy as np  # here, not at the top: `mapcampaign --help` loads no numpy (tests/unit/test_import_weight.py)

    from campaignlib.montecarlo import transfer_unreliable

    bins = bandpowers["bins"]
    names = ("TT", "EE", "BB")
    transfer = bool(bandpowers.get("transfer_function"))
    if transfer:
        block, label, scale = bandpowers["transfer_function"], "transfer function F_b (<C_b> = F_b B_b^2 C_b^in)", 1.0
    elif bandpowers.get("noise_bias"):
        block, label, scale = bandpowers["noise_bias"], "noise bias N_b (C_b, uK^2)", 1e12
    else:
        return []

    def column(name: str, key: str) -> np.ndarray:
        values = block[name][key] or [None] * len(bins["ell_lo"])
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

    above = ~np.array(bins["reliable"], dtype=bool)
    flags = {name: above.copy() for name in names}
    if transfer:
        flags = {
            name: transfer_unreliable(column(name, "value"), column(name, "error"), bins["reliable"]) for name in names
        }
    lines = [
        f"{label} over {bandpowers['n']} realisation(s), value ± Monte Carlo error; * unreliable "
        + ("(above 2 nside, or poorly determined: error > 20%)" if transfer else "(above 2 nside)")
    ]
    lines.append(f"{'ell':>11}  " + "  ".join(f"{name:>20}" for name in names))
    for b, (lo, hi) in enumerate(zip(bins["ell_lo"], bins["ell_hi"], strict=True)):
        cells = []
        for name in names:
            value, error = column(name, "value")[b] * scale, column(name, "error")[b] * scale
            cell = (
                "n/a"
                if not np.isfinite(value)
                else f"{value:.4g}" + ("" if not np.isfinite(error) else f" ± {error:.2g}")
            )
            cells.append(cell + ("*" if flags[name][b] else " "))
        lines.append(f"{lo:>5}-{hi:<5}  " + "  ".join(f"{cell:>20}" for cell in cells))
    return lines


def _describe(report: dict[str, Any]) -> str:
    summary = report["summary"]
    lines = []
    if report["realization"] is None:
        lines.append(
            f"campaign {report['campaign_id']} ({summary['kind']}, {summary['campaign_state']}): "
            f"{summary['included']} of {summary['succeeded']} succeeded realisation(s) in the aggregates"
        )
        if summary.get("bandpowers"):
            lines.extend(_corrections(summary["bandpowers"]))
    else:
        lines.append(f"realisation {report['realization']} of campaign {report['campaign_id']}")
    for record in report["files"]:
        lines.append(f"  {record['path']}  ({record['size_bytes']} bytes)")
    return "\n".join(lines)
