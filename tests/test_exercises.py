"""Every notebook's "try it" answer (exercises.what_if), built for the notebook's default scenario with predictions
only: it changes something, on the subject the lesson is about, and shows the quantity the question asks for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from v100lab.workbook.levers import exercises, steps
from v100lab.workbook.scenario import from_notebook

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
SOURCES = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))

# the row each question is about: it must differ between "now" and the change
ASKED = {"00": "decode at depth 0", "01": "KV cache", "02": "bandwidth ceiling", "03": "KV cache",
         "04": "memory on the device", "05": "decode at depth 0", "06": "KV cache", "07": "decode halfway",
         "08": "prompt steps", "09": "prompt processing", "10": "slots × context each",
         "11": "load time", "12": "decode halfway", "13": "decode with",
         "14": "CUDA architecture"}
# lessons about a GPU: answered for the seed's model on the GPU beside this machine, not the CPU's small model
ON_GPU = {"00", "01", "05", "12", "14"}


# this machine as the answers see it: an uncalibrated CPU of a fixed memory bandwidth, slow, middling and fast, so
# that no answer depends on the bandwidth the machine running the tests happens to measure
HOST_GBS = (10.0, 35.0, 80.0)


@pytest.fixture(params=HOST_GBS, ids=[f"{g:g}GBs" for g in HOST_GBS])
def fixed_host(request, fresh_cache):
    from v100lab.facts import devices

    devices.write_host_profile({"id": "host", "name": "host CPU (test)", "kind": "cpu", "memory_gib": 16.0,
                                "bandwidth_gbs": request.param, "fingerprint": devices.host_fingerprint()})
    return request.param


def _cells(path: Path) -> list[str]:
    return re.split(r"^# %%", path.read_text(encoding="utf-8"), flags=re.M)


def _answer(path: Path):
    cells = _cells(path)
    params = next(c for c in cells if 'tags=["parameters"]' in c.splitlines()[0])
    ns: dict = {}
    exec("from typing import Optional\n" + params.split("\n", 1)[1], ns)
    ns["measure"] = False
    sc = from_notebook(ns)
    expr = re.fullmatch(r"render\.text_table\((exercises\.what_if\(.+\))\)", cells[-1].split("\n", 1)[1].strip()).group(1)
    return sc, eval(expr, {"exercises": exercises, "sc": sc})   # the answer cell's own call, predictions only


@pytest.mark.parametrize("path", SOURCES, ids=[p.stem for p in SOURCES])
def test_every_answer_changes_what_its_question_asks(path, fixed_host):
    sc, df = _answer(path)
    now, after = df.columns[1], df.columns[2]
    differs = df[df[now] != df[after]]
    assert len(differs), f"{path.stem}: the answer's two columns are identical"
    rows = dict(zip(df[""], zip(df[now], df[after])))
    asked = [k for k in rows if k.startswith(ASKED[path.stem[:2]])]
    assert asked, f"{path.stem}: no row for {ASKED[path.stem[:2]]!r}"
    assert rows[asked[0]][0] != rows[asked[0]][1], f"{path.stem}: {asked[0]} does not change"
    on_gpu = steps.beside(sc)
    if path.stem[:2] in ON_GPU and on_gpu is not None:
        assert rows["device"][0] == on_gpu.device.name and on_gpu.label in rows["model and quant"][0], path.stem


def test_the_gpu_answer_swaps_the_gpu_not_this_machine(fixed_host):
    sc, df = _answer(NB_DIR / "00_overview.py")
    rows = dict(zip(df[""], zip(df[df.columns[1]], df[df.columns[2]])))
    assert rows["device"][0] != rows["device"][1] and "T4" in rows["device"][1]
    before = float(rows["bandwidth ceiling (tok/s)"][0].replace(",", ""))
    after = float(rows["bandwidth ceiling (tok/s)"][1].replace(",", ""))
    assert after < before, "a card with less bandwidth has a lower bandwidth ceiling"
