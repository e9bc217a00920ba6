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
# YAML nodes that aliases may add to a document beyond its own: TOAST's table headers alias a unit a few
# dozen times; a "billion laughs" (aliases of lists of aliases) would add billions and is refused unbuilt.
MAX_YAML_ALIAS_NODES = 10_000


class YamlAliasError(ValueError):
    """YAML whose aliases would expand the document beyond :data:`MAX_YAML_ALIAS_NODES`, or refer to themselves."""


def _alias_nodes_added(root: Any) -> int:
    """How many nodes the aliases of a composed YAML graph add when it is built into Python objects.

    PyYAML composes an alias as a second reference to the anchored node, so the graph stays as small as
    the text; the objects built from it are shared too, but a reader that walks them (a copy, a
    validation, a JSON dump) visits every reference. Counted with a memo per node (linear in the graph)
    and capped just above the limit. A node that contains itself is refused.
    """
    import yaml

    cap = MAX_YAML_ALIAS_NODES + 1
    expanded: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Any) -> int:  # nodes of the subtree with every alias expanded, at most ``cap`` beyond one
        key = id(node)
        if key in expanded:
            return expanded[key]
        if key in open_nodes:
            raise YamlAliasError("an alias refers to a node that contains it")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[Any] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total = min(total + size(child), 1 << 62)
        open_nodes.discard(key)
        expanded[key] = total
        return total

    distinct: set[int] = set()
    stack = [root]
    while stack:  # the graph's own nodes, each once
        node = stack.pop()
        if id(node) in distinct:
            continue
        distinct.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
    return max(0, min(size(root) - len(distinct), cap))


def compose_yaml(text: str) -> tuple[Any, Any]:
    """The loader and the composed node of one YAML document (None: empty), its aliases bounded.

    Raises :class:`YamlAliasError` when aliases would add more than :data:`MAX_YAML_ALIAS_NODES` nodes or
    refer to themselves, ``yaml.YAMLError`` on bad text, before any Python object is built. The caller
    disposes of the loader.
    """
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            try:
                added = _alias_nodes_added(node)
            except RecursionError:
                raise YamlAliasError("the document nests too deeply") from None
            if added > MAX_YAML_ALIAS_NODES:
                raise YamlAliasError(f"its aliases would add more than {MAX_YAML_ALIAS_NODES} nodes to the document")
    except BaseException:
        loader.dispose()
        raise
    return loader, node


def check_yaml_aliases(text: str) -> None:
    """Refuse YAML text whose aliases expand beyond the bound (:func:`compose_yaml`) without building it."""
    loader, _node = compose_yaml(text)
    loader.dispose()


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of one document, its aliases bounded first (:func:`compose_yaml`)."""
    loader, node = compose_yaml(text)
    try:
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


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
            return load_yaml(text)
        if suffix == ".json":
            return json.loads(text)
    except Exception as error:  # noqa: BLE001 - TOMLDecodeError, JSONDecodeError, yaml.YAMLError, YamlAliasError: all mean bad text
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
