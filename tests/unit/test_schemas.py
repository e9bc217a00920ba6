"""Campaign spec validation, hashes and spec-file loading."""
import json

import pytest
from pydantic import ValidationError

from schemas.io import SpecError, example_spec_path, load_spec, parse_spec_text, spec_from_data
from schemas.spec import CampaignSpec, scan_key, spec_hash


@pytest.fixture
def base() -> dict:
    return load_spec(example_spec_path("demo")).model_dump(mode="json")


def with_change(data: dict, dotted: str, value) -> CampaignSpec:
    data = json.loads(json.dumps(data))
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return CampaignSpec.model_validate(data)


@pytest.mark.parametrize("name", ["demo", "satellite", "ground"])
def test_bundled_examples_validate(name):
    spec = load_spec(example_spec_path(name))
    assert spec.total_samples > 0
    assert len(scan_key(spec)) == 64


@pytest.mark.parametrize(
    "dotted, value",
    [
        ("noise.f_knee_hz", 0.3),
        ("noise.net_k_sqrt_s", 1e-3),
        ("sky.seed", 99),
        ("sky.fwhm_arcmin", 30.0),
        ("solver.tol", 1e-9),
        ("solver.reduction", "alltoallv"),
        ("seed", 5),
        ("realizations", 100),
        ("name", "another name"),
        ("resources.walltime_s", 60.0),
        ("focal_plane.detectors.0.net_k_sqrt_s", 2e-4),
    ],
)
def test_scan_key_ignores_what_does_not_fix_pointing(base, dotted, value):
    assert scan_key(with_change(base, dotted, value)) == scan_key(CampaignSpec.model_validate(base))


@pytest.mark.parametrize(
    "dotted, value",
    [
        ("pixelization.nside", 64),
        ("focal_plane.sample_rate_hz", 20.0),
        ("focal_plane.detectors.0.pol_angle_deg", 10.0),
        ("focal_plane.detectors.1.offset_y_deg", 0.2),
        ("scan.spin_period_s", 61.0),
        ("scan.duration_s", 7200.0),
        ("scan.chunk_s", 900.0),
    ],
)
def test_scan_key_follows_pointing(base, dotted, value):
    assert scan_key(with_change(base, dotted, value)) != scan_key(CampaignSpec.model_validate(base))


def test_spec_hash_counts_defaults_as_given(base):
    spec = CampaignSpec.model_validate(base)
    minimal = {"name": spec.name, "focal_plane": base["focal_plane"]}
    explicit = CampaignSpec.model_validate(minimal).model_dump(mode="json")
    assert spec_hash(CampaignSpec.model_validate(minimal)) == spec_hash(CampaignSpec.model_validate(explicit))
    assert spec_hash(spec) != spec_hash(with_change(base, "seed", spec.seed + 1))


def test_a_campaign_stored_with_the_earlier_solver_defaults_keeps_them_and_its_hash(base):
    """A stored campaign's spec is its full dump: the preconditioner and coarse nside it was submitted with
    (two-level-additive at coarse nside 2, the defaults before ``auto``) are in it, stay, and hash as they did."""
    import hashlib

    from schemas.spec import FIELDS_ADDED_LATER

    stored = json.loads(json.dumps(base))
    stored["solver"].update(preconditioner="two-level-additive", coarse_nside=2)
    spec = CampaignSpec.model_validate(stored)
    assert (spec.solver.preconditioner, spec.solver.coarse_nside) == ("two-level-additive", 2)
    hashed = {key: value for key, value in stored.items() if key != "realizations"}
    for section, name in FIELDS_ADDED_LATER:
        hashed[section].pop(name, None)
    expected = hashlib.sha256(json.dumps(hashed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert spec_hash(spec) == expected
    assert spec_hash(spec) != spec_hash(CampaignSpec.model_validate(base))  # the default is auto now


def test_noise_off_string(base):
    spec = with_change(base, "noise", "off")
    assert not spec.noise.enabled and not spec.simulates_noise


@pytest.mark.parametrize(
    "dotted, value, field, words",
    [
        ("pixelization.nside", 48, "pixelization.nside", "power of two"),
        ("pixelization.nside", 16384, "pixelization.nside", "less than or equal"),
        ("realizations", 100_001, "realizations", "less than or equal"),
        ("resources.ranks", 70_000, "resources.ranks", "less than or equal"),
        ("scan.spin_period_s", -1, "scan.spin_period_s", "greater than 0"),
        ("focal_plane.detectors.0.name", "../etc", "focal_plane.detectors.0.name", "detector names"),
        ("focal_plane.detectors.1.name", "A0", "focal_plane.detectors", "more than once"),
        ("solver.reduction", "gossip", "solver.reduction", "Input should be"),
        ("noise.f_min_hz", 1.0, "noise", "below f_knee_hz"),
        ("sky", {"kind": "map", "path": "../../etc/passwd.fits"}, "sky.path", "'..'"),
        ("sky", {"kind": "map", "path": "/etc/sky.fits"}, "sky.path", "not absolute"),
        ("sky", {"kind": "map", "path": "maps/sky.txt"}, "sky.path", "FITS"),
        ("name", "bad\x00name", "name", "control characters"),
        ("scan.chunk_s", 1e9, "scan", "chunk_s"),
    ],
)
def test_bad_values_name_the_field(base, dotted, value, field, words):
    with pytest.raises(ValidationError) as caught:
        with_change(base, dotted, value)
    errors = caught.value.errors()
    locations = [".".join(str(p) for p in e["loc"] if p not in ("satellite", "ground", "cmb", "map", "none")) for e in errors]
    assert field in locations, locations
    assert any(words in e["msg"] for e in errors), [e["msg"] for e in errors]


def test_unknown_fields_are_refused(base):
    base["solver"]["tolerance"] = 1e-3
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        CampaignSpec.model_validate(base)


@pytest.mark.parametrize(
    "dotted, value, kind",
    [
        ("pixelization.nside", True, "a boolean"),
        ("pixelization.nside", "16", "a string"),
        ("focal_plane.sample_rate_hz", True, "a boolean"),
        ("realizations", "8", "a string"),
        ("noise.f_knee_hz", False, "a boolean"),
        ("focal_plane.detectors.0.offset_x_deg", "0.5", "a string"),
        ("resources.ranks_per_node", True, "a boolean"),  # an optional number
    ],
)
def test_booleans_and_strings_are_not_numbers(base, dotted, value, kind):
    """Lax pydantic would run ``nside = true`` as nside 1 and ``"16"`` as 16: both are refused at their path."""
    with pytest.raises(ValidationError) as caught:
        with_change(base, dotted, value)
    [error] = caught.value.errors()
    assert ".".join(str(part) for part in error["loc"]) == dotted
    assert error["msg"] == f"Input should be a number, not {kind} ({value!r})"


def test_whole_floats_still_serve_as_integers(base):
    assert with_change(base, "pixelization.nside", 16.0).pixelization.nside == 16


@pytest.mark.parametrize(
    "dotted, value, field, message",
    [
        ("realisations", 3, "realisations", "unknown field; did you mean 'realizations'?"),
        ("solver.rcondmin", 0.1, "solver.rcondmin", "unknown field; did you mean 'rcond_min'?"),
        ("focal_plane.detectors.0.pol_angle", 3.0, "focal_plane.detectors.0.pol_angle",
         "unknown field; did you mean 'pol_angle_deg'?"),
        ("scan.spin_period", 30.0, "scan.spin_period", "unknown field; did you mean 'spin_period_s'?"),
        ("solver.bogus", 1, "solver.bogus", "unknown field (not one of this section's fields; see the spec reference)"),
    ],
)
def test_unknown_fields_name_a_close_match(base, dotted, value, field, message):
    data = json.loads(json.dumps(base))
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    with pytest.raises(SpecError) as caught:
        spec_from_data(data)
    assert caught.value.problems == [(field, message)]


def test_a_ground_scan_suggests_its_own_fields(base):
    """The scan is a union: the suggestion comes from the member the spec's ``kind`` names."""
    data = json.loads(json.dumps(base))
    data["scan"] = {"kind": "ground", "azimuth_mn_deg": -10.0}
    with pytest.raises(SpecError) as caught:
        spec_from_data(data)
    assert caught.value.problems == [("scan.azimuth_mn_deg", "unknown field; did you mean 'azimuth_min_deg'?")]


def test_spec_files_in_three_formats(tmp_path, base):
    import tomllib  # noqa: F401  (stdlib, the loader's TOML parser)

    import yaml

    (tmp_path / "a.json").write_text(json.dumps(base))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(base))
    specs = [load_spec(tmp_path / "a.json"), load_spec(tmp_path / "a.yaml"), load_spec(example_spec_path("demo"))]
    assert len({spec_hash(s) for s in specs}) == 1


def test_spec_error_names_file_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[focal_plane]\nsample_rate_hz = -3\ndetectors = [{name = "d"}]\n')
    with pytest.raises(SpecError) as caught:
        load_spec(bad)
    assert ("focal_plane.sample_rate_hz", "Input should be greater than 0") in caught.value.problems
    assert str(bad) in str(caught.value)


def test_unparsable_file_is_a_spec_error():
    with pytest.raises(SpecError, match="not valid TOML"):
        parse_spec_text("name = ", ".toml", "broken.toml")
