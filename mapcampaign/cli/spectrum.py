"""``mapcampaign spectrum MAP.fits --transfer ID --noise ID [--covariance ID]``: a data map's unbiased bandpowers.

The service computes the map's decoupled bandpowers on the campaigns' mask and returns
``(C_b - N_b) / F_b`` (``POST /api/v1/spectrum``), with errors from the covariance campaign. With
``--transfer-e ID --transfer-b ID`` (a pure-E and a pure-B campaign) instead of ``--transfer``, EE and BB are
corrected by the inverse E/B transfer matrix (TT and TE by the pure-E campaign's F_b), and the matrix's own
Monte Carlo error is printed beside the covariance's as ``(+e)``. Printed as
D_b = l(l + 1) C_b / 2 pi in uK^2 at the bin centres, of the sky through the beam (the beam is not
deconvolved); ``*`` marks the bins where F_b is not to be trusted (above 2 nside, or poorly determined:
``schemas.montecarlo.transfer_unreliable``), and a warning on stderr lists them. ``--json`` prints the
service's answer (C_b in K^2). A map of fewer than three fields (I only) is refused before it is sent.

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
    noise: Annotated[int, typer.Option("--noise", min=1, metavar="ID", help="Noise-only campaign: N_b")],
    transfer: Annotated[
        int | None,
        typer.Option("--transfer", min=1, metavar="ID", help="Signal-only campaign: F_b (or --transfer-e and -b)"),
    ] = None,
    transfer_e: Annotated[
        int | None,
        typer.Option("--transfer-e", min=1, metavar="ID", help="Pure-E campaign of the E/B transfer matrix"),
    ] = None,
    transfer_b: Annotated[
        int | None,
        typer.Option("--transfer-b", min=1, metavar="ID", help="Pure-B campaign of the E/B transfer matrix"),
    ] = None,
    covariance: Annotated[
        int | None,
        typer.Option("--covariance", min=1, metavar="ID", help="Signal+noise campaign: the errors (optional)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (for scripts)")] = False,
) -> None:
    """Unbiased bandpowers (C_b - N_b) / F_b of a data map, from a transfer, a noise and (for errors) a
    covariance campaign that share the map's pointing, mask and binning; with --transfer-e and --transfer-b
    (pure-E and pure-B campaigns) instead of --transfer, EE and BB corrected by the inverse E/B transfer matrix."""
    from mapcampaign.client import iqu_map_problem

    pair = (transfer_e is not None, transfer_b is not None)
    if transfer is not None and any(pair):
        fail("give --transfer (F_b) or --transfer-e and --transfer-b (the E/B transfer matrix), not both", code=2)
    if transfer is None and not all(pair):
        fail("give --transfer ID, or --transfer-e ID and --transfer-b ID (a pure-E and a pure-B campaign)", code=2)

    try:
        payload = map_file.read_bytes()
    except OSError as unreadable:
        fail(f"cannot read {map_file}: {unreadable.strerror or unreadable}", code=2)
    problem = iqu_map_problem(payload, str(map_file))
    if problem is not None:
        fail(problem, code=2)
    given = {"transfer": transfer, "transfer_e": transfer_e, "transfer_b": transfer_b, "covariance": covariance}
    params: dict[str, Any] = {"noise": noise, **{name: value for name, value in given.items() if value is not None}}
    # The service computes the map's bandpowers while the request waits: seconds at nside 256, more above.
    with ApiClient(timeout=900.0) as client:
        answer = client.request(
            "POST", "/spectrum", params=params, content=payload, headers={"Content-Type": "application/fits"}
        ).json()
    if as_json:
        print_json(answer)
        return
    errors = answer.get("error") or {}
    matrix_errors = answer.get("error_matrix") or {}
    by_matrix = ("EE", "BB") if answer.get("correction") == "transfer-matrix" else ()
    correction = (
        f"transfer campaign {transfer}"
        if not by_matrix
        else f"E/B transfer matrix of campaigns {transfer_e} (pure E) and {transfer_b} (pure B) for EE, BB"
    )
    typer.echo(
        f"spectrum of {map_file.name}: {correction}, noise campaign {noise}, "
        + (f"covariance campaign {covariance} (n = {answer['covariance_n']})" if covariance else "no errors")
    )
    if by_matrix:
        typer.echo("EE and BB: the covariance's error, then (+) the matrix's own Monte Carlo error")
    typer.echo(
        f"removed: monopole {answer['monopole_k'] * 1e6:.4g} uK; D_b in uK^2 of the sky through the beam "
        "(the beam is not deconvolved: divide by B_b^2); C_b in K^2 with --json"
    )
    bins = answer["bins"]
    unreliable = {
        # EE and BB corrected by the matrix do not divide by F_b: only the bins above 2 nside are marked
        name: [not r for r in bins["reliable"]]
        if name in by_matrix
        else _unreliable(answer["transfer_function"][name], bins["reliable"])
        for name in SHOWN
    }
    width = 31 if by_matrix else 21
    typer.echo(f"{'ell':>11}  " + "  ".join(f"{name:>{width}}" for name in SHOWN))
    for b, (lo, hi) in enumerate(zip(bins["ell_lo"], bins["ell_hi"], strict=True)):
        ell = bins["ell_center"][b]
        cells = []
        for name in SHOWN:
            error = errors.get(name)
            cell = _cell(_d_ell(ell, answer["cb"][name][b]), None if not error else _d_ell(ell, error[b]))
            matrix_error = matrix_errors.get(name) if name in by_matrix else None
            if matrix_error and matrix_error[b] is not None and answer["cb"][name][b] is not None:
                cell += f" (+{_d_ell(ell, matrix_error[b]):.2g})"
            cells.append(cell + ("*" if unreliable[name][b] else " "))
        flag = "" if bins["reliable"][b] else "  (above 2 nside)"
        typer.echo(f"{lo:>5}-{hi:<5}  " + "  ".join(f"{cell:>{width}}" for cell in cells) + flag)
    poorly = [
        f"{name} {bins['ell_lo'][b]}-{bins['ell_hi'][b]}"
        for name in SHOWN
        for b in range(len(bins["ell_lo"]))
        if unreliable[name][b] and bins["reliable"][b]
    ]
    if poorly:
        from schemas.montecarlo import POORLY_DETERMINED

        typer.echo(
            f"warning: * marks bins where F_b is poorly determined (Monte Carlo error above "
            f"{POORLY_DETERMINED:.0%} of F_b) or above 2 nside; dividing by it is not to be trusted: "
            + ", ".join(poorly)
            + f" (more realisations of campaign {transfer if transfer is not None else transfer_e} narrow F_b)",
            err=True,
        )


def _unreliable(transfer: dict[str, Any], reliable: list[bool]) -> list[bool]:
    """The bins where the answer's F_b is not to be trusted (``schemas.montecarlo.transfer_unreliable``)."""
    import numpy as np

    from schemas.montecarlo import transfer_unreliable

    def column(values: list[float | None] | None) -> np.ndarray:
        values = values or [None] * len(reliable)
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

    value = column(transfer["value"])
    flagged = transfer_unreliable(value, column(transfer.get("error")), np.array(reliable, dtype=bool))
    # TE, EB, TB: F_b is undefined where the model is zero, which the table shows as "-" already
    return [bool(f) and bool(np.isfinite(v)) or not r for f, v, r in zip(flagged, value, reliable, strict=True)]
