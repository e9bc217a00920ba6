"""The documentation: the site builds offline with --strict, generated pages match the code, the README's
runnable blocks run and its spec is the bundled demo, and results pages come from benchmark JSON only."""

from __future__ import annotations

import importlib.machinery
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from schemas.io import parse_spec_text

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
# A page may load nothing from another host: no CDN script, stylesheet or font.
REMOTE_ASSET = re.compile(r"""<(?:script|link|img)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.IGNORECASE)

pytestmark = pytest.mark.docs


def run(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=600, env=env, check=False)


def readme_blocks() -> list[tuple[str, str]]:
    return [(match["info"].strip(), match["body"]) for match in FENCE.finditer(README.read_text())]


def load_script(name: str) -> types.ModuleType:
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(REPO / "scripts" / name))
    module = types.ModuleType(loader.name)
    module.__file__ = loader.path
    loader.exec_module(module)
    return module


def test_the_site_builds_strictly_and_loads_nothing_from_the_network(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"}
    done = run(sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site), env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        remote = REMOTE_ASSET.findall(page.read_text())
        assert not remote, f"{page.relative_to(site)} loads {remote}"
    # the offline plugin inlines the search index, so search works from file:// too
    assert (site / "search" / "search_index.js").is_file()
    assert (site / "reference" / "rest-api.html").is_file()


def test_generated_reference_pages_match_the_code():
    done = run(sys.executable, str(REPO / "scripts" / "docs-reference"), "--check")
    assert done.returncode == 0, done.stderr


def test_results_pages_match_their_json():
    done = run(sys.executable, str(REPO / "scripts" / "docs-results"), "--check")
    assert done.returncode == 0, done.stderr


def test_a_results_page_is_made_from_the_recorded_json_alone(tmp_path):
    docs_results = load_script("docs-results")
    record = {
        "name": "fft",
        "date": "2026-01-02T03:04:05Z",
        "command": ".venv/bin/python benchmarks/bench_fft.py --json",
        "commit": "0123abcd",
        "machine": {"cpu": "Example CPU", "cores": 2},
        "result": {"four_step_min_samples": 262144,
                   "lengths": [{"samples": 36000, "ratio": 0.8375}, {"samples": 720000, "ratio": 1.4312}]},
    }
    (tmp_path / "fft-20260102T030405Z.json").write_text(json.dumps(record))
    page = docs_results.pages(tmp_path)["fft"]
    assert "`.venv/bin/python benchmarks/bench_fft.py --json`" in page
    assert "`0123abcd`" in page and "cpu Example CPU, cores 2" in page
    assert "| four_step_min_samples | 262144 |" in page
    assert "| samples | ratio |" in page
    assert "| 36000 | 0.8375 |" in page and "| 720000 | 1.431 |" in page
    index = docs_results.index_page(
        f"# Results\n\n{docs_results.INDEX_START}\nold\n{docs_results.INDEX_END}\n", ["fft"]
    )
    assert "- [fft](fft.md)" in index and "old" not in index


def test_the_readme_fits_on_two_screens():
    assert len(README.read_text().splitlines()) <= 150


def test_the_readme_spec_is_the_bundled_demo_and_valid():
    (spec,) = [body for info, body in readme_blocks() if info.startswith("toml")]
    demo = (REPO / "schemas" / "examples" / "demo.toml").read_text()
    demo_without_heading = "\n".join(line for line in demo.splitlines() if not line.startswith("#")) + "\n"
    assert spec.strip() == demo_without_heading.strip()
    assert parse_spec_text(spec, ".toml").realizations >= 1


def test_the_readme_runnable_blocks_run(tmp_path):
    """Blocks marked ```sh runnable run line by line from a folder holding the README's titled files."""
    for info, body in readme_blocks():
        title = re.search(r'title="([^"]+)"', info)
        if title:
            (tmp_path / title[1]).write_text(body)
    runnable = [body for info, body in readme_blocks() if info.split()[:2] == ["sh", "runnable"]]
    assert runnable, "the README marks no block runnable"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "MAPCAMPAIGN_DATA_DIR": str(tmp_path / "data"),
    }
    for body in runnable:
        for line in body.splitlines():
            command = line.split("#", 1)[0].strip()
            if command:
                done = run("bash", "-c", command, cwd=tmp_path, env=env)
                assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"


def test_the_readme_links_point_at_files_that_exist():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [target for target in targets if not re.match(r"[a-z]+:", target)]
    assert local
    missing = [target for target in local if not (REPO / target).exists()]
    assert not missing


def test_every_python_block_of_the_docs_compiles():
    pages = [README, *sorted((REPO / "docs").rglob("*.md"))]
    blocks = [
        (page, match["body"]) for page in pages for match in FENCE.finditer(page.read_text())
        if match["info"].strip().split()[:1] == ["python"]
    ]
    assert len(blocks) >= 4
    for page, body in blocks:
        compile(textwrap.dedent(body), f"{page.relative_to(REPO)}", "exec")
