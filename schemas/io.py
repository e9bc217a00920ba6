"""Read campaign specs from TOML, YAML or JSON files, with errors that name the field."""
from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from schemas.spec import CampaignSpec

SPEC_SUFFIXES = (".toml", ".yaml", ".yml", ".json")
MAX_SPEC_BYTES = 1 << 20


class SpecError(ValueError):
    """A spec file that cannot be read or does not validate.

    ``problems`` holds one ``(field path, reason)`` pair per error; the field
    path is dotted (``focal_plane.detectors.0.name``) and empty for a file-level
    problem.
    """

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: " + (f"{loc}: {msg}" if loc else msg) for loc, msg in problems]
        super().__init__("\n".join(lines))


# The discriminators of the spec's unions (scan and sky kinds): pydantic puts them in an error's location.
UNION_TAGS = ("satellite", "ground", "ground-schedule", "satellite-schedule", "cmb", "map", "none")


def format_location(loc: tuple[Any, ...]) -> str:
    """Dotted field path from a pydantic error location, without union tags."""
    return ".".join(str(part) for part in loc if part not in UNION_TAGS)


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold: through Annotated, unions, optionals and containers."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in get_args(annotation) for model in _model_types(argument)]


def field_suggestion(root: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """A known field close to the unknown key at the end of ``loc`` (a pydantic error location under
    ``root``), e.g. ``realizations`` for ``("realisations",)``; None when nothing is close."""
    models = [root]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an index into a list: the same element models
        inner = [field.annotation for model in models if (field := model.model_fields.get(str(part)))]
        if inner:
            models = [model for annotation in inner for model in _model_types(annotation)]
        else:  # a union's tag (``ground``): the member whose ``kind`` it is
            tagged = [model for model in models if (kind := model.model_fields.get("kind")) and kind.default == part]
            models = tagged or models
    known = sorted({name for model in models for name in model.model_fields})
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.7) if loc else []
    return close[0] if close else None


# What pydantic puts before the message of a validator's ValueError or assert: noise to a reader.
PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def plain_message(message: str) -> str:
    """A pydantic error message without the prefix pydantic adds to a validator's own message."""
    for prefix in PYDANTIC_PREFIXES:
        message = message.removeprefix(prefix)
    return message


def problem_message(root: type[BaseModel], item: Mapping[str, Any]) -> str:
    """A pydantic error's message, with "did you mean" for an unknown field that is close to a known one."""
    message = plain_message(str(item.get("msg", "")))
    if item.get("type") == "extra_forbidden":
        suggestion = field_suggestion(root, tuple(item.get("loc", ())))
        if suggestion:
            message = f"unknown field; did you mean {suggestion!r}?"
        else:
            message = "unknown field (not one of this section's fields; see the spec reference)"
    return message


def validation_problems(error: ValidationError) -> list[tuple[str, str]]:
    return [(format_location(item["loc"]), problem_message(CampaignSpec, item)) for item in error.errors()]


def parse_spec_text(text: str, suffix: str, source: str = "<spec>") -> CampaignSpec:
    """Parse and validate spec text in the format given by ``suffix`` (".toml", ".yaml", ".json")."""
    data = _parse(text, suffix.lower(), source)
    return spec_from_data(data, source)


def spec_from_data(data: Any, source: str = "<spec>") -> CampaignSpec:
    if not isinstance(data, dict):
        raise SpecError(source, [("", "the spec must be a table/mapping at the top level")])
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(source, validation_problems(error)) from None


def load_spec(path: str | Path) -> CampaignSpec:
    """Read and validate one spec file; raise :class:`SpecError` naming the file and field."""
    path = Path(path)
    if path.suffix.lower() not in SPEC_SUFFIXES:
        raise SpecError(str(path), [("", f"unknown spec format {path.suffix!r}; use one of {', '.join(SPEC_SUFFIXES)}")])
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise SpecError(str(path), [("", f"cannot read the file: {error.strerror or error}")]) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(str(path), [("", f"file is larger than {MAX_SPEC_BYTES} bytes")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(str(path), [("", "file is not UTF-8 text")]) from None
    return parse_spec_text(text, path.suffix, str(path))


def _parse(text: str, suffix: str, source: str) -> Any:
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        if suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
        if suffix == ".json":
            return json.loads(text)
    except Exception as error:  # noqa: BLE001 - TOMLDecodeError, JSONDecodeError, yaml.YAMLError: all mean bad text
        raise SpecError(source, [("", f"not valid {suffix.lstrip('.').upper()}: {error}")]) from None
    raise SpecError(source, [("", f"unknown spec format {suffix!r}")])


EXAMPLE_NAMES = ("demo", "satellite", "ground")


def example_spec_text(name: str) -> str:
    """TOML text of a bundled example spec (``demo``, ``satellite``, ``ground``), read as package data so that
    it works from an installed wheel as well as from a checkout."""
    from importlib.resources import files

    resource = files("schemas") / "examples" / f"{name}.toml"
    if not resource.is_file():
        raise FileNotFoundError(f"no bundled example {name!r}; available: {', '.join(EXAMPLE_NAMES)}")
    return resource.read_text(encoding="utf-8")


def load_example_spec(name: str) -> CampaignSpec:
    return parse_spec_text(example_spec_text(name), ".toml", f"bundled example {name}.toml")


def example_spec_path(name: str) -> Path:
    """Path of a bundled example spec on disk (a checkout or an unpacked install)."""
    from importlib.resources import as_file, files

    with as_file(files("schemas") / "examples" / f"{name}.toml") as path:
        if not path.is_file():
            raise FileNotFoundError(f"no bundled example {name!r}; available: {', '.join(EXAMPLE_NAMES)}")
        return Path(path)
