"""The product speaks of the product: no development history in its files.

How a thing came to be lives in git; a file of the product says what it is and why. The words looked for are
those of a development diary: a tracker number, an ordinal followed by the word for an iteration, who worked on
what in which sitting. An upstream reference ("llama.cpp issue #20824") is a citation and is allowed. The examples
below are assembled from parts so that this file does not itself read as a diary.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
             "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty-\\w+|thirtieth|"
             "\\d+(?:st|nd|rd|th)|earlier|previous|last|this|next")
HISTORY = re.compile(
    r"(?<![#\w])issue\s+\d+"                                  # a tracker number (an upstream "#123" is a citation)
    rf"|\b(?:{_ORDINALS})(?:\s+and\s+(?:{_ORDINALS}))?\s+rounds?\b"   # an ordinal iteration, one or two of them
    r"|\b(?:this|last|previous|earlier)\s+session's\s+(?:work|measurement|run)"
    r"|\b(?:a|the|another)\s+" + "hel" + r"per(?:'s)?\s+(?:session|agent|measured|found)",
    re.IGNORECASE)

_ISSUE = "iss" + "ue 18"      # the examples' parts (see the module docstring)
_ROUND = "ro" + "und"

#: what the product is made of (git-tracked text files outside the tests' own data)
_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".ipynb", ""}


def product_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = []
    for name in out:
        p = ROOT / name
        if name.startswith(("tests/data/", ".git")) or p.suffix not in _SUFFIXES or not p.is_file():
            continue
        files.append(p)
    return files


def history_lines(text: str) -> list[tuple[int, str]]:
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


@pytest.mark.parametrize("text", [
    "calibration measured until " + _ISSUE + ", seventh " + _ROUND,
    "# fits since " + _ISSUE + ", 17th " + _ROUND + ", name their points",
    "(benchmarks/RESULTS.md, fifteenth and sixteenth " + _ROUND + "s)",
    "as the previous " + _ROUND + " found",
])
def test_history_words_are_found(text):
    assert history_lines(text), text


@pytest.mark.parametrize("text", [
    "AMX off: llama.cpp issue #20824",
    "one round trip to the server",
    "rounded up to 8",
    "the llama.cpp session's saved state",
])
def test_product_words_pass(text):
    assert not history_lines(text), text


def test_a_planted_history_line_fails_the_check(tmp_path):
    planted = tmp_path / "module.py"
    line = "# measured in " + _ISSUE + ", seventh " + _ROUND
    planted.write_text('"""A module."""\n' + line + "\nX = 1\n")
    assert history_lines(planted.read_text()) == [(2, line)]


def test_no_development_history_in_the_product():
    found = [f"{p.relative_to(ROOT)}:{i}: {line[:120]}"
             for p in product_files()
             for i, line in history_lines(p.read_text(errors="replace"))]
    assert not found, "development history in product files (say what and why; history lives in git):\n" + \
        "\n".join(found[:40]) + (f"\n… and {len(found) - 40} more" if len(found) > 40 else "")


def test_the_package_does_not_send_its_reader_to_the_results_page():
    """A module says why in its own words; benchmarks/RESULTS.md is where figures live, not reasons."""
    found = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "v100lab").rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if "RESULTS.md" in line]
    assert not found, "the package cites benchmarks/RESULTS.md: " + ", ".join(found)
