"""A corpus of hostile TOAST instrument files, built at test time: each one a way a user's file could make the
service read another file, or spend memory and time out of proportion to its size, or crash a reader.

Every builder writes one file under a folder and returns a :class:`Hostile`: the file, its kind (as
``POST /instrument-files?kind=`` takes it), the column the refusal must name ("" for the file as a whole)
and words the message must hold. Files that point outside themselves point at ``secret``: a file holding a
random token that no answer may ever contain (the way a service's session key would be read).

The classes follow OWASP's file-upload and denial-of-service cheat sheets and h5py's documentation of
external storage, virtual datasets and links: references to other files (external raw storage, virtual
datasets, external links), references inside the file (soft links) and objects outside the expected layout,
declared shapes far beyond the file's size (chunked and compressed, so the file stays small), chunks too
large to decompress, types a reader would mis-handle (text where numbers belong, variable-length strings,
nested records), and YAML headers that expand (aliases of aliases), grow past a bound, or put a list or a
text where a number belongs.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import h5py
import numpy as np

from tests.support.toast_files import (
    detector_quat,
    focal_plane_table,
    write_focal_plane,
    write_ground_schedule,
    write_satellite_schedule,
)

TABLE = "focalplane"
META = "focalplane.__table_column_meta__"


def leaks(text: str, token: str) -> bool:
    """Whether ``text`` holds 8 consecutive characters of the secret file (the token, repeated)."""
    twice = token + token
    return any(twice[start : start + 8] in text for start in range(len(token)))


@dataclass(frozen=True)
class Hostile:
    path: Path
    kind: str  # focal-plane, ground-schedule or satellite-schedule
    column: str  # the column the refusal names ("": the file as a whole)
    words: str  # in the refusal's message


def make_secret(folder: Path) -> tuple[Path, str]:
    """A file outside the instrument folder holding a random token (64 hex digits), repeated to 1 MiB."""
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    path = folder / "session.key"
    path.write_bytes((token.encode() * ((1 << 20) // len(token) + 1))[: 1 << 20])
    return path, token


def good_focal_plane(path: Path, n: int = 4, prefix: str = "D") -> Path:
    """A valid TOAST focal plane of ``n`` detectors, saved by TOAST."""
    quats = np.array([detector_quat(0.1 * (i % 10), 0.0, 45.0 * (i % 4)) for i in range(n)])
    write_focal_plane(path, focal_plane_table([f"{prefix}{i}" for i in range(n)], quats, net=[50e-6] * n))
    return path


def _template(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The rows and the metadata lines of a valid 4-detector TOAST focal plane (the real dtype and header)."""
    path = good_focal_plane(folder / ".template.h5", prefix="detector-of-a-long-name-")  # 25-byte names
    with h5py.File(path, "r") as handle:
        rows, meta = handle[TABLE][()], handle[META][()]
    path.unlink()
    return rows, meta


def _write(path: Path, build: Callable[[h5py.File], None], meta: np.ndarray | None) -> Path:
    with h5py.File(path, "w") as handle:
        build(handle)
        if meta is not None:
            handle.create_dataset(META, data=meta)
    return path


def _with_field(rows: np.ndarray, column: str, dtype: object) -> np.ndarray:
    """The rows with ``column``'s type replaced by ``dtype`` (values converted through text)."""
    new_dtype = np.dtype([(name, dtype if name == column else rows.dtype.fields[name][0]) for name in rows.dtype.names])
    out = np.zeros(len(rows), dtype=new_dtype)
    for name in rows.dtype.names:
        if name != column:
            out[name] = rows[name]
    return out


# --------------------------------------------------------------------------- focal planes


def focal_plane_corpus(folder: Path, secret: Path) -> dict[str, Hostile]:
    """Every hostile focal plane, by name, written under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows, meta = _template(folder)
    dtype, itemsize = rows.dtype, rows.dtype.itemsize
    corpus: dict[str, Hostile] = {}

    def add(name: str, column: str, words: str, build: Callable[[h5py.File], None], with_meta: bool = True) -> None:
        corpus[name] = Hostile(_write(folder / f"{name}.h5", build, meta if with_meta else None), "focal-plane", column, words)

    # The table's bytes are the secret file's: the name column would be the token.
    add("external storage", "", "external file",
        lambda h: h.create_dataset(TABLE, shape=(4,), dtype=dtype, external=[(str(secret), 0, 4 * itemsize)]))  # fmt: skip

    # A virtual dataset whose rows come from another file: a focal plane named with the token.
    source = folder / "elsewhere" / "source.h5"
    source.parent.mkdir(exist_ok=True)
    token = secret.read_bytes()[:64].decode()
    with h5py.File(source, "w") as handle:
        leaked = rows.copy()
        leaked["name"] = [token[:16].encode()] * 4
        handle.create_dataset(TABLE, data=leaked)

    def virtual(handle: h5py.File) -> None:
        layout = h5py.VirtualLayout(shape=(4,), dtype=dtype)
        layout[:] = h5py.VirtualSource(str(source), TABLE, shape=(4,))
        handle.create_virtual_dataset(TABLE, layout)

    add("virtual dataset", "", "virtual dataset", virtual)

    # Links: the table is another file's (external link), or another object of this one (soft link).
    secret_plane = good_focal_plane(folder / "elsewhere" / "plane.h5", prefix=token[:16])

    def external_link(handle: h5py.File) -> None:
        handle[TABLE] = h5py.ExternalLink(str(secret_plane), f"/{TABLE}")

    add("external link", "", "external link", external_link)

    def soft_link(handle: h5py.File) -> None:
        handle[TABLE] = h5py.SoftLink(f"/{META}")

    add("soft link", "", "soft link", soft_link)

    def extra_group(handle: h5py.File) -> None:
        handle.create_dataset(TABLE, data=rows)
        handle.create_group("hidden").create_dataset("more", data=np.arange(3))

    add("extra group", "", "3 objects", extra_group)

    def other_object(handle: h5py.File) -> None:
        handle.create_dataset(TABLE, data=rows)
        handle.create_dataset("notes", data=np.arange(3))

    add("object outside the layout", "", "other than", other_object, with_meta=False)

    def table_as_group(handle: h5py.File) -> None:
        handle.create_group(TABLE)

    add("table is a group", "", "not a dataset", table_as_group)

    # Declared shapes far beyond the file: chunked and compressed, never written, a few KB on disk.
    for count, label in ((10**7, "10^7 rows"), (10**12, "10^12 rows")):
        add(label, "", f"declares {count} detectors",
            lambda h, count=count: h.create_dataset(TABLE, shape=(count,), dtype=dtype, chunks=(1024,), compression="gzip"))  # fmt: skip

    # 10^6 declared rows of zeros (the fill value): the first one read is refused, not the whole table.
    add("10^6 rows of zeros", "quat", "not a unit quaternion",
        lambda h: h.create_dataset(TABLE, shape=(10**6,), dtype=dtype, chunks=(1024,), compression="gzip"))  # fmt: skip

    # Rows of 16 KB (a wide column the campaign does not read), 10^6 of them declared (16 GB), never written:
    # reading the first 10,000 whole rows would take 160 MB.
    wide = np.dtype([*((name, dtype.fields[name][0]) for name in dtype.names), ("notes", "S16000")])
    add("wide rows of zeros", "quat", "not a unit quaternion", lambda h: h.create_dataset(TABLE, shape=(10**6,), dtype=wide))
    add("long names", "name", "text of 1000 bytes",
        lambda h: h.create_dataset(TABLE, data=_with_field(rows, "name", "S1000")))  # fmt: skip

    add("huge chunks", "", "chunks of",
        lambda h: h.create_dataset(TABLE, shape=(10**6,), dtype=dtype, chunks=(10**6,), compression="gzip"))  # fmt: skip

    add("two-dimensional table", "", "one row per detector",
        lambda h: h.create_dataset(TABLE, data=np.stack([rows, rows])))  # fmt: skip

    # Types.
    add("net as text", "psd_net", "must hold numbers",
        lambda h: h.create_dataset(TABLE, data=_with_field(rows, "psd_net", "S8")))  # fmt: skip
    add("quat as one number", "quat", "4 numbers",
        lambda h: h.create_dataset(TABLE, data=_with_field(rows, "quat", "f8")))  # fmt: skip
    add("name as a number", "name", "must hold text",
        lambda h: h.create_dataset(TABLE, data=_with_field(rows, "name", "f8")))  # fmt: skip
    add("variable-length names", "name", "variable-length",
        lambda h: h.create_dataset(TABLE, shape=(4,), dtype=_with_field(rows, "name", h5py.string_dtype()).dtype))  # fmt: skip
    add("nested record", "psd_net", "only numbers and fixed-width text",
        lambda h: h.create_dataset(TABLE, data=_with_field(rows, "psd_net", [("a", "f8"), ("b", "f8")])))  # fmt: skip
    add("complex column", "psd_net", "only numbers and fixed-width text",
        lambda h: h.create_dataset(TABLE, data=_with_field(rows, "psd_net", "c16")))  # fmt: skip
    add("not a table", "", "not a table", lambda h: h.create_dataset(TABLE, data=np.arange(4.0)))

    # The astropy header (YAML): aliases of aliases, too large, not text.
    corpus["header aliases"] = Hostile(
        _write(folder / "header aliases.h5", lambda h: h.create_dataset(TABLE, data=rows), np.array(billion_laughs_lines(), dtype="S")),
        "focal-plane", "", "aliases",
    )
    corpus["metadata too large"] = Hostile(
        _write(folder / "metadata too large.h5", lambda h: h.create_dataset(TABLE, data=rows), np.array([b"# " + b"x" * 1000] * 100)),
        "focal-plane", "", "at most 65536 bytes",
    )

    def rate_as_list(handle: h5py.File) -> None:
        handle.create_dataset(TABLE, data=rows)
        lines = [bytes(line).decode() for line in meta]
        handle.create_dataset(META, data=np.array(_with_meta_value(lines, "sample_rate", "[1, 2, 3]"), dtype="S"))

    corpus["sample_rate as a list"] = Hostile(_write(folder / "sample_rate as a list.h5", rate_as_list, None), "focal-plane", "sample_rate", "must be a number")
    return corpus


def _with_meta_value(lines: list[str], key: str, value: str, prefix: str = "") -> list[str]:
    """Header lines (each starting with ``prefix``) with the quantity ``key`` (three lines, as astropy writes
    it) replaced by ``value``; a unit anchored in it is written out where other lines alias it."""
    index = next(i for i, line in enumerate(lines) if line.startswith(f"{prefix}- {key}: "))
    removed = lines[index : index + 3]
    anchors = dict(re.findall(r"&(id\d+) (!astropy\.units\.Unit \{[^}]*\})", "\n".join(removed)))
    out = [*lines[:index], f"{prefix}- {key}: {value}", *lines[index + 3 :]]
    for anchor, unit in anchors.items():
        out = [line.replace(f"*{anchor}", unit) for line in out]
    return out


def billion_laughs_lines(levels: int = 9) -> list[str]:
    """YAML of nine levels of nine aliases each (10^9 strings when expanded) in an ECSV header's datatype."""
    lines = ["datatype:", "- {name: name, datatype: string}", "meta:", '  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"  l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    return lines


# --------------------------------------------------------------------------- schedules

START = datetime(2027, 3, 1, tzinfo=UTC)


def good_ground_schedule(path: Path, scans: int = 2) -> Path:
    write_ground_schedule(
        path,
        [
            {"name": f"f{i}", "start": START + timedelta(hours=i), "stop": START + timedelta(hours=i, minutes=50),
             "az_min": 10.0, "az_max": 40.0, "el": 50.0}
            for i in range(scans)
        ],
        site_lat_deg=-22.96,
        site_lon_deg=-67.79,
    )
    return path


def good_satellite_schedule(path: Path, scans: int = 2) -> Path:
    write_satellite_schedule(
        path,
        [
            {"name": f"d{i}", "start": START + timedelta(hours=i), "stop": START + timedelta(hours=i, minutes=50),
             "prec_period": 10.0, "spin_period": 2.0}
            for i in range(scans)
        ],
    )
    return path


def _rewrite(source: Path, target: Path, change: Callable[[str], str]) -> Path:
    target.write_text(change(source.read_text()))
    return target


def schedule_corpus(folder: Path) -> dict[str, Hostile]:
    """Every hostile schedule, by name, written under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ground = good_ground_schedule(folder / ".ground.ecsv")
    satellite = good_satellite_schedule(folder / ".satellite.ecsv")
    corpus: dict[str, Hostile] = {}
    laughs = "\n".join("#   " + line.strip() for line in billion_laughs_lines()[3:])

    def add(name: str, base: Path, kind: str, column: str, words: str, change: Callable[[str], str]) -> None:
        corpus[name] = Hostile(_rewrite(base, folder / f"{name}.ecsv", change), kind, column, words)

    def quantity(key: str, replacement: str) -> Callable[[str], str]:
        return lambda text: "\n".join(_with_meta_value(text.splitlines(), key, replacement, prefix="# ")) + "\n"

    add("ground aliases", ground, "ground-schedule", "", "aliases",
        lambda t: t.replace("# - {site_name: site}", "# - site_name: site\n# - laughs:\n" + laughs))  # fmt: skip
    add("satellite aliases", satellite, "satellite-schedule", "", "aliases",
        lambda t: t.replace("# - {site_name: space}", "# - site_name: space\n# - laughs:\n" + laughs))  # fmt: skip
    add("header too large", ground, "ground-schedule", "", "header is larger than 65536",
        lambda t: t.replace("# - {site_name: site}", "# - site_name: site\n" + "\n".join(f"# - note{i}: {'x' * 200}" for i in range(400))))  # fmt: skip
    add("site_lat as a list", ground, "ground-schedule", "site_lat", "must be a number", quantity("site_lat", "[-22.9, 1, 2]"))
    add("site_lat as text", ground, "ground-schedule", "site_lat", "must be a number", quantity("site_lat", "north of here"))
    add("site_lon as a mapping", ground, "ground-schedule", "site_lon", "must be a number", quantity("site_lon", "{a: 1}"))
    add("site_lat out of range", ground, "ground-schedule", "site_lat", "within +-90", quantity("site_lat", "95.0"))
    add("azmin as text", ground, "ground-schedule", "azmin", "must hold numbers",
        lambda t: t.replace("{name: azmin, unit: deg, datatype: float64}", "{name: azmin, datatype: string}"))  # fmt: skip
    add("el as json cells", ground, "ground-schedule", "el", "type that is not read",
        lambda t: t.replace("{name: el, unit: deg, datatype: float64}", "{name: el, datatype: string, subtype: json}"))  # fmt: skip
    add("spin_period as text", satellite, "satellite-schedule", "spin_period", "must hold numbers",
        lambda t: t.replace("{name: spin_period, unit: min, datatype: float64}", "{name: spin_period, datatype: string}"))  # fmt: skip
    add("time mixin", satellite, "satellite-schedule", "", "other than quantities",
        lambda t: t.replace("__class__: astropy.units.quantity.Quantity", "__class__: astropy.time.core.Time", 1))  # fmt: skip
    return corpus


# --------------------------------------------------------------------------- a large file that is fine


def large_focal_plane(path: Path, written: int = 10_000, declared: int = 10**6) -> Path:
    """A focal plane declaring ``declared`` detectors of which the first ``written`` are real ones (saved by
    TOAST, named D0, D1, ...); the rest are the dataset's fill value, zeros, which no check would pass (a zero
    quaternion), so a check that reads past ``written`` rows refuses the file. Chunked and compressed: a few
    hundred KB on disk."""
    good = good_focal_plane(path.with_name(f".{path.name}"), n=written)
    with h5py.File(good, "r") as source, h5py.File(path, "w") as target:
        rows = source[TABLE][()]
        table = target.create_dataset(TABLE, shape=(declared,), dtype=rows.dtype, chunks=(1024,), compression="gzip")
        table[:written] = rows
        target.create_dataset(META, data=source[META][()])
    good.unlink()
    return path


def spec_for(hostile: Hostile, file: str, sha256: str) -> dict:
    """A campaign's spec data naming the file (a focal plane's first 4 detectors, or the schedule)."""
    from tests.support.service_helpers import spec_data

    data = spec_data()
    if hostile.kind == "focal-plane":
        data["focal_plane"] = {"sample_rate_hz": 5.0, "file": file, "sha256": sha256, "select": {"first": 4}}
    else:
        data["scan"] = {"kind": hostile.kind, "file": file, "sha256": sha256, "chunk_s": 600.0}
    return data
