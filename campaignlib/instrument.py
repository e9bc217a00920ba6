"""Focal planes from TOAST files: read, check and select the detectors of a ``Focalplane.save_hdf5`` file.

TOAST 3 writes a focal plane as an astropy table in the HDF5 dataset ``focalplane`` (astropy's own
HDF5 table format, with the column units in its metadata). This module checks the file's layout, storage
and types from its HDF5 metadata first (a user's file is data, never a reference to other data), reads the
rows it needs with h5py in bounded slices, gives them their units from astropy's header, so units are
converted by astropy, not by hand, and turns each selected row into a :class:`schemas.spec.Detector`:

==============  ===========================  ============================================
TOAST column    unit in the file             detector field
==============  ===========================  ============================================
``name``        --                           ``name``
``quat``        -- ([x, y, z, w])            ``quat`` (and the offsets derived from it)
``pol_angle``   angle (or ``psi_pol``)       ``pol_angle_deg`` (described; the quat rules)
``psd_net``     K s^1/2                      ``net_k_sqrt_s``
``psd_fknee``   Hz                           ``f_knee_hz``
``psd_fmin``    Hz                           ``f_min_hz``
``psd_alpha``   --                           ``alpha``
==============  ===========================  ============================================

Columns the campaign does not use (``fwhm``, ``bandcenter``, ``uid``, a collaboration's own ...) are
left alone. A problem is a :class:`FocalPlaneFileError` naming the file and the column; the service
answers it with a 422 at submit, the map-maker refuses to run with it.

Both the service (to check a spec at submit) and the map-maker (to run it) read the file, so the reader
lives here, below both. The file is found under an *instrument root*, a folder the deployment declares
(``MAPCAMPAIGN_INSTRUMENT_ROOT`` for the service, ``instrument_root`` in a site file for its workers),
the way a ``sky.kind = "map"`` path is found under a site's ``sky_root``; its ``sha256`` in the spec pins
the content, so a site whose copy differs refuses to run instead of mapping another instrument.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.files import CHUNK_BYTES, sha256_file
from schemas.spec import (
    MAX_DETECTORS,
    CampaignSpec,
    Detector,
    DetectorSelection,
    FocalPlane,
    GroundScheduleScan,
    SatelliteScheduledScan,
    SatelliteScheduleScan,
    ScheduledScan,
)

DATASET = "focalplane"
QUATERNION_COLUMN = "quat"
NOISE_COLUMNS = {  # TOAST column -> (Detector field, astropy unit string)
    "psd_net": ("net_k_sqrt_s", "K s(1/2)"),
    "psd_fknee": ("f_knee_hz", "Hz"),
    "psd_fmin": ("f_min_hz", "Hz"),
    "psd_alpha": ("alpha", ""),
}
POL_ANGLE_COLUMNS = ("pol_angle", "psi_pol")
WAFER_COLUMNS = ("wafer", "wafer_slot")
BAND_COLUMN = "band"


class FocalPlaneFileError(ValueError):
    """A focal-plane file that cannot be used: ``file`` (as the spec names it), ``column`` (or ""), why."""

    what = "focal-plane file"

    def __init__(self, file: str, column: str, reason: str):
        where = f"column {column!r} of " if column else ""
        super().__init__(f"{where}{self.what} {file!r}: {reason}")
        self.file = file
        self.column = column
        self.reason = reason


@dataclass(frozen=True)
class FocalPlaneTable:
    """The selected detectors of a file, and what the file said about itself."""

    detectors: tuple[Detector, ...]
    file_detectors: int  # rows in the file before the selection
    file_sample_rate_hz: float | None  # the table's ``sample_rate`` metadata, if any


def resolve_instrument_path(instrument_root: str | Path | None, relative: str) -> Path:
    """The file ``relative`` under ``instrument_root``, refusing anything that leaves it (``..``, symlinks)."""
    if instrument_root is None:
        raise FocalPlaneFileError(relative, "", "no instrument_root is configured here to find it in")
    root = Path(instrument_root).resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise FocalPlaneFileError(relative, "", "resolves outside the instrument_root")
    if not path.is_file():
        raise FocalPlaneFileError(relative, "", f"no such file under the instrument_root {str(root)!r}")
    return path


# What a focal-plane file may hold. A user's file is data, never a reference: its layout, storage and types
# are checked from the HDF5 metadata before a byte of the table is read, and the table is read in bounded
# slices (see :func:`_focal_plane_dataset`).
META_DATASET = f"{DATASET}.__table_column_meta__"  # astropy's YAML header: the columns' units, the table's meta
MAX_FILE_DETECTORS = 1_000_000  # rows a focal-plane file may declare (a large experiment has a few 10^5)
MAX_ROW_BYTES = 16_384  # bytes of one detector's row
MAX_COLUMNS = 256  # columns of the table
MAX_CELL_VALUES = 64  # numbers in one cell of an array column (TOAST's ``quat``: 4)
MAX_TEXT_BYTES = 256  # a text column the campaign reads (``name``: 64 characters at most; ``wafer``, ``band``)
MAX_CHUNK_BYTES = 16 << 20  # one chunk, decompressed: what a read of one row may cost at most
MAX_HEADER_BYTES = 64 << 10  # a table's YAML header (the HDF5 metadata dataset, an ECSV file's '#' lines)
READ_BLOCK_BYTES = 4 << 20  # rows read at a time when a selection looks through the file
# HDF5 filters h5py ships (deflate, shuffle, fletcher32, lzf): a file asking for another, which HDF5 would
# look for as a plug-in library, is refused.
ALLOWED_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 32000: "lzf"}


def _quoted(text: str) -> str:
    """``repr`` of a name read from a file's metadata when it is short and printable, else a placeholder."""
    return repr(text) if len(text) <= 64 and text.isprintable() else "(a name too long or not printable)"


def _check_storage(dataset: Any, file: str, what: str) -> None:
    """Refuse a dataset whose data live outside the file or would cost more than a bounded read to decode.

    Checked from the dataset's creation properties, before any of its data are read: external raw storage
    (``external=`` in h5py) and virtual datasets (``h5py.VirtualLayout``) name other files; a filter h5py does
    not ship would be loaded as a plug-in; a chunk larger than :data:`MAX_CHUNK_BYTES` is decompressed whole
    to read one row of it.
    """
    import h5py

    plist = dataset.id.get_create_plist()
    layout = plist.get_layout()
    if layout == h5py.h5d.VIRTUAL:
        raise FocalPlaneFileError(file, "", f"{what} is a virtual dataset (its data are in other files); it is not read")
    if plist.get_external_count() > 0:
        raise FocalPlaneFileError(file, "", f"{what} keeps its data in an external file; it is not read")
    if layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED, h5py.h5d.COMPACT):
        raise FocalPlaneFileError(file, "", f"{what} has an HDF5 storage layout ({layout}) this reader does not take")
    for index in range(plist.get_nfilters()):
        code = plist.get_filter(index)[0]
        if code not in ALLOWED_FILTERS:
            raise FocalPlaneFileError(
                file, "", f"{what} uses HDF5 filter {code}; only {', '.join(sorted(ALLOWED_FILTERS.values()))} are read"
            )
    if layout == h5py.h5d.CHUNKED:
        chunk_bytes = math.prod(plist.get_chunk()) * dataset.dtype.itemsize
        if chunk_bytes > MAX_CHUNK_BYTES:
            raise FocalPlaneFileError(file, "", f"{what} has chunks of {chunk_bytes} bytes, more than {MAX_CHUNK_BYTES}")


def _check_table_dtype(dtype: Any, file: str) -> None:
    """Refuse a table whose row type is not a flat record of fixed-size numbers and byte strings.

    Variable-length strings, references, nested records, opaque and complex types are refused: a TOAST
    focal plane holds fixed-width byte strings (``name``, ``wafer``, ...), numbers, and the float array ``quat``.
    """
    if dtype.names is None:
        raise FocalPlaneFileError(file, "", f"the {DATASET!r} dataset is not a table (a compound HDF5 type)")
    if len(dtype.names) > MAX_COLUMNS:
        raise FocalPlaneFileError(file, "", f"the table has {len(dtype.names)} columns, more than {MAX_COLUMNS}")
    if dtype.itemsize > MAX_ROW_BYTES:
        raise FocalPlaneFileError(file, "", f"a row of the table takes {dtype.itemsize} bytes, more than {MAX_ROW_BYTES}")
    for name in dtype.names:
        field = dtype.fields[name][0]
        base, shape = field.base, field.shape
        column = name if len(name) <= 64 and name.isprintable() else ""
        if base.names is not None or base.kind not in "biufS" or base.hasobject:
            kind = "variable-length or object values" if base.kind == "O" else f"values of type {base.str!r}"
            raise FocalPlaneFileError(file, column, f"the column {_quoted(name)} holds {kind}; only numbers and fixed-width text are read")
        if base.kind == "S" and shape:
            raise FocalPlaneFileError(file, column, "an array of text per detector is not read")
        if math.prod(shape) > MAX_CELL_VALUES or len(shape) > 2:
            raise FocalPlaneFileError(file, column, f"holds {shape} values per detector, more than {MAX_CELL_VALUES}")


def _focal_plane_dataset(handle: Any, file: str) -> tuple[Any, Any]:
    """The table dataset of an open TOAST focal-plane file and its astropy header (None: the file has none).

    The root may hold only :data:`DATASET` and :data:`META_DATASET`, both hard links to datasets: an external,
    soft or user-defined link, a group, or any other object is refused without being followed or opened.
    """
    import h5py
    import numpy as np

    from schemas.io import YamlAliasError, check_yaml_aliases

    expected = (DATASET, META_DATASET)
    if len(handle) > len(expected):
        raise FocalPlaneFileError(file, "", f"holds {len(handle)} objects at its root; a TOAST focal plane holds {DATASET!r} and its metadata")
    names = list(handle)  # the root's link names, listed without resolving them
    if DATASET not in names:
        raise FocalPlaneFileError(file, "", f"has no {DATASET!r} dataset (write it with toast.instrument.Focalplane.save_hdf5)")
    for name in names:
        if name not in expected:
            raise FocalPlaneFileError(file, "", f"holds an object other than {DATASET!r} and its metadata; it is not read")
        link = handle.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            kind = {h5py.SoftLink: "a soft link", h5py.ExternalLink: "an external link"}.get(type(link), "a user-defined link")
            raise FocalPlaneFileError(file, "", f"{name!r} is {kind}; links are not followed")
        if handle.get(name, getclass=True) is not h5py.Dataset:
            raise FocalPlaneFileError(file, "", f"{name!r} is not a dataset")

    table = handle[DATASET]
    _check_storage(table, file, f"the {DATASET!r} dataset")
    _check_table_dtype(table.dtype, file)
    if table.ndim != 1:
        raise FocalPlaneFileError(file, "", f"the {DATASET!r} table must be one row per detector, has shape {table.shape}")
    if table.shape[0] > MAX_FILE_DETECTORS:
        raise FocalPlaneFileError(file, "", f"declares {table.shape[0]} detectors, more than {MAX_FILE_DETECTORS}")

    if META_DATASET not in names:
        return table, None
    meta = handle[META_DATASET]
    _check_storage(meta, file, "the table's metadata")
    if meta.ndim != 1 or meta.dtype.kind != "S" or meta.size * meta.dtype.itemsize > MAX_HEADER_BYTES:
        raise FocalPlaneFileError(file, "", f"the table's metadata are not lines of text of at most {MAX_HEADER_BYTES} bytes")
    try:
        lines = [bytes(line).decode("utf-8") for line in np.asarray(meta[()])]
    except UnicodeDecodeError:
        raise FocalPlaneFileError(file, "", "the table's metadata are not UTF-8 text") from None
    try:
        check_yaml_aliases("\n".join(lines))
    except YamlAliasError as error:
        raise FocalPlaneFileError(file, "", f"the table's metadata: {error}") from None
    from astropy.table import meta as table_meta

    return table, table_meta.get_header_from_yaml(lines)


def _text_values(rows: Any, column: str, file: str) -> list[str]:
    """A fixed-width text column of a block of rows as str (UTF-8; a column of numbers is refused)."""
    values = rows[column]
    if values.dtype.kind != "S":
        raise FocalPlaneFileError(file, column, "must hold text")
    try:
        return [bytes(value).decode("utf-8") for value in values]
    except UnicodeDecodeError:
        raise FocalPlaneFileError(file, column, "is not UTF-8 text") from None


def _selected_rows(dataset: Any, selection: DetectorSelection, file: str) -> Any:
    """The rows of ``dataset`` the selection keeps (a structured array of the columns the campaign reads), read
    a block of :data:`READ_BLOCK_BYTES` at a time.

    Only the columns the map-maker uses (and the selection's) are read, not the whole row. Reading stops as
    soon as ``selection.first`` rows are kept (without a name, wafer or band condition, exactly the first
    ``first`` rows are read), or once more than :data:`MAX_DETECTORS` are.
    """
    import numpy as np

    columns = set(dataset.dtype.names)
    wafer_column = next((c for c in WAFER_COLUMNS if c in columns), None)
    if selection.wafer is not None and wafer_column is None:
        raise FocalPlaneFileError(file, WAFER_COLUMNS[0], "select.wafer needs this column (or 'wafer_slot'); it is missing")
    if selection.band is not None and BAND_COLUMN not in columns:
        raise FocalPlaneFileError(file, BAND_COLUMN, "select.band needs this column; it is missing")
    pol_column = next((c for c in POL_ANGLE_COLUMNS if c in columns), None)
    used = ["name", QUATERNION_COLUMN, *(c for c in NOISE_COLUMNS if c in columns), *([pol_column] if pol_column else [])]
    if selection.wafer is not None and wafer_column is not None:
        used.append(wafer_column)
    if selection.band is not None:
        used.append(BAND_COLUMN)
    for column in used:
        field = dataset.dtype.fields[column][0]
        if field.kind == "S" and field.itemsize > MAX_TEXT_BYTES:
            raise FocalPlaneFileError(file, column, f"holds text of {field.itemsize} bytes, more than {MAX_TEXT_BYTES}")
    view = dataset.fields(used)
    row_bytes = sum(dataset.dtype.fields[column][0].itemsize for column in used)
    filtered = selection.names is not None or selection.wafer is not None or selection.band is not None
    name_pattern = re.compile(fnmatch.translate(selection.names or "*"))  # fnmatchcase, compiled once
    wanted = MAX_DETECTORS + 1 if selection.first is None else min(selection.first, MAX_DETECTORS + 1)
    block_rows = max(1, READ_BLOCK_BYTES // row_bytes)
    total = dataset.shape[0]
    kept: list[Any] = []
    count = 0
    start = 0
    while start < total and count < wanted:
        stop = min(total, start + (block_rows if filtered else min(block_rows, wanted - count)))
        block = view[start:stop]
        keep = np.ones(len(block), dtype=bool)
        if selection.names is not None:
            keep &= np.array([name_pattern.match(name) is not None for name in _text_values(block, "name", file)], dtype=bool)
        if selection.wafer is not None and wafer_column is not None:
            keep &= np.array([value == selection.wafer for value in _text_values(block, wafer_column, file)], dtype=bool)
        if selection.band is not None:
            keep &= np.array([value == selection.band for value in _text_values(block, BAND_COLUMN, file)], dtype=bool)
        chosen = block[np.flatnonzero(keep)[: wanted - count]]
        kept.append(chosen)
        count += len(chosen)
        start = stop
    if count == 0:
        raise FocalPlaneFileError(file, "", f"the selection {selection.model_dump(exclude_none=True)} keeps no detector")
    if count > MAX_DETECTORS:
        raise FocalPlaneFileError(file, "", f"the selection keeps more than {MAX_DETECTORS} detectors")
    return np.concatenate(kept)


def _table_of_rows(rows: Any, header: dict[str, Any] | None, file: str) -> Any:
    """An astropy QTable of checked rows, with the units and the table meta of the file's header."""
    from astropy.table import QTable, Table

    table = Table(rows, copy=False)
    if header is not None:
        described = {item.get("name"): item for item in header.get("datatype", []) if isinstance(item, dict)}
        for column in table.colnames:
            unit = described.get(column, {}).get("unit")
            if unit is not None and table[column].dtype.kind in "iuf":  # a unit on text is left out
                try:
                    table[column].unit = unit
                except (TypeError, ValueError) as error:
                    raise FocalPlaneFileError(file, column, f"its unit in the metadata does not parse ({type(error).__name__})") from None
        meta = header.get("meta")
        if isinstance(meta, dict):
            table.meta.update({key: value for key, value in meta.items() if key != "__serialized_columns__"})
    return QTable(table)


def _meta_quantity(value: Any, unit: str, error: type[FocalPlaneFileError], file: str, key: str) -> float:
    """A table header's value ``key`` (a number, or a quantity astropy converts) in ``unit``, finite.

    A list, a text or a mapping, which a hostile header may put where a number belongs, is an ``error``
    naming ``key``; the message quotes the value's type, not the value.
    """
    import astropy.units as u

    if isinstance(value, bool) or not isinstance(value, int | float | u.Quantity):
        raise error(file, key, f"must be a number in {unit} (a quantity), is {type(value).__name__}")
    try:
        number = u.Quantity(value, unit).to_value(unit) if isinstance(value, u.Quantity) else float(value)
    except (u.UnitsError, TypeError, ValueError):
        raise error(file, key, f"must be in a unit that converts to {unit}") from None
    if getattr(number, "ndim", 0) != 0 or not math.isfinite(float(number)):
        raise error(file, key, f"must be one finite number in {unit}")
    return float(number)


def _column_values(table: Any, column: str, unit: str, file: str) -> Any:
    """The float64 values [n] of ``column`` in ``unit`` (astropy converts); a missing or odd column is an error."""
    import astropy.units as u
    import numpy as np

    if column not in table.colnames:
        raise FocalPlaneFileError(file, column, "the column is missing")
    values = table[column]
    if values.dtype.kind not in "biuf":
        raise FocalPlaneFileError(file, column, "must hold numbers")
    try:
        if isinstance(values, u.Quantity):
            array = values.to_value(u.Unit(unit)) if unit else values.to_value(u.dimensionless_unscaled)
        else:
            array = np.asarray(values, dtype=np.float64)
    except (u.UnitConversionError, u.UnitsError, TypeError, ValueError) as error:
        raise FocalPlaneFileError(file, column, f"cannot be read as {unit or 'a number'}: {error}") from None
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 1:
        raise FocalPlaneFileError(file, column, f"must hold one number per detector, has shape {array.shape}")
    return array


def read_focal_plane_file(path: Path, *, file: str, selection: DetectorSelection) -> FocalPlaneTable:
    """Read, check and select the detectors of a TOAST focal-plane file.

    ``path``: where the file is; ``file``: its name in the spec (for messages). The file's layout, storage
    and column types are checked before its table is read (:func:`_focal_plane_dataset`), and only the rows
    the selection needs are read (:func:`_selected_rows`). Every selected detector must have a finite unit
    quaternion and noise parameters (``psd_net`` > 0, ``psd_fknee`` >= 0, ``psd_fmin`` > 0, ``psd_alpha`` > 0,
    and ``psd_fmin < psd_fknee`` when the knee is not 0).
    """
    import h5py
    import numpy as np
    import yaml
    from astropy.table.meta import YamlParseError

    try:
        with h5py.File(path, "r") as handle:
            dataset, header = _focal_plane_dataset(handle, file)
            columns = set(dataset.dtype.names)
            for column in ("name", QUATERNION_COLUMN):
                if column not in columns:
                    raise FocalPlaneFileError(file, column, "the column is missing")
            if dataset.dtype.fields["name"][0].kind != "S":
                raise FocalPlaneFileError(file, "name", "must hold text")
            quat_type = dataset.dtype.fields[QUATERNION_COLUMN][0]
            if quat_type.shape != (4,) or quat_type.base.kind != "f":
                raise FocalPlaneFileError(file, QUATERNION_COLUMN, f"must hold 4 numbers [x, y, z, w] per detector, holds {quat_type.shape or 1} of type {quat_type.base.str!r}")
            for column in (*NOISE_COLUMNS, *POL_ANGLE_COLUMNS):
                field = dataset.dtype.fields.get(column)
                if field is not None and (field[0].kind not in "iuf" or field[0].shape):
                    raise FocalPlaneFileError(file, column, "must hold numbers, one per detector")
            file_detectors = int(dataset.shape[0])
            rows = _selected_rows(dataset, selection, file)
        table = _table_of_rows(rows, header, file)
    except FocalPlaneFileError:
        raise
    except (OSError, RuntimeError, LookupError, ArithmeticError, ValueError, TypeError, AttributeError, yaml.YAMLError, YamlParseError) as error:
        # a damaged file (h5py raises RuntimeError for much of HDF5's metadata), or a header astropy does not take
        raise FocalPlaneFileError(file, "", f"is not a readable HDF5 focal-plane table ({type(error).__name__})") from None

    names = _text_values(rows, "name", file)
    quats = np.asarray(table[QUATERNION_COLUMN], dtype=np.float64)
    noise = {field: _column_values(table, column, unit, file) for column, (field, unit) in NOISE_COLUMNS.items()}
    pol_column = next((c for c in POL_ANGLE_COLUMNS if c in table.colnames), None)
    pol_angle = _column_values(table, pol_column, "deg", file) if pol_column else np.zeros(len(table))

    detectors = []
    for row in range(len(table)):
        name = names[row]
        q = quats[row]
        if not np.all(np.isfinite(q)) or abs(np.linalg.norm(q) - 1.0) > 1e-6:
            raise FocalPlaneFileError(file, QUATERNION_COLUMN, f"detector {name!r}: {q.tolist()} is not a unit quaternion")
        values = {field: float(noise[field][row]) for field in noise}
        for column, (field, _unit) in NOISE_COLUMNS.items():
            if not math.isfinite(values[field]):
                raise FocalPlaneFileError(file, column, f"detector {name!r} has no value ({values[field]})")
        if values["f_knee_hz"] > 0 and values["f_min_hz"] >= values["f_knee_hz"]:
            raise FocalPlaneFileError(file, "psd_fmin", f"detector {name!r}: psd_fmin must be below psd_fknee")
        try:
            detector = Detector(
                name=name,
                pol_angle_deg=float(np.remainder(pol_angle[row] + 360.0, 720.0) - 360.0),
                quat=(float(q[0]), float(q[1]), float(q[2]), float(q[3])),
                **values,
            )
        except ValueError as error:  # pydantic's ValidationError: a value out of the spec's range
            column = _column_of(error)
            raise FocalPlaneFileError(file, column, f"detector {name!r}: {_first_message(error)}") from None
        # The offsets only describe the quaternion (plots, the overlap model); a wide focal plane may reach
        # beyond the +-10 degrees an inline offset may take, so they are set without that bound.
        offset_x, offset_y = quaternion_offsets_deg(q)
        detectors.append(detector.model_copy(update={"offset_x_deg": offset_x, "offset_y_deg": offset_y}))
    seen: set[str] = set()
    for detector in detectors:
        if detector.name in seen:
            raise FocalPlaneFileError(file, "name", f"detector name {detector.name!r} appears more than once")
        seen.add(detector.name)

    rate = table.meta.get("sample_rate")
    rate_hz = None if rate is None else _meta_quantity(rate, "Hz", FocalPlaneFileError, file, "sample_rate")
    return FocalPlaneTable(detectors=tuple(detectors), file_detectors=file_detectors, file_sample_rate_hz=rate_hz)


_FIELD_COLUMNS = {
    "name": "name",
    "offset_x_deg": "quat",
    "offset_y_deg": "quat",
    "quat": "quat",
    "pol_angle_deg": "pol_angle",
    **{field: column for column, (field, _unit) in NOISE_COLUMNS.items()},
}


def _column_of(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        for item in errors():
            if item.get("loc"):
                return _FIELD_COLUMNS.get(str(item["loc"][0]), str(item["loc"][0]))
    return ""


def _first_message(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        for item in errors():
            return str(item.get("msg", error))
    return str(error)


def quaternion_offsets_deg(q_xyzw: Any) -> tuple[float, float]:
    """The offsets (degrees) of the line of sight of a TOAST detector quaternion [x, y, z, w].

    The line of sight is the quaternion's rotation of +z, ``(sin ox cos oy, sin oy, cos ox cos oy)`` in the
    offsets of :func:`mapmaker.kernels.pointing.detector_quaternion`.
    """
    x, y, z, w = (float(c) for c in q_xyzw)
    vx = 2.0 * (x * z + w * y)
    vy = 2.0 * (y * z - w * x)
    vz = 1.0 - 2.0 * (x * x + y * y)
    return math.degrees(math.atan2(vx, vz)), math.degrees(math.asin(max(-1.0, min(1.0, vy))))


def quaternion_pol_angle_deg(q_xyzw: Any) -> float:
    """The polarisation angle (degrees) of a TOAST detector quaternion [x, y, z, w]: the direction its +x axis
    takes in the focal plane, from the boresight frame's +x towards +y (exact on the boresight, and to second
    order in the offset elsewhere)."""
    x, y, z, w = (float(c) for c in q_xyzw)
    return math.degrees(math.atan2(2.0 * (x * y + w * z), 1.0 - 2.0 * (y * y + z * z)))


def read_focal_plane(plane: FocalPlane, instrument_root: str | Path | None) -> FocalPlaneTable:
    """Find, check the checksum of, and read the file of a file-based focal plane."""
    if plane.file is None:
        raise ValueError("the focal plane is inline; there is no file to read")
    path = resolve_instrument_path(instrument_root, plane.file)
    digest = sha256_file(path)
    if digest != plane.sha256:
        raise FocalPlaneFileError(plane.file, "", f"its sha256 is {digest}, the spec says {plane.sha256}")
    return read_focal_plane_file(path, file=plane.file, selection=plane.select)


def resolve_focal_plane(spec: CampaignSpec, instrument_root: str | Path | None) -> CampaignSpec:
    """The spec with its file-based focal plane read (``spec.focal_plane.detector_rows`` then works).

    An inline focal plane is returned as it is. The spec itself, and so its hashes, do not change.
    """
    plane = spec.focal_plane
    if plane.file is not None and plane._from_file is None:
        table = read_focal_plane(plane, instrument_root)
        plane._from_file = table.detectors
        plane._file_detectors = table.file_detectors
    return spec


# --------------------------------------------------------------------------- ground schedules

SCHEDULE_TEXT_COLUMNS = ("start_time", "stop_time", "name")
SCHEDULE_NUMBER_COLUMNS = ("azmin", "azmax", "el")
SCHEDULE_COLUMNS = SCHEDULE_TEXT_COLUMNS + SCHEDULE_NUMBER_COLUMNS


class ScheduleFileError(FocalPlaneFileError):
    """A schedule file that cannot be used: ``file``, ``column`` (or ""), why (caught with the focal plane's)."""

    what = "schedule file"


def local_sidereal_time_deg(unix_s: float, longitude_deg: float) -> float:
    """Local mean sidereal time (degrees, [0, 360)) at a UTC instant, taking UT1 = UTC.

    GMST = Earth rotation angle + the IAU 2006 precession polynomial (Capitaine et al. 2003, the first
    two terms); the 0.9 s at most between UT1 and UTC turn the sky by at most 14 arcsec. Written out
    because astropy's ``Time.sidereal_time`` needs UT1 from IERS tables it would download.
    """
    days = unix_s / 86_400.0 + 2_440_587.5 - 2_451_545.0  # since J2000.0
    era = 360.0 * (0.7790572732640 + 1.00273781191135448 * days)
    centuries = days / 36_525.0
    gmst = era + (0.014506 + 4612.156534 * centuries) / 3600.0
    return float((gmst + longitude_deg) % 360.0)


# What a schedule file may hold: a TOAST ECSV table is read only after its size, its header (YAML, its
# aliases bounded) and its column types are checked; astropy then reads the lines that were checked.
MAX_SCHEDULE_BYTES = 32 << 20  # a schedule file (a year of 10-minute scans takes about 6 MB)
MAX_SCHEDULE_ROWS = 200_000  # scans in a schedule file
ECSV_NUMBER_TYPES = {"float64", "float32", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8"}
ECSV_TYPES = ECSV_NUMBER_TYPES | {"string", "bool"}
SERIALIZED_CLASSES = {"astropy.units.quantity.Quantity"}  # the mixin columns TOAST writes (a unit on a number)


def _schedule_header(lines: list[str], file: str, texts: tuple[str, ...], numbers: tuple[str, ...]) -> None:
    """Check an ECSV file's header lines (the '#' lines, prefix kept) before astropy reads the table.

    Refused: a header larger than :data:`MAX_HEADER_BYTES`, YAML whose aliases expand beyond
    :data:`schemas.io.MAX_YAML_ALIAS_NODES`, a column of a type other than fixed-size numbers, text and
    booleans (no ``subtype``: no JSON or array cells), a mixin column other than a quantity, and a column
    the schedule needs declared with the wrong type (the error names it).
    """
    from astropy.table import meta as table_meta

    from schemas.io import YamlAliasError, check_yaml_aliases

    if sum(len(line) + 1 for line in lines) > MAX_HEADER_BYTES:
        raise ScheduleFileError(file, "", f"its header is larger than {MAX_HEADER_BYTES} bytes")
    body = [line[2:] if line.startswith("# ") else line[1:] for line in lines]
    if not body or not body[0].startswith("%ECSV"):
        raise ScheduleFileError(file, "", "is not a TOAST ECSV schedule (no '# %ECSV' first line)")
    try:
        check_yaml_aliases("\n".join(body[1:]))
        header = table_meta.get_header_from_yaml(body[1:])
    except YamlAliasError as error:
        raise ScheduleFileError(file, "", f"its header: {error}") from None
    except Exception as error:  # noqa: BLE001 - astropy's YAML constructors on untrusted text raise many kinds: all mean a bad header
        raise ScheduleFileError(file, "", f"its header is not an ECSV header ({type(error).__name__})") from None
    declared = header.get("datatype") if isinstance(header, dict) else None
    if not isinstance(declared, list):
        raise ScheduleFileError(file, "", "its header has no list of columns ('datatype')")
    types: dict[str, str] = {}
    for item in declared:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str):
            raise ScheduleFileError(file, "", "a column of its header has no name")
        column = name if len(name) <= 64 and name.isprintable() else ""
        datatype = item.get("datatype")
        if datatype not in ECSV_TYPES or "subtype" in item:
            raise ScheduleFileError(file, column, f"the column {_quoted(name)} has a type that is not read (numbers, text and booleans are)")
        types[name] = datatype
    for name in texts:
        if name in types and types[name] != "string":
            raise ScheduleFileError(file, name, f"must hold text, the header says {types[name]}")
    for name in numbers:
        if name in types and types[name] not in ECSV_NUMBER_TYPES:
            raise ScheduleFileError(file, name, f"must hold numbers, the header says {types[name]}")
    meta = header.get("meta") or {}
    if not isinstance(meta, dict):
        raise ScheduleFileError(file, "", "its header's meta is not a mapping")
    serialized = meta.get("__serialized_columns__", {})
    if not isinstance(serialized, dict) or any(
        not isinstance(item, dict) or item.get("__class__") not in SERIALIZED_CLASSES for item in serialized.values()
    ):
        raise ScheduleFileError(file, "", "its header describes columns of a kind other than quantities")


def _read_schedule_table(path: Path, *, file: str, texts: tuple[str, ...], numbers: tuple[str, ...]) -> Any:
    """A TOAST ECSV schedule as astropy reads it, with the ``texts`` and ``numbers`` columns present and of
    their types; errors name ``file`` and the column.

    At most :data:`MAX_SCHEDULE_BYTES` are read; the header is checked first (:func:`_schedule_header`) and a
    file of more than :data:`MAX_SCHEDULE_ROWS` rows is refused before astropy parses it.
    """
    from astropy.io import ascii as astropy_ascii

    try:
        with open(path, "rb") as stream:  # in pieces: read(n) would set n bytes aside first
            pieces: list[bytes] = []
            size = 0
            while size <= MAX_SCHEDULE_BYTES and (piece := stream.read(CHUNK_BYTES)):
                pieces.append(piece)
                size += len(piece)
        raw = b"".join(pieces)
    except OSError as error:
        raise ScheduleFileError(file, "", f"cannot be read ({error.strerror or type(error).__name__})") from None
    if len(raw) > MAX_SCHEDULE_BYTES:
        raise ScheduleFileError(file, "", f"is larger than {MAX_SCHEDULE_BYTES} bytes")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ScheduleFileError(file, "", "is not UTF-8 text") from None
    header_end = next((index for index, line in enumerate(lines) if not line.startswith("#")), len(lines))
    _schedule_header(lines[:header_end], file, texts, numbers)
    rows = sum(1 for line in lines[header_end:] if line.strip() and not line.startswith("#")) - 1  # less the names
    if rows > MAX_SCHEDULE_ROWS:
        raise ScheduleFileError(file, "", f"holds {rows} rows, more than {MAX_SCHEDULE_ROWS}")
    try:
        table = astropy_ascii.read(lines, format="ecsv", guess=False)
    except Exception as error:  # noqa: BLE001 - astropy's reader on untrusted text raises many kinds (IndexError, ...): all mean a bad file
        raise ScheduleFileError(file, "", f"is not a TOAST ECSV schedule ({type(error).__name__})") from None
    for column in texts + numbers:
        if column not in table.colnames:
            raise ScheduleFileError(file, column, "the column is missing")
    for column in texts:
        if table[column].dtype.kind not in "US":
            raise ScheduleFileError(file, column, "must hold text")
    for column in numbers:
        if table[column].dtype.kind not in "iuf":
            raise ScheduleFileError(file, column, "must hold numbers")
    return table


def read_ground_schedule(
    path: Path, *, file: str, chunk_s: float, first_scans: int | None
) -> tuple[float, tuple[ScheduledScan, ...]]:
    """The site latitude (degrees) and the scans of a TOAST 3 ground schedule in ECSV (astropy reads it).

    Each scan keeps its whole chunks of ``chunk_s``; a scan shorter than one chunk is refused (it would
    hold no data), as are a stop before a start, scans out of time order and an elevation outside (0, 90).
    """
    from datetime import datetime

    import astropy.units as u

    table = _read_schedule_table(path, file=file, texts=SCHEDULE_TEXT_COLUMNS, numbers=SCHEDULE_NUMBER_COLUMNS)
    site: dict[str, float] = {}
    for key, bound in (("site_lat", 90.0), ("site_lon", 360.0)):
        value = table.meta.get(key)
        if value is None:
            raise ScheduleFileError(file, key, "the site's coordinate is missing from the header")
        site[key] = _meta_quantity(value, "deg", ScheduleFileError, file, key)
        if abs(site[key]) > bound:
            raise ScheduleFileError(file, key, f"must be within +-{bound:g} degrees, is {site[key]:g}")

    def degrees(column: str) -> Any:
        values = table[column]
        unit = getattr(values, "unit", None)
        try:
            return u.Quantity(values, unit or u.deg).to_value(u.deg)
        except (u.UnitConversionError, u.UnitsError, TypeError, ValueError):
            raise ScheduleFileError(file, column, f"cannot be read as an angle (its unit is {str(unit)[:32]!r})") from None

    azmin, azmax, elevation = degrees("azmin"), degrees("azmax"), degrees("el")
    rows = range(len(table)) if first_scans is None else range(min(first_scans, len(table)))
    scans = []
    offset = 0.0
    previous_stop = -math.inf
    for row in rows:
        name = str(table["name"][row])
        try:
            start = datetime.fromisoformat(str(table["start_time"][row])).timestamp()
            stop = datetime.fromisoformat(str(table["stop_time"][row])).timestamp()
        except ValueError as error:
            raise ScheduleFileError(file, "start_time", f"scan {row} ({name!r}): {error}") from None
        if stop <= start or start < previous_stop:
            raise ScheduleFileError(file, "stop_time", f"scan {row} ({name!r}) ends before it starts or overlaps the one before")
        chunks = int((stop - start) // chunk_s)
        if chunks < 1:
            raise ScheduleFileError(file, "stop_time", f"scan {row} ({name!r}) is shorter than one chunk ({chunk_s:g} s)")
        try:
            scan = ScheduledScan(
                name=name,
                offset_s=offset,
                chunks=chunks,
                start_lst_deg=local_sidereal_time_deg(start, site["site_lon"]),
                start_unix_s=start,
                azimuth_min_deg=float(azmin[row]),
                azimuth_max_deg=float(azmax[row]),
                elevation_deg=float(elevation[row]),
            )
        except ValueError as error:
            raise ScheduleFileError(file, "el", f"scan {row} ({name!r}): {_first_message(error)}") from None
        if scan.azimuth_max_deg <= scan.azimuth_min_deg:
            raise ScheduleFileError(file, "azmax", f"scan {row} ({name!r}): azmax must be greater than azmin")
        scans.append(scan)
        offset += chunks * chunk_s
        previous_stop = stop
    if not scans:
        raise ScheduleFileError(file, "", "holds no scan")
    return site["site_lat"], tuple(scans)


# --------------------------------------------------------------------------- satellite schedules

SATELLITE_SCHEDULE_TEXT_COLUMNS = ("name", "start", "stop")
SATELLITE_SCHEDULE_NUMBER_COLUMNS = ("prec_period", "spin_period")
SATELLITE_SCHEDULE_COLUMNS = SATELLITE_SCHEDULE_TEXT_COLUMNS + SATELLITE_SCHEDULE_NUMBER_COLUMNS


def read_satellite_schedule(
    path: Path, *, file: str, chunk_s: float, sample_rate_hz: float, first_scans: int | None
) -> tuple[SatelliteScheduledScan, ...]:
    """The scans of a TOAST 3 satellite schedule in ECSV (``SatelliteSchedule.write``; astropy reads it).

    Each scan keeps its whole chunks of ``chunk_s``. The first sample of a scan and the running sample clock
    of the spin and precession phases are TOAST's (``toast.ops.SimSatellite`` at ``sample_rate_hz``): samples
    on one grid from the first scan's start, each scan starting at the first grid point at or after its
    start time, the clock counting each earlier scan's ``1 + int(rate (stop - first sample))`` samples. A scan
    shorter than one chunk, a stop before a start, scans out of time order, and periods that are not positive
    are refused.
    """
    from datetime import datetime

    import astropy.units as u

    table = _read_schedule_table(
        path, file=file, texts=SATELLITE_SCHEDULE_TEXT_COLUMNS, numbers=SATELLITE_SCHEDULE_NUMBER_COLUMNS
    )

    def seconds(column: str) -> Any:
        values = table[column]
        unit = getattr(values, "unit", None)
        try:
            return u.Quantity(values, unit or u.minute).to_value(u.s)  # TOAST writes minutes
        except (u.UnitConversionError, u.UnitsError, TypeError, ValueError) as error:
            raise ScheduleFileError(file, column, f"cannot be read as a time: {error}") from None

    precession, spin = seconds("prec_period"), seconds("spin_period")
    if len(table) == 0:
        raise ScheduleFileError(file, "", "holds no scan")
    times = []
    for row in range(len(table)):
        name = str(table["name"][row])
        try:
            start = datetime.fromisoformat(str(table["start"][row])).timestamp()
        except ValueError as error:
            raise ScheduleFileError(file, "start", f"scan {row} ({name!r}): {error}") from None
        try:
            stop = datetime.fromisoformat(str(table["stop"][row])).timestamp()
        except ValueError as error:
            raise ScheduleFileError(file, "stop", f"scan {row} ({name!r}): {error}") from None
        times.append((name, start, stop))

    increment = 1.0 / sample_rate_hz
    mission_start = times[0][1]
    rows = len(times) if first_scans is None else min(first_scans, len(times))
    scans = []
    offset = 0.0
    sample_clock = 0  # TOAST's sample_offset: samples of the scans before, gaps left out
    previous_stop = -math.inf
    for row in range(rows):
        name, start, stop = times[row]
        if stop <= start or start < previous_stop:
            raise ScheduleFileError(file, "stop", f"scan {row} ({name!r}) ends before it starts or overlaps the one before")
        for column, values in (("prec_period", precession), ("spin_period", spin)):
            if not (math.isfinite(float(values[row])) and float(values[row]) > 0):
                raise ScheduleFileError(file, column, f"scan {row} ({name!r}): must be a positive time, is {float(values[row]):g} s")
        # As SimSatellite places the scan's samples (a start within 1e-3 sample of the grid is on it).
        fractional_first = sample_rate_hz * (start - mission_start)
        first = int(fractional_first)
        if fractional_first - first > 1.0e-3 * increment:
            first += 1
        first_sample_s = first * increment + mission_start
        samples = 1 + int(sample_rate_hz * (stop - first_sample_s))
        chunks = int((stop - first_sample_s) // chunk_s)
        if chunks < 1:
            raise ScheduleFileError(file, "stop", f"scan {row} ({name!r}) is shorter than one chunk ({chunk_s:g} s)")
        scans.append(
            SatelliteScheduledScan(
                name=name,
                offset_s=offset,
                chunks=chunks,
                start_unix_s=first_sample_s,
                phase_offset_s=sample_clock * increment,
                precession_period_s=float(precession[row]),
                spin_period_s=float(spin[row]),
            )
        )
        offset += chunks * chunk_s
        sample_clock += samples
        previous_stop = stop
    return tuple(scans)


def _schedule_path(scan: GroundScheduleScan | SatelliteScheduleScan, instrument_root: str | Path | None) -> Path:
    """The schedule's file under ``instrument_root``, its checksum checked."""
    try:
        path = resolve_instrument_path(instrument_root, scan.file)
    except FocalPlaneFileError as error:
        raise ScheduleFileError(scan.file, "", error.reason) from None
    digest = sha256_file(path)
    if digest != scan.sha256:
        raise ScheduleFileError(scan.file, "", f"its sha256 is {digest}, the spec says {scan.sha256}")
    return path


def resolve_files(spec: CampaignSpec, instrument_root: str | Path | None) -> CampaignSpec:
    """The spec with its focal-plane file and its schedule file read (both under ``instrument_root``)."""
    resolve_focal_plane(spec, instrument_root)
    scan = spec.scan
    if isinstance(scan, GroundScheduleScan) and scan._scans is None:
        path = _schedule_path(scan, instrument_root)
        latitude, scans = read_ground_schedule(path, file=scan.file, chunk_s=scan.chunk_s, first_scans=scan.first_scans)
        scan._site_latitude_deg = latitude
        scan._scans = scans
    if isinstance(scan, SatelliteScheduleScan) and scan._scans is None:
        path = _schedule_path(scan, instrument_root)
        scan._scans = read_satellite_schedule(
            path,
            file=scan.file,
            chunk_s=scan.chunk_s,
            sample_rate_hz=spec.focal_plane.sample_rate_hz,
            first_scans=scan.first_scans,
        )
    return spec


# --------------------------------------------------------------------------- what a campaign read from its files

SUMMARY_DETECTORS = 2_000  # detectors kept for the dashboard's focal-plane plot
SUMMARY_SCANS = 200  # scheduled scans kept for the dashboard's schedule table
SIDEREAL_DAY_S = 86_164.0905


def horizon_to_equatorial_deg(azimuth_deg: float, elevation_deg: float, latitude_deg: float, lst_deg: float) -> tuple[float, float]:
    """RA and Dec (degrees, of date) of a direction at azimuth (from north through east) and elevation, seen
    from ``latitude_deg`` at local sidereal time ``lst_deg`` (no refraction)."""
    azimuth, elevation, latitude = (math.radians(v) for v in (azimuth_deg, elevation_deg, latitude_deg))
    sin_dec = math.sin(latitude) * math.sin(elevation) + math.cos(latitude) * math.cos(elevation) * math.cos(azimuth)
    dec = math.asin(max(-1.0, min(1.0, sin_dec)))
    hour_angle = math.atan2(
        -math.cos(elevation) * math.sin(azimuth),
        math.sin(elevation) * math.cos(latitude) - math.cos(elevation) * math.sin(latitude) * math.cos(azimuth),
    )
    return (lst_deg - math.degrees(hour_angle)) % 360.0, math.degrees(dec)


def _iso(unix_s: float | None) -> str | None:
    from datetime import UTC, datetime

    return None if unix_s is None else datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="seconds")


def instrument_summary(spec: CampaignSpec) -> dict[str, Any] | None:
    """What a spec's files said, small enough to keep with the campaign (JSON; None: no file in the spec).

    ``focal_plane``: the file's detector count and the selected ones (the first :data:`SUMMARY_DETECTORS`
    with their offsets and polarisation angles, degrees), and the range of their NETs. ``schedule``: the scan
    count, the observed time, and the first :data:`SUMMARY_SCANS` scans with their UTC start and observed
    length; a ground scan with its azimuth range, elevation, and the RA/Dec of the middle of its azimuth
    range at the middle of the scan (the field it observes), a satellite scan with its periods and the
    ecliptic longitude of the anti-Sun direction at its middle (the centre of the ring it observes). The spec's
    files must have been read (:func:`resolve_files`).
    """
    summary: dict[str, Any] = {}
    plane = spec.focal_plane
    if plane.file is not None:
        rows = plane.detector_rows
        nets = sorted(d.net_k_sqrt_s for d in rows if d.net_k_sqrt_s is not None)
        summary["focal_plane"] = {
            "file": plane.file,
            "sha256": plane.sha256,
            "file_detectors": plane._file_detectors,
            "detectors": len(rows),
            "net_k_sqrt_s": [nets[0], nets[len(nets) // 2], nets[-1]] if nets else None,  # min, median, max
            "shown": [
                {
                    "name": d.name,
                    "offset_x_deg": round(d.offset_x_deg, 5),
                    "offset_y_deg": round(d.offset_y_deg, 5),
                    "pol_angle_deg": round(quaternion_pol_angle_deg(d.quat) if d.quat else d.pol_angle_deg, 3),
                }
                for d in rows[:SUMMARY_DETECTORS]
            ],
        }
    scan = spec.scan
    if isinstance(scan, GroundScheduleScan):
        shown = []
        for item in scan.scans[:SUMMARY_SCANS]:
            observed = item.chunks * scan.chunk_s
            lst = item.start_lst_deg + 360.0 * (0.5 * observed) / SIDEREAL_DAY_S
            ra, dec = horizon_to_equatorial_deg(
                0.5 * (item.azimuth_min_deg + item.azimuth_max_deg), item.elevation_deg, scan.site_latitude_deg, lst
            )
            shown.append(
                {
                    "name": item.name,
                    "start": _iso(item.start_unix_s),
                    "observed_s": observed,
                    "azimuth_min_deg": item.azimuth_min_deg,
                    "azimuth_max_deg": item.azimuth_max_deg,
                    "elevation_deg": item.elevation_deg,
                    "ra_deg": round(ra, 3),
                    "dec_deg": round(dec, 3),
                }
            )
        summary["schedule"] = {
            "kind": scan.kind,
            "file": scan.file,
            "scans": len(scan.scans),
            "observed_s": scan.duration_s,
            "site_latitude_deg": scan.site_latitude_deg,
            "shown": shown,
        }
    elif isinstance(scan, SatelliteScheduleScan):
        import numpy as np

        from campaignlib.ephemeris import anti_sun_direction

        listed = scan.scans[:SUMMARY_SCANS]
        middles = np.array([item.start_unix_s + 0.5 * item.chunks * scan.chunk_s for item in listed])
        # Each middle on its own: the directions are interpolated between the times they are asked at.
        axes = np.concatenate([anti_sun_direction(middles[i : i + 1]) for i in range(len(listed))])
        longitudes = np.degrees(np.arctan2(axes[:, 1], axes[:, 0])) % 360.0
        reach = max((math.hypot(d.offset_x_deg, d.offset_y_deg) for d in plane.detector_rows), default=0.0)
        summary["schedule"] = {
            "kind": scan.kind,
            "file": scan.file,
            "scans": len(scan.scans),
            "observed_s": scan.duration_s,
            "coverage": satellite_coverage(scan, focal_plane_reach_deg=reach),
            "shown": [
                {
                    "name": item.name,
                    "start": _iso(item.start_unix_s),
                    "observed_s": item.chunks * scan.chunk_s,
                    "precession_period_s": item.precession_period_s,
                    "spin_period_s": item.spin_period_s,
                    "anti_sun_longitude_deg": round(float(longitude), 3),
                }
                for item, longitude in zip(listed, longitudes, strict=True)
            ],
        }
    return summary or None


COVERAGE_CELL_DEG = 5.0  # the dashboard's sky grid: 72 x 36 cells of ecliptic longitude and latitude


def satellite_coverage(scan: SatelliteScheduleScan, *, focal_plane_reach_deg: float = 0.0) -> dict[str, Any]:
    """The cells of a 5-degree ecliptic grid a satellite schedule's boresight can reach.

    The spin axis turns at the precession angle around the anti-Sun axis and the boresight at the spin angle
    around the spin axis, so over a scan the boresight sweeps the ring between |precession - spin| and
    precession + spin of the anti-Sun direction, taken at each scan's start, middle and end (it moves a degree
    a day). A cell counts when any point of it can be in that ring: its centre within the ring widened by the
    cell's half-diagonal and the focal plane's reach (degrees from the boresight). Returned as the grid's
    ``cell_deg`` and the covered cells' flat indices ``latitude_row * 72 + longitude_column`` (row 0 at
    latitude -90 degrees, column 0 at longitude 0), and the covered fraction of the sky (by solid angle).
    """
    import numpy as np

    from campaignlib.ephemeris import anti_sun_direction

    n_lon, n_lat = int(360 / COVERAGE_CELL_DEG), int(180 / COVERAGE_CELL_DEG)
    lon = np.radians((np.arange(n_lon) + 0.5) * COVERAGE_CELL_DEG)
    lat = np.radians((np.arange(n_lat) + 0.5) * COVERAGE_CELL_DEG - 90.0)
    cos_lat = np.cos(lat)[:, None]
    centres = np.stack(
        [cos_lat * np.cos(lon)[None, :], cos_lat * np.sin(lon)[None, :], np.broadcast_to(np.sin(lat)[:, None], (n_lat, n_lon))],
        axis=-1,
    ).reshape(-1, 3)  # [n_lat * n_lon, 3]
    # One ephemeris call a scan, for its start, middle and end: its nodes then span the scan, not the gaps.
    axes = [
        anti_sun_direction(item.start_unix_s + np.array([0.0, 0.5, 1.0]) * item.chunks * scan.chunk_s)
        for item in scan.scans
    ]
    margin = math.degrees(math.acos(math.cos(math.radians(COVERAGE_CELL_DEG / 2)) ** 2)) + focal_plane_reach_deg
    inner = max(0.0, abs(scan.precession_angle_deg - scan.spin_angle_deg) - margin)
    outer = scan.precession_angle_deg + scan.spin_angle_deg + margin
    covered = np.zeros(len(centres), dtype=bool)
    for axis in (axis for three in axes for axis in three):  # [n_cells] at a time: small memory for long schedules
        distance = np.degrees(np.arccos(np.clip(centres @ axis, -1.0, 1.0)))
        covered |= (distance >= inner) & (distance <= outer)
    cell_area = (np.sin(lat + np.radians(COVERAGE_CELL_DEG / 2)) - np.sin(lat - np.radians(COVERAGE_CELL_DEG / 2)))
    areas = np.broadcast_to(cell_area[:, None], (n_lat, n_lon)).reshape(-1) * np.radians(COVERAGE_CELL_DEG)
    return {
        "cell_deg": COVERAGE_CELL_DEG,
        "cells": np.flatnonzero(covered).tolist(),
        "sky_fraction": round(float(areas[covered].sum() / (4 * math.pi)), 4),
    }


# --------------------------------------------------------------------------- uploaded files

UPLOADS = "uploads"  # the folder, under the instrument_root, of files uploaded to the service
UPLOAD_SUFFIXES = {"focal-plane": ".h5", "ground-schedule": ".ecsv", "satellite-schedule": ".ecsv"}


def upload_path(sha256: str, kind: str) -> str:
    """Where an uploaded file of ``kind`` is kept, relative to the instrument_root: named by its checksum."""
    return f"{UPLOADS}/{sha256}{UPLOAD_SUFFIXES[kind]}"


def check_instrument_file(path: Path, *, kind: str, file: str) -> int:
    """Check a file as the map-maker will read it; return its detector count (focal plane) or scan count.

    A focal plane is checked over its first :data:`MAX_DETECTORS` rows (a campaign selects at most that
    many); a schedule in full, its scans against a 1 ms chunk (a campaign's ``chunk_s`` is checked at submit).
    Errors name ``file`` and the column, as at submit.
    """
    if kind == "focal-plane":
        table = read_focal_plane_file(path, file=file, selection=DetectorSelection(first=MAX_DETECTORS))
        return table.file_detectors
    if kind == "ground-schedule":
        return len(read_ground_schedule(path, file=file, chunk_s=1e-3, first_scans=None)[1])
    if kind == "satellite-schedule":
        return len(read_satellite_schedule(path, file=file, chunk_s=1e-3, sample_rate_hz=1.0, first_scans=None))
    raise ValueError(f"unknown instrument file kind {kind!r}")
