"""The typed Python client of the campaign service (REST under ``/api/v1``).

::

    import mapcampaign

    client = mapcampaign.Client()                  # the same server and token as the CLI
    campaign = client.submit("campaign.toml")      # a file, a dict or a schemas.spec.CampaignSpec
    for detail in client.watch(campaign.id):       # progress as it changes, until the campaign ends
        print(detail.state, detail.progress.counts)
    final = client.wait(campaign.id, timeout=3600) # or block; raises errors.WaitTimeout
    iqu = client.realization_map(campaign.id, 0)   # numpy [3, npix] (K), RING, healpy.UNSEEN where unobserved
    products = client.products(campaign.id)        # numpy arrays per ell bin

Answers are the models of :mod:`schemas.api`; failures raise :mod:`mapcampaign.errors`.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from os import PathLike
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Self, TypeVar

import httpx
from pydantic import BaseModel

from campaignlib import transport as shared_transport
from mapcampaign import _connection
from mapcampaign._events import CampaignEvents
from mapcampaign.errors import ApiError, InvalidRequest, ServiceUnavailable, WaitTimeout, api_error
from schemas.api import (
    IDEMPOTENCY_KEY_HEADER,
    INSTRUMENT_MEDIA_TYPES,
    CampaignDetail,
    CampaignPage,
    CampaignSummary,
    CouplingInfo,
    CouplingPage,
    InstrumentFile,
    InstrumentFileKind,
    PlanInfo,
    PlanPage,
    RealizationDetail,
    RealizationPage,
    RetryAnswer,
)
from schemas.files import atomic_write
from schemas.io import SpecError, load_spec, spec_from_data
from schemas.products import DataSpectrum, ProductsSummary, TransferMatrix
from schemas.spec import CampaignKind, CampaignSpec
from schemas.states import FINISHED_CAMPAIGN_STATES, CampaignState, PlanState, RealizationState

if TYPE_CHECKING:
    import numpy as np

    from mapcampaign.products import Products

Model = TypeVar("Model", bound=BaseModel)


def upload_kind(path: Path) -> InstrumentFileKind:
    """The kind of an instrument file from its name: ``.h5`` / ``.hdf5`` a focal plane; a schedule must be named."""
    if path.suffix.lower() in (".h5", ".hdf5"):
        return "focal-plane"
    raise ValueError(f"{path.name}: say which schedule it is (kind 'ground-schedule' or 'satellite-schedule')")


SpecSource = str | PathLike[str] | Mapping[str, Any] | CampaignSpec

PAGE_SIZE = 500  # the service's largest page of campaigns and plans
# With the event stream up, events wake the watcher at once; it reads the campaign this often regardless.
STREAM_SAFETY_POLL_S = 10.0
CONNECT_WAIT_S = 5.0  # how long watch() waits for the stream before it starts polling
# Where watch() and wait() stop: the campaign ended, or it is held (fail fast) and waits for its owner.
STOPPED_STATES = (*FINISHED_CAMPAIGN_STATES, CampaignState.HELD)


class Client:
    """A user's connection to the service.

    ``server`` and ``token`` default as for the CLI: ``MAPCAMPAIGN_SERVER``, a running ``mapcampaign up``,
    ``http://MAPCAMPAIGN_HOST:MAPCAMPAIGN_PORT``; ``MAPCAMPAIGN_TOKEN``, ``MAPCAMPAIGN_TOKEN_FILE``,
    ``<data dir>/tokens/local-user.token`` (see :mod:`mapcampaign._connection`). ``timeout`` is seconds
    per request. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.server = _connection.server_url(server)
        self._http = shared_transport.http_client(
            self.server + _connection.API_PREFIX,
            _connection.user_token(token),
            timeout_s=timeout,
            user_agent="mapcampaign-client",
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"mapcampaign.Client(server={self.server!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ campaigns

    def submit(self, spec: SpecSource, *, idempotency_key: str | None = None, new: bool = False) -> CampaignDetail:
        """Validate ``spec`` here (a TOML/YAML/JSON file, a mapping or a CampaignSpec), then create its campaign.

        A spec that does not validate raises :class:`~mapcampaign.errors.InvalidRequest` with the field paths,
        before anything is sent; a file that does not exist raises :class:`FileNotFoundError`. Submitting
        again with the same ``idempotency_key`` and spec returns the campaign made the first time instead of a
        second one. A file is its own key by default, as for ``mapcampaign submit``: the same file submitted
        again, from here or from the command line, gives back its campaign; ``new=True`` makes another.
        """
        model = campaign_spec(spec)
        for note in spec_notes(model):
            warnings.warn(note, UserWarning, stacklevel=2)
        if idempotency_key is None and not new and isinstance(spec, (str, PathLike)):
            idempotency_key = spec_file_key(Path(spec).read_bytes())
        headers = {IDEMPOTENCY_KEY_HEADER: idempotency_key} if idempotency_key else None
        answer = self._request("POST", "/campaigns", json=model.model_dump(mode="json"), headers=headers)
        return CampaignDetail.model_validate_json(answer.content)

    def get(self, campaign_id: int) -> CampaignDetail:
        """The campaign with its spec and progress."""
        return self._get(f"/campaigns/{campaign_id}", CampaignDetail)

    def list(
        self,
        state: CampaignState | str | None = None,
        name: str | None = None,
        *,
        kind: CampaignKind | None = None,
        limit: int | None = None,
    ) -> builtins.list[CampaignSummary]:
        """This user's campaigns, newest first: every page of them, or the first ``limit``.

        ``state`` keeps those in that state; ``name`` those whose name holds it (any case).
        """
        params = {"state": _value(state), "name": name, "kind": _value(kind)}
        return self._pages("/campaigns", params, CampaignPage, limit)

    def cancel(self, campaign_id: int, reason: str | None = None) -> CampaignDetail:
        """Cancel every unfinished realisation; raises :class:`~mapcampaign.errors.Conflict` when it has ended."""
        body = {"reason": reason} if reason is not None else None
        answer = self._request("POST", f"/campaigns/{campaign_id}/cancel", json=body)
        return CampaignDetail.model_validate_json(answer.content)

    def retry(self, campaign_id: int) -> RetryAnswer:
        """Queue the failed realisations again with a fresh attempt budget; release a held campaign."""
        answer = self._request("POST", f"/campaigns/{campaign_id}/retry")
        return RetryAnswer.model_validate_json(answer.content)

    def extend(self, campaign_id: int, realizations: int) -> CampaignDetail:
        """Add ``realizations`` more to the campaign (running or finished, not cancelled).

        They take the indices after the last, so their seeds differ from every earlier one's; their results
        go into the same aggregates, and they use the campaign's plan.
        """
        answer = self._request("POST", f"/campaigns/{campaign_id}/extend", json={"realizations": realizations})
        return CampaignDetail.model_validate_json(answer.content)

    def clone(
        self, campaign_id: int, changes: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None
    ) -> CampaignDetail:
        """A new campaign from this one's spec with ``changes`` merged in (a partial spec, tables merged key by
        key), e.g. ``{"pixelization": {"nside": 128}}``; see :func:`changes_from_assignments` for ``a.b=v``.

        A change that does not validate raises :class:`~mapcampaign.errors.InvalidRequest` naming
        ``changes.<field path>``.
        """
        headers = {IDEMPOTENCY_KEY_HEADER: idempotency_key} if idempotency_key else None
        answer = self._request(
            "POST", f"/campaigns/{campaign_id}/clone", json={"changes": dict(changes or {})}, headers=headers
        )
        return CampaignDetail.model_validate_json(answer.content)

    def delete(self, campaign_id: int) -> None:
        """Delete a finished campaign with its realisations and files (cancel a running one first)."""
        self._request("DELETE", f"/campaigns/{campaign_id}", expected=(204,))

    # ------------------------------------------------------------------ progress

    def watch(self, campaign_id: int, *, poll_s: float = 2.0) -> Iterator[CampaignDetail]:
        """The campaign now, then again each time its state or counts change, ending with its finished (or held)
        state.

        Driven by the service's event stream; while the stream is down the campaign is read every
        ``poll_s`` seconds. Leaving the loop early is fine: the stream is closed.
        """
        return self._follow(campaign_id, poll_s=poll_s, deadline=None)

    def wait(self, campaign_id: int, timeout: float | None = None, *, poll_s: float = 2.0) -> CampaignDetail:
        """Block until the campaign is finished, or held (fail fast: its ``failure_cause`` says why; ``retry``
        releases it), and return it; after ``timeout`` seconds raise :class:`~mapcampaign.errors.WaitTimeout`
        (a ``TimeoutError``) carrying its last status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        detail: CampaignDetail | None = None
        for detail in self._follow(campaign_id, poll_s=poll_s, deadline=deadline):
            pass
        if detail is None or detail.state not in STOPPED_STATES:
            raise WaitTimeout(campaign_id, timeout or 0.0, detail)
        return detail

    def _follow(self, campaign_id: int, *, poll_s: float, deadline: float | None) -> Iterator[CampaignDetail]:
        """Details of the campaign as they change; stops when it is finished or at ``deadline`` (monotonic s)."""

        def remaining(seconds: float) -> float:
            return seconds if deadline is None else max(0.0, min(seconds, deadline - time.monotonic()))

        detail = self.get(campaign_id)  # an unknown campaign raises before any thread starts
        yield detail
        if detail.state in STOPPED_STATES:
            return
        shown = _progress_key(detail)
        with CampaignEvents(self._http, campaign_id) as events:
            # Read again once the stream is open (or failed), so that no change in between goes unseen.
            events.wait(remaining(CONNECT_WAIT_S))
            while True:
                detail = self.get(campaign_id)
                if _progress_key(detail) != shown:
                    shown = _progress_key(detail)
                    yield detail
                if detail.state in STOPPED_STATES:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                events.wait(remaining(STREAM_SAFETY_POLL_S if events.connected.is_set() else poll_s))

    # ------------------------------------------------------------------ realisations

    def realization(self, campaign_id: int, index: int) -> RealizationDetail:
        """One realisation with its result and every attempt (worker, host, exit code, log tail)."""
        return self._get(f"/campaigns/{campaign_id}/realizations/{index}", RealizationDetail)

    def logs(self, campaign_id: int, realization: int | None = None) -> builtins.list[RealizationDetail]:
        """The attempts with their log tails: of realisation ``realization``, or of every failed realisation."""
        if realization is not None:
            return [self.realization(campaign_id, realization)]
        failed = self._pages(
            f"/campaigns/{campaign_id}/realizations", {"state": RealizationState.FAILED.value}, RealizationPage, None
        )
        return [self.realization(campaign_id, item.index) for item in failed]

    def realization_map(self, campaign_id: int, index: int, *, wait_s: float = 300.0) -> np.ndarray:
        """The I, Q, U map of a realisation: float64 [3, npix] (K), RING order, healpy.UNSEEN where the
        scan never looked. Read with healpy from the FITS file the worker stored or its site keeps.

        A map kept at a site the service cannot read is fetched through the site's worker: the service
        answers 202 meanwhile, and this asks again after its Retry-After for up to ``wait_s`` seconds
        (then :class:`~mapcampaign.errors.ServiceUnavailable`); a map the site cannot send (gone, damaged)
        is a :class:`~mapcampaign.errors.NotFound` naming the reason.
        """
        import io
        import time

        # Deferred: healpy (with numpy and astropy) takes seconds to import, and only this method needs it.
        import healpy as hp
        import numpy as np
        from astropy.io import fits

        path = f"/campaigns/{campaign_id}/products/realizations/{index}/map"
        deadline = time.monotonic() + wait_s
        while (answer := self._request("GET", path, params={"format": "fits"}, expected=(200, 202))).status_code == 202:
            pause = shared_transport.retry_after_s(answer)
            if time.monotonic() + pause > deadline:
                raise ServiceUnavailable(
                    202,
                    "kept_file_pending",
                    f"{answer.json().get('detail')} (waited {wait_s:g} s)",
                    request=f"GET {path}",
                )
            time.sleep(pause)
        with fits.open(io.BytesIO(answer.content)) as hdus:
            iqu = hp.read_map(hdus, field=(0, 1, 2), dtype=np.float64)
        return np.asarray(iqu)

    # ------------------------------------------------------------------ plans and products

    def plans(
        self,
        scan_key: str | None = None,
        site: str | None = None,
        *,
        state: PlanState | str | None = None,
        limit: int | None = None,
    ) -> builtins.list[PlanInfo]:
        """The overlap plans (preprocessing) one's campaigns need (an admin's: every plan), newest first: all, or
        those of a scan key, site or state."""
        plans = self._pages("/plans", {"scan_key": scan_key, "site": site}, PlanPage, None)
        wanted = [plan for plan in plans if state is None or plan.state == _value(state)]
        return wanted if limit is None else wanted[:limit]

    def couplings(self, scan_key: str | None = None, site: str | None = None) -> builtins.list[CouplingInfo]:
        """The bandpowers' mode-coupling files one's campaigns used, newest first: checksum, size, build time, uses."""
        query = {key: value for key, value in {"scan_key": scan_key, "site": site}.items() if value is not None}
        return self._get("/couplings", CouplingPage, query).items

    def products_summary(self, campaign_id: int) -> ProductsSummary:
        """The Monte Carlo products as the service reports them (lists of numbers)."""
        return self._get(f"/campaigns/{campaign_id}/products", ProductsSummary)

    def products(self, campaign_id: int) -> Products:
        """The Monte Carlo products with their per-bin figures as numpy arrays (see :class:`Products`)."""
        # Deferred: numpy is imported only by the methods that answer with arrays (import mapcampaign stays fast).
        from mapcampaign.products import Products

        return Products.from_summary(self.products_summary(campaign_id))

    def upload_instrument_file(
        self, path: str | PathLike[str], *, kind: InstrumentFileKind | None = None, timeout: float = 300.0
    ) -> InstrumentFile:
        """Upload a TOAST focal plane (``kind="focal-plane"``, the default for ``.h5`` / ``.hdf5``) or schedule
        (``"ground-schedule"`` or ``"satellite-schedule"``, ``.ecsv``); the service checks it as a campaign's and
        keeps it once, by its sha256, under its instrument_root. Name it in a spec by the answer's ``file`` and
        ``sha256``. A file that does not check raises :class:`~mapcampaign.errors.InvalidRequest` naming the
        column; the same bytes uploaded again answer the same record."""
        path = Path(path)
        kind = kind or upload_kind(path)
        answer = self._request(
            "POST",
            "/instrument-files",
            params={"kind": kind},
            content=path.read_bytes(),
            headers={"Content-Type": INSTRUMENT_MEDIA_TYPES[kind]},
            timeout=timeout,
        )
        return InstrumentFile.model_validate_json(answer.content)

    def spectrum(
        self,
        map_file: str | PathLike[str],
        *,
        noise: int,
        transfer: int | None = None,
        covariance: int | None = None,
        transfer_e: int | None = None,
        transfer_b: int | None = None,
        timeout: float = 900.0,
    ) -> DataSpectrum:
        """Unbiased bandpowers ``(C_b - N_b) / F_b`` of a HEALPix FITS map (I, Q, U in K) from a signal-only
        ``transfer`` campaign, a noise-only ``noise`` campaign and, for errors, a signal+noise ``covariance``
        campaign. With a pure-E ``transfer_e`` and a pure-B ``transfer_b`` campaign instead of ``transfer``,
        EE, EB, BB are corrected by the inverse of their E/B transfer matrix (``correction`` says which;
        ``error_matrix`` is the matrix's own error). A wrong combination (another scan key, mask or binning; a
        campaign of the wrong kind) raises :class:`~mapcampaign.errors.InvalidRequest` naming the field and what
        differs. ``timeout`` (s): the service computes the map's bandpowers while the request waits (seconds at
        nside 256)."""
        given = {"transfer": transfer, "transfer_e": transfer_e, "transfer_b": transfer_b, "covariance": covariance}
        params = {"noise": noise, **{name: value for name, value in given.items() if value is not None}}
        payload = Path(map_file).read_bytes()
        problem = iqu_map_problem(payload, Path(map_file).name)
        if problem is not None:
            raise InvalidRequest(None, "map_not_iqu", problem, problems=[("body", problem)], request="POST /spectrum")
        answer = self._request(
            "POST",
            "/spectrum",
            params=params,
            content=payload,
            headers={"Content-Type": "application/fits"},
            timeout=timeout,
        )
        return DataSpectrum.model_validate_json(answer.content)

    def transfer_matrix(self, pure_e: int, pure_b: int) -> TransferMatrix:
        """The E/B transfer matrix of a pure-E and a pure-B campaign as it stands: ``matrix`` and ``error``
        ``[n_bins][out][in]`` over (EE, EB, BB); see :class:`schemas.products.TransferMatrix`."""
        answer = self._request("GET", "/transfer-matrix", params={"pure_e": pure_e, "pure_b": pure_b})
        return TransferMatrix.model_validate_json(answer.content)

    def bandpower_covariance(self, campaign_id: int) -> tuple[np.ndarray, int, float]:
        """The bandpower covariance of a signal+noise campaign: ``(cov [6 n_bins, 6 n_bins] K^4, n, hartlap)``,
        spectrum-major (index ``s * n_bins + b``, rows TT EE BB TE EB TB); hartlap is NaN when n <= p + 2."""
        import io

        import numpy as np  # deferred: see products()

        answer = self._request("GET", f"/campaigns/{campaign_id}/products/bandpowers", params={"format": "npz"})
        with np.load(io.BytesIO(answer.content), allow_pickle=False) as stored:
            if "covariance" not in stored.files or str(stored["kind"]) != "signal+noise":
                message = (
                    f"campaign {campaign_id} has no bandpower covariance: it needs a signal+noise campaign "
                    "with two realisations"
                )
                raise InvalidRequest(
                    None,
                    "no_covariance",
                    message,
                    problems=[("", message)],
                    request=f"GET /campaigns/{campaign_id}/products/bandpowers",
                )
            return np.array(stored["covariance"]), int(stored["n"]), float(stored["hartlap"])

    def download_products(
        self, campaign_id: int, out_dir: str | PathLike[str], *, format: Literal["fits", "npz"] = "fits"
    ) -> dict[str, Path]:
        """Save every product file the campaign has now into ``out_dir`` in ``format``, with the names
        ``mapcampaign products`` gives them: ``bandpowers`` (the decoupled bandpowers with the transfer function
        F_b, the noise bias N_b or the covariance), ``spectra`` (pseudo-spectra), ``mean_map``,
        ``variance_map`` and ``mask`` (e.g. ``out_dir/mean_map.fits``); returns the path of each by name.
        Each file is written whole or not at all."""
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        downloads = self.products_summary(campaign_id).downloads
        saved = {}
        for name, path in downloads.model_dump().items():
            if path is None:
                continue
            relative = path.removeprefix(_connection.API_PREFIX)
            target = folder / f"{name}.{format}"
            with self._http.stream("GET", relative, params={"format": format}) as answer:
                if answer.status_code != 200:
                    answer.read()
                    raise _error(answer)
                chunks = answer.iter_bytes()

                def write(handle: IO[bytes], chunks: Iterator[bytes] = chunks) -> None:
                    handle.writelines(chunks)

                atomic_write(target, write)
            saved[name] = target
        return saved

    # ------------------------------------------------------------------ HTTP

    def _request(
        self, method: str, path: str, *, expected: tuple[int, ...] = (200, 201), **kwargs: Any
    ) -> httpx.Response:
        try:
            answer = shared_transport.send(self._http, method, path, **kwargs)
        except shared_transport.Unreachable as error:
            raise ServiceUnavailable(
                None,
                "unreachable",
                f"cannot reach the service at {self.server}: {error.problem}",
                request=f"{method} {path}",
            ) from error
        if answer.status_code not in expected:
            raise _error(answer)
        return answer

    def _get(self, path: str, model: type[Model], params: Mapping[str, Any] | None = None) -> Model:
        return model.model_validate_json(self._request("GET", path, params=params).content)

    def _pages(
        self,
        path: str,
        params: Mapping[str, Any],
        page_model: type[CampaignPage | PlanPage | RealizationPage],
        limit: int | None,
    ) -> builtins.list[Any]:
        """Every item of a paged listing (following ``next_cursor``), or the first ``limit``."""
        items: builtins.list[Any] = []
        query = {key: value for key, value in params.items() if value is not None}
        cursor = None
        while limit is None or len(items) < limit:
            size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(items))
            page = self._get(path, page_model, {**query, "limit": size, **({"cursor": cursor} if cursor else {})})
            items.extend(page.items)
            cursor = page.next_cursor
            if not cursor:
                break
        return items if limit is None else items[:limit]


def changes_from_assignments(assignments: Iterable[str]) -> dict[str, Any]:
    """``["pixelization.nside=128", "name=b"]`` as the nested changes :meth:`Client.clone` takes.

    A value is read as JSON when it parses (``128``, ``true``, ``[1, 2]``, ``"text"``), else kept as text.
    Raises ValueError for an assignment without ``=`` or with an empty key.
    """
    changes: dict[str, Any] = {}
    for assignment in assignments:
        path, separator, raw = assignment.partition("=")
        keys = [key.strip() for key in path.split(".")]
        if not separator or not all(keys):
            raise ValueError(f"{assignment!r}: expected FIELD.PATH=VALUE, e.g. pixelization.nside=128")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        table = changes
        for key in keys[:-1]:
            table = table.setdefault(key, {})
            if not isinstance(table, dict):
                # ValueError like every other malformed assignment: the CLI reports them alike (exit 2).
                raise ValueError(f"{assignment!r}: {key!r} is given a value and sub-fields")  # noqa: TRY004
        table[keys[-1]] = value
    return changes


def iqu_map_problem(payload: bytes, name: str) -> str | None:
    """Why a FITS map cannot give a spectrum before it is sent, or None: the spectrum needs I, Q and U (every
    spectrum but TT needs Q and U), and an I-only map has one field. Anything else is the service's to judge."""
    import io

    from astropy.io import fits

    try:
        with fits.open(io.BytesIO(payload), memmap=False) as hdus:
            tables = [hdu for hdu in hdus if isinstance(hdu, fits.BinTableHDU)]
            if not tables:
                return None
            names = [column.name for column in tables[0].columns if column.name.upper() != "PIXEL"]
    except (OSError, ValueError, TypeError):
        return None
    if len(names) >= 3:
        return None
    return (
        f"{name} holds {len(names)} field(s) ({', '.join(names) or 'none'}): the spectrum needs a HEALPix map of I, "
        "Q and U. For TT alone, write Q and U as zeros: healpy.write_map(path, [i, 0 * i, 0 * i])"
    )


def spec_notes(spec: CampaignSpec) -> builtins.list[str]:
    """What a valid spec holds that the campaign will not use, said before it is submitted."""
    notes = []
    if spec.kind == "noise-only" and "sky" in spec.model_fields_set and spec.sky.kind != "none":
        notes.append(f"sky: a noise-only campaign simulates no sky; the [sky] section ({spec.sky.kind}) is ignored")
    return notes


def spec_file_key(content: bytes) -> str:
    """The idempotency key of a spec file, derived from its bytes: submitting the same file again (from the
    client or the command line) replays its campaign instead of making a second one."""
    return "spec-sha256-" + hashlib.sha256(content).hexdigest()


def campaign_spec(spec: SpecSource) -> CampaignSpec:
    """``spec`` as a validated CampaignSpec; a file or mapping that does not validate raises InvalidRequest,
    a file that does not exist FileNotFoundError."""
    if isinstance(spec, CampaignSpec):
        return spec
    if not isinstance(spec, Mapping) and not Path(spec).is_file():
        raise FileNotFoundError(f"no spec file {spec}")
    try:
        if isinstance(spec, Mapping):
            return spec_from_data(dict(spec))
        return load_spec(Path(spec))
    except SpecError as error:
        raise InvalidRequest(None, "invalid_spec", str(error), problems=error.problems, request=error.source) from None


def _error(answer: httpx.Response) -> ApiError:
    detail, code = shared_transport.error_body(answer)
    body = {"detail": detail, "code": code}
    return api_error(answer.status_code, body, request=f"{answer.request.method} {answer.request.url.path}")


def _value(choice: Any) -> Any:
    """An enum member's value (``CampaignState.RUNNING`` -> ``"running"``); anything else as it is."""
    return getattr(choice, "value", choice)


def _progress_key(detail: CampaignDetail) -> tuple[str, tuple[tuple[str, int], ...]]:
    """What watch() reports a change of: the state and the count of realisations in each state."""
    return str(detail.state), tuple(sorted((str(state), count) for state, count in detail.progress.counts.items()))
