"""Figures the reliability tests measure, printed at the end of the run and kept in a report file.

A test calls ``record("load", "throughput: 812 requests/s")``; the session-finish hook in
``tests/reliability/conftest.py`` prints every recorded line in pytest's terminal summary
(shown with or without ``-s``) and writes them to ``artifacts/reliability/report.txt``.
"""

from __future__ import annotations

from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "artifacts" / "reliability" / "report.txt"
FIGURES: list[tuple[str, str]] = []


def record(section: str, line: str) -> None:
    FIGURES.append((section, line))


def report_text() -> str:
    sections: dict[str, list[str]] = {}
    for section, line in FIGURES:
        sections.setdefault(section, []).append(line)
    return "\n".join(f"[{section}]\n" + "\n".join(f"  {line}" for line in lines) for section, lines in sections.items())
