"""``mapcampaign spectrum MAP.fits --transfer ID --noise ID [--covariance ID]``: a data map's unbiased bandpowers.

The service computes the map's decoupled bandpowers on the campaigns' mask and returns
``(C_b - N_b) / F_b`` (``POST /api/v1/spectrum``), with errors from the covariance campaign. Printed as
D_b = l(l + 1) C_b / 2 pi in uK^2 at the bin centres; ``--json`` prints the service's answer (C_b in K^2).

Exit status: 0 done; 2 bad usage or a refused combination (a campaign of the wrong kind, another scan key,
mask or binning than the others, a map of another nside: the message names what differs), an unknown
campaign or one without bandpowers yet; 1 the service cannot be reached or failed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from mapcampaign.cli._client import ApiClient, print_json
from mapcampaign.cli._utilities import fail

CampaignOption = Annotated[int, typer.Option(min=1, metavar="ID")]
SHOWN = ("TT", "EE", "BB", "TE")


def _d_ell(ell: float, value: float | None) -> float | None:
    """D_l = l(l + 1) C_l / 2 pi in uK^2 from C_l in K^2."""
    return None if value is None else ell * (ell + 1) * value / (2 * math.pi) * 1e12


def _cell(value: float | None, error: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if error is None else f"{value:.4g} ± {error:.2g}"


def spectrum(
    map_file: Annotated[
        Path, typer.Argument(metavar="MAP.fits", help="HEALPix FITS map: I, Q, U in K (RING, the campaigns' nside)")
    ],
    transfer: Annotated[int, typer.Option("--transfer", min=1, metavar="ID", help="Signal-only campaign: F_b")],
    noise: Annotated[int, typer.Option("--noise", min=1, metavar="ID", help="Noise-only campaign: N_b")],
    covariance: Annotated[
        int | None,
        typer.Option("--covariance", min=1, metavar="ID", help="Signal+noise campaign: the errors (optional)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (for scripts)")] = False,
) -> None:
    """Unbiased bandpowers (C_b - N_b) / F_b of a data map, from a transfer, a noise and (for errors) a
    covariance campaign that share the map's pointing, mask and binning."""
    try:
        payload = map_file.read_bytes()
    except OSError as unreadable:
        fail(f"cannot read {map_file}: {unreadable.strerror or unreadable}", code=2)
    params: dict[str, Any] = {"transfer": transfer, "noise": noise}
    if covariance is not None:
        params["covariance"] = covariance
    # The service computes the map's bandpowers while the request waits: seconds at nside 256, more above.
    with ApiClient(timeout=900.0) as client:
        answer = client.request(
            "POST", "/spectrum", params=params, content=payload, headers={"Content-Type": "application/fits"}
        ).json()
    if as_json:
        print_json(answer)
        return
    errors = answer.get("error") or {}
    typer.echo(
        f"spectrum of {map_file.name}: transfer campaign {transfer}, noise campaign {noise}, "
        + (f"covariance campaign {covariance} (n = {answer['covariance_n']})" if covariance else "no errors")
    )
    typer.echo(f"removed: monopole {answer['monopole_k'] * 1e6:.4g} uK; D_b in uK^2 (C_b in K^2 with --json)")
    bins = answer["bins"]
    header = f"{'ell':>11}  " + "  ".join(f"{name:>20}" for name in SHOWN)
    typer.echo(header)
    for b, (lo, hi) in enumerate(zip(bins["ell_lo"], bins["ell_hi"], strict=True)):
        ell = bins["ell_center"][b]
        cells = []
        for name in SHOWN:
            error = errors.get(name)
            cells.append(_cell(_d_ell(ell, answer["cb"][name][b]), None if not error else _d_ell(ell, error[b])))
        flag = "" if bins["reliable"][b] else "  (above 2 nside)"
        typer.echo(f"{lo:>5}-{hi:<5}  " + "  ".join(f"{cell:>20}" for cell in cells) + flag)
