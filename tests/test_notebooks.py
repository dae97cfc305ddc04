"""The workbook's notebooks: one lever each, in the course's order; edited as text (jupytext pairs in sync);
committed without outputs; each parameters cell holds exactly the keys its notebook reads; no formulas or
loops except in the by-hand cells, which check their arithmetic against the package; and every notebook
executes with papermill on params/ci.yaml (real llama.cpp runs).

The execution tests are the slow part (each notebook measures with the small CI scenario); they run the
notebooks exactly as ``papermill notebooks/X.ipynb out.ipynb -f params/ci.yaml`` would.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from v100lab.workbook.levers import by_hand, ceiling, offload, steps, triangle
from v100lab.facts.config import RunConfig
from v100lab.workbook.levers.course import LESSONS, keys_of
from v100lab.workbook.scenario import keys, parameters_cell_source, read_parameters
from v100lab.workbook.runner import KERNEL_NAME, find_notebooks, parameters_cell, read_headline, sync_parameters_cell

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
CI_PARAMS = ROOT / "params" / "ci.yaml"
EXPECTED = tuple(lesson.notebook for lesson in LESSONS)
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
BY_HAND = "by-hand"
PAIR_FORMATS = "ipynb,py:percent"


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _code_after_parameters(nb):
    start = nb.cells.index(parameters_cell(nb)) + 1
    return [(i, c) for i, c in enumerate(nb.cells[start:], start=start) if c.cell_type == "code"]


# ------------------------------------------------------------------------------------------------
# the course
# ------------------------------------------------------------------------------------------------

def test_the_notebooks_are_the_course_in_order():
    assert [p.stem for p in NOTEBOOKS] == list(EXPECTED), "notebooks/ and course.LESSONS disagree"
    assert [p.stem for p in find_notebooks(str(NB_DIR / "[0-9][0-9]_*.ipynb"))] == list(EXPECTED), \
        "v100lab batch's discovery must find every notebook, in the course's order"
    assert EXPECTED[0] == "00_overview"
    # the final configuration puts together every lever before it; a lever it does not tune may follow it
    final = next(i for i, name in enumerate(EXPECTED) if name.endswith("_final_config"))
    assert all(name.startswith(("13_speculative", "14_build")) for name in EXPECTED[final + 1:]), EXPECTED[final + 1:]
    assert len({name[:2] for name in EXPECTED}) == len(EXPECTED), "numbers are unique"
    assert [int(name[:2]) for name in EXPECTED] == list(range(len(EXPECTED))), "numbered without gaps"
    assert not (NB_DIR / "make_notebooks.py").exists(), "the notebooks are edited as text now (jupytext)"


def test_one_lever_per_notebook():
    """No notebook sweeps two levers: the plotted lever= arguments of a notebook name one lever (00 and the
    final configuration show the staircase of stages, each stage one change)."""
    for path in NOTEBOOKS:
        code = "\n".join(c.source for c in _read(path).cells if c.cell_type == "code")
        swept = set(re.findall(r"plots\.sweep\([^)]*?lever=\"(\w+)\"", code, flags=re.S))
        assert len(swept) <= 1, f"{path.name} sweeps {sorted(swept)}"


def test_readme_lists_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = [m for m in re.findall(r"^\| `(\d\d_\w+)` \|", readme, flags=re.M)]
    assert table == list(EXPECTED), "README's notebook table must list the notebooks, in order"


# ------------------------------------------------------------------------------------------------
# jupytext pairs, no outputs
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_paired_with_a_text_source_in_sync(path):
    """Each notebook is a jupytext pair: NN_name.py (percent format, the source people edit and diff) and
    NN_name.ipynb (what papermill runs). Their cells must agree: type, source and tags, and which are
    collapsed. Fix with `jupytext --sync notebooks/NN_name.py` (the newer file wins)."""
    import jupytext

    py = path.with_suffix(".py")
    assert py.is_file(), f"{path.name} has no text source {py.name}"
    nb = _read(path)
    assert nb.metadata.get("jupytext", {}).get("formats") == PAIR_FORMATS, f"{path.name} is not paired"
    text = jupytext.read(py)
    assert text.metadata.get("jupytext", {}).get("formats") == PAIR_FORMATS, f"{py.name} is not paired"

    def cells(n):
        return [(c.cell_type, c.source, _tags(c), bool(c.metadata.get("jupyter", {}).get("source_hidden")))
                for c in n.cells]

    a, b = cells(nb), cells(text)
    assert len(a) == len(b), f"{path.name}: {len(a)} cells, {py.name}: {len(b)}; run jupytext --sync"
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"{path.name} cell {i} differs from {py.name}; run jupytext --sync {py}"


def test_every_text_source_has_its_notebook():
    for py in sorted(NB_DIR.glob("[0-9][0-9]_*.py")):
        assert py.with_suffix(".ipynb").is_file(), f"{py.name} has no .ipynb: jupytext --sync {py}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs(path):
    nb = _read(path)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert not cell.get("outputs"), f"{path.name} cell {i} has outputs: clear them before committing"
        assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
    assert "papermill" not in nb.metadata, f"{path.name} is an executed notebook (papermill metadata)"


# ------------------------------------------------------------------------------------------------
# parameters
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_parameters_cell_holds_the_keys_the_notebook_reads(path):
    nb = _read(path)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
        f"{path.name} must open with a markdown title"
    cell = parameters_cell(nb)
    assert cell is not None, f"{path.name} has no cell tagged 'parameters'"
    assert nb.cells.index(cell) == 1, f"{path.name}: the parameters cell must follow the title"
    assert cell.source == parameters_cell_source(keys_of(path)), (
        f"{path.name}: parameters cell differs from the schema's keys for it; "
        "run `python -m v100lab.workbook.runner` (rewrites every parameters cell, both files of each pair)")
    assert len(keys_of(path)) < len(keys()), f"{path.name} shows every key"
    validate = nb.cells[2]
    assert validate.cell_type == "code" and "from_notebook(globals())" in validate.source
    others = [c for _, c in _code_after_parameters(nb)[1:] if "from_notebook" in c.source]
    assert not others, f"{path.name}: exactly one validation cell"


def _modules_called(nb) -> set:
    """The levers modules whose functions the notebook's cells call (``MODULE.NAME(`` → MODULE)."""
    calls = set(re.findall(r"\b(\w+)\.\w+\(", "\n".join(c.source for c in nb.cells if c.cell_type == "code")))
    return {importlib.import_module(f"v100lab.workbook.levers.{m}") for m in calls
            if importlib.util.find_spec(f"v100lab.workbook.levers.{m}") is not None}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_the_notebooks_keys_are_read_by_its_steps(path):
    """Every key in a notebook's parameters cell is read by the code its cells call: ``sc.KEY`` in one of the
    levers modules it calls (a llama.cpp flag counts when that code builds ``sc.run_config()``), or it is one
    of the keys :func:`steps.study` reads. A key nobody reads would be a knob that does nothing."""
    nb = _read(path)
    source = "\n".join(inspect.getsource(m) for m in _modules_called(nb) | {steps})
    read = set(re.findall(r"\bsc\.(\w+)", source)) | set(steps.STUDY_PARAMETERS)
    if "run_config()" in source:
        read |= set(RunConfig.__dataclass_fields__)
    unread = [k for k in keys_of(path) if k not in read]
    assert not unread, f"{path.name} shows keys its steps never read: {unread}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_later_cell_defines_a_parameter(path):
    """The validation cell reads the scenario keys in the namespace: a later cell assigning one would change
    the scenario when the validation cell is run again (and a typed assignment is reserved for parameters)."""
    params = set(keys())
    for i, cell in _code_after_parameters(_read(path)):
        tree = ast.parse(cell.source)
        typed = [n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)]
        assert not typed, f"{path.name} cell {i}: typed assignments belong to the parameters cell"
        names = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign))
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                 for t in ast.walk(t) if isinstance(t, ast.Name)}
        assert not names & params, f"{path.name} cell {i} assigns scenario keys {sorted(names & params)}"


def test_sync_parameters_cell_rewrites_both_files_of_a_pair(tmp_path):
    import jupytext

    src = NOTEBOOKS[3]
    ipynb, py = tmp_path / src.name, tmp_path / src.with_suffix(".py").name
    shutil.copy(src, ipynb)
    shutil.copy(src.with_suffix(".py"), py)
    assert sync_parameters_cell(ipynb) is False, "the committed pair is in sync with the schema"
    for path, reader, writer in ((ipynb, nbformat.read, nbformat.write), (py, jupytext.read, jupytext.write)):
        nb = reader(path, as_version=4) if reader is nbformat.read else reader(path)
        parameters_cell(nb).source = "n_ctx: int = 1  # hand-edited"
        writer(nb, path)
    assert sync_parameters_cell(ipynb) is True
    want = parameters_cell_source(keys_of(src))
    assert parameters_cell(_read(ipynb)).source == want
    assert parameters_cell(jupytext.read(py)).source == want
    assert py.stat().st_mtime >= ipynb.stat().st_mtime, "the text file is written last (jupytext reads it first)"


# ------------------------------------------------------------------------------------------------
# thin cells, and the arithmetic in the open
# ------------------------------------------------------------------------------------------------

LOOPS_AND_DEFINITIONS = (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                         ast.Lambda, ast.Import, ast.ImportFrom)
ARITHMETIC = (ast.BinOp, ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.AugAssign, ast.If, ast.IfExp,
              ast.Compare)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_formulas_or_loops_outside_by_hand_cells(path):
    """Code cells after the validation cell call package functions: no loops, definitions, imports or
    arithmetic — those live in v100lab.workbook.levers and v100lab.workbook.plots — except in cells tagged ``by-hand``, which
    may do plain arithmetic (never loops or definitions)."""
    nb = _read(path)
    for i, cell in _code_after_parameters(nb)[1:]:
        tree = ast.parse(cell.source)
        loops = [type(n).__name__ for n in ast.walk(tree) if isinstance(n, LOOPS_AND_DEFINITIONS)]
        assert not loops, f"{path.name} cell {i}: {loops} — move it into the package"
        if BY_HAND in _tags(cell):
            continue
        bad = [type(n).__name__ for n in ast.walk(tree) if isinstance(n, ARITHMETIC)]
        assert not bad, f"{path.name} cell {i}: {bad} — arithmetic only in a cell tagged {BY_HAND!r}"
        calls = [n for n in tree.body if isinstance(n, (ast.Expr, ast.Assign))]
        assert len(calls) <= 2, f"{path.name} cell {i}: one package call (and one display) per cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_notebook_works_its_key_quantity_out_by_hand(path):
    """At least one by-hand cell per notebook; each does arithmetic and checks every figure it computes
    against the package with by_hand.agree (which fails beyond 1 %), under a markdown cell that explains it."""
    nb = _read(path)
    hand = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and BY_HAND in _tags(c)]
    assert hand, f"{path.name} has no cell tagged {BY_HAND!r}"
    for i, cell in hand:
        tree = ast.parse(cell.source)
        assert any(isinstance(n, ast.BinOp) for n in ast.walk(tree)), f"{path.name} cell {i} computes nothing"
        agrees = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "by_hand.agree"]
        assert agrees, f"{path.name} cell {i}: a by-hand cell checks its result with by_hand.agree"
        assert nb.cells[i - 1].cell_type == "markdown" or BY_HAND in _tags(nb.cells[i - 1]), \
            f"{path.name} cell {i}: say in words what the by-hand cell computes"


def test_agree_fails_loudly_beyond_one_percent(capsys):
    by_hand.agree("x", 100.5, 100.0, "B")
    assert "ratio 1.0050" in capsys.readouterr().out
    with pytest.raises(AssertionError, match=r"\+1\.50 %"):
        by_hand.agree("x", 101.5, 100.0, "B")
    with pytest.raises(AssertionError):
        by_hand.agree("x", 0.98, 1.0)
    by_hand.agree("x", 1.0, None)   # nothing to compare with: printed, not checked
    assert "no package value" in capsys.readouterr().out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_closes_with_an_exercise_and_its_collapsed_answer(path):
    """Each notebook ends with "Try it": a change to make and a question to predict before re-running, then the
    package's answer in a cell collapsed in JupyterLab (source and output hidden until the reader opens it)."""
    nb = _read(path)
    question, answer = nb.cells[-2], nb.cells[-1]
    assert question.cell_type == "markdown" and question.source.startswith("## Try it"), path.name
    assert "?" in question.source, f"{path.name}: an exercise asks a question"
    assert answer.cell_type == "code" and "answer" in _tags(answer), path.name
    hidden = answer.metadata.get("jupyter", {})
    assert hidden.get("source_hidden") and hidden.get("outputs_hidden"), f"{path.name}: the answer is collapsed"
    assert re.fullmatch(r"render\.text_table\(exercises\.what_if\(sc, .+\)\)", answer.source.strip()), answer.source


def test_the_glossary_defines_the_workbooks_words_and_00_links_it():
    glossary = (NB_DIR / "GLOSSARY.md").read_text(encoding="utf-8")
    for word in ("tok/s", "pp / tg", "depth", "ubatch", "-ngl", "SWA", "GQA", "KV cache", "roofline", "physical ceiling",
                 "calibrated", "memory-bound", "margin", "nats", "recurrent state",
                 "reference (of a run)"):
        assert word in glossary, f"GLOSSARY.md does not define {word!r}"
    assert "(GLOSSARY.md)" in _read(NB_DIR / "00_overview.ipynb").cells[0].source


def test_last_cells_summarise_from_the_numbers():
    for path in NOTEBOOKS:
        code = [c.source for c in _read(path).cells if c.cell_type == "code"]
        assert any(re.match(r"\w+\.summary_\w+\(sc", s) for s in code), f"{path.name} has no summary cell"


# ------------------------------------------------------------------------------------------------
# execution (slow): papermill on params/ci.yaml
# ------------------------------------------------------------------------------------------------

def _execute(path: Path, out: Path, parameters: dict):
    import papermill as pm

    return pm.execute_notebook(str(path), str(out), parameters=parameters, kernel_name=KERNEL_NAME,
                               progress_bar=False, log_output=False, cwd=str(NB_DIR))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_executes_on_ci_params(path, tmp_path):
    nb = _execute(path, tmp_path / path.name, read_parameters(CI_PARAMS))
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    images = [o for o in outputs if "image/png" in (o.get("data") or {})]
    n_plots = sum(1 for c in nb.cells if c.cell_type == "code" and "plots." in c.source)
    assert len(images) == n_plots, f"{path.name}: {n_plots} plot cells but {len(images)} images"
    summary = [c for c in nb.cells if c.cell_type == "code" and re.match(r"\w+\.summary_", c.source)][0]
    md = [o["data"]["text/markdown"] for o in summary.outputs if "text/markdown" in (o.get("data") or {})]
    assert md and md[0].count("\n- ") + 1 >= 2, f"{path.name}: the summary says too little: {md}"
    assert re.search(r"\d", md[0]), "a summary written from the numbers contains numbers"
    for cell in nb.cells:
        if cell.cell_type == "code" and BY_HAND in _tags(cell):
            text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
            assert re.search(r"ratio \d\.\d{4}|no package value", text), f"{path.name}: by-hand cell printed {text!r}"
    if any("baseline.headline(" in c.source for c in nb.cells if c.cell_type == "code"):
        h = read_headline(nb)
        assert h is not None and (h["measured_tok_s"] or h["predicted_tok_s"]), h
        if h["measured_tok_s"]:
            # a run that measured decoded its reference at its start and again at its headline
            ref = h["reference"]
            assert ref["start"]["tps"] > 0 and ref["end"]["tps"] > 0 and ref["shift"]["ratio"] > 0, ref
            # bench-style figures carry what llama.cpp ran (the index compares them across notebooks); load served
            # by llama-server to concurrent clients (10) is not a bench setup and has none
            assert all(p["setup"] for p in h["measured_points"]), h["measured_points"]
            assert h["measured_points"] or path.stem == "10_parallel_slots", h


@pytest.mark.slow
@pytest.mark.parametrize("bad, key", [({"n_ctx": "big"}, "n_ctx"), ({"cache_types": ["q9_9"]}, "cache_types")])
def test_a_bad_parameter_stops_at_the_validation_cell(tmp_path, bad, key):
    from papermill.exceptions import PapermillExecutionError

    path = NB_DIR / "01_vram_triangle.ipynb"
    with pytest.raises(PapermillExecutionError) as info:
        _execute(path, tmp_path / "bad.ipynb", {**read_parameters(CI_PARAMS), **bad})
    assert info.value.ename == "ConfigError"
    assert key in info.value.evalue
    nb = _read(tmp_path / "bad.ipynb")
    ran = [c for c in nb.cells if c.cell_type == "code" and c.get("execution_count")]
    assert "from_notebook" in ran[-1].source, "execution must stop at the validation cell"


# ------------------------------------------------------------------------------------------------
# what to look at, conditions and spread, the GPU beside this machine
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_plot_is_followed_by_what_to_look_at(path):
    """Under each plot, a cell that writes from the plotted frame's numbers what to look at
    (``captions.caption_*(sc, frame)``, or the lever module's own caption), before any other code cell."""
    nb = _read(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        if "plots." not in cell.source:
            continue
        frame = re.search(r"plots\.\w+\((\w+)", cell.source).group(1)
        nxt = code[i + 1].source.strip() if i + 1 < len(code) else ""
        assert re.fullmatch(rf"\w+\.caption_\w+\(sc, {frame}\)", nxt), \
            f"{path.name}: the plot of {frame!r} is not followed by its caption (got {nxt!r})"


def test_a_difference_inside_the_noise_is_no_difference():
    from v100lab.workbook.levers.captions import difference

    assert difference(100.0, 5.0, 3, 104.0, 5.0, 3).startswith("no difference beyond the noise (± 10.0")
    assert difference(100.0, 1.0, 3, 120.0, 1.0, 3) == "+20 %"
    assert "single runs" in difference(100.0, 0.0, 1, 120.0, 0.0, 1)
    from v100lab.workbook.levers.summaries import _effect
    from v100lab.facts.results import Observation, tidy_frame

    def row(v, x, sd):
        return Observation("m", "Q4_0", "host", "n_ubatch", v, "pp_tps", x, "tok/s", "measured",
                           note="pp512; backend x", sd=sd, repetitions=3)
    assert "no difference" in _effect(tidy_frame([row("512", 100.0, 6.0), row("2048", 110.0, 6.0)]), "pp_tps",
                                      "n_ubatch")
    assert "best 2048" in _effect(tidy_frame([row("512", 100.0, 1.0), row("2048", 110.0, 1.0)]), "pp_tps",
                                  "n_ubatch")


def test_sweep_draws_error_bars_ticks_at_the_values_and_the_conditions():
    from matplotlib.container import ErrorbarContainer

    from v100lab.workbook import plots
    from v100lab.workbook.levers.steps import lever_frame
    from v100lab.facts.results import Observation

    rows = []
    for v, x in (("1", 30.0), ("2", 52.0), ("4", 80.0)):
        rows.append(Observation("m", "Q4_0", "host", "n_parallel", v, "tg_tps", x, "tok/s", "measured",
                                note="tg64; backend x", sd=x / 10, repetitions=3))
        rows.append(Observation("m", "Q4_0", "host", "n_parallel", v, "tg_tps", x * 1.1, "tok/s", "predicted"))
    df = lever_frame(rows, conditions="m · depth 0 · -fa auto · -c 2048 · -t 2", depth=0)
    fig = plots.sweep(df, "title", lever="n_parallel", metrics=("tg_tps",))
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.has_yerr]
    assert len(bars) == 1, "the measured series carries ± sd error bars, the predicted one none"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"], "ticks at the slot counts"
    assert "depth 0 · -fa auto · -c 2048 · -t 2" in fig._suptitle.get_text()


def test_the_default_scenario_also_predicts_for_the_seeds_gpu():
    """A scenario that predicts for this machine's CPU also predicts for a catalog GPU (compare_gpu, the V100 by
    default) with the seed's model: 01's triangle has red cells there, 05's -ngl sweep and spill are for it (the
    spill step appears), 02's catalog carries the per-token overhead limit that a small model sits on."""
    from v100lab.workbook.scenario import load_scenario

    sc = load_scenario({**read_parameters(ROOT / "params" / "default.yaml"), "measure": False,
                        "quants": ["Q8_0", "Q4_0"], "ctx_sizes": [2048, 32768], "cache_types": ["f16"]})
    gpu = steps.beside(sc)
    assert gpu is not None and gpu.device.id == "v100-16gb" and gpu.device.kind == "gpu"
    assert steps.beside(sc.with_(compare_gpu="none")) is None
    assert steps.beside(sc.with_(device="t4")) is None, "a GPU scenario is its own target"

    grid = triangle.fit_grid(sc)
    fits = grid[grid["metric"] == "fits"]
    assert set(fits["device"]) == {"host", "v100-16gb"}
    assert fits[fits["device"] == "host"]["result"].min() == 1.0, "the 135M model fits everywhere here"
    assert fits[fits["device"] == "v100-16gb"]["result"].min() == 0.0, "red cells on the V100"
    assert "-c 2048" in grid.attrs["conditions"] and "-fa" in grid.attrs["conditions"]

    ngl = offload.gpu_layers_sweep(sc)
    tg = ngl[(ngl["metric"] == "tg_tps") & (ngl["source"] == "predicted")]
    assert set(tg["device"]) == {"v100-16gb"} and tg["result"].nunique() > 10, "the sweep moves on the GPU"
    assert "depth" in ngl.attrs["conditions"]
    spill = offload.spill_effect(sc)
    spilled = spill[spill["metric"] == "layers_spilled"].set_index("value")["result"]
    assert spilled["2048"] < spilled["32768"], "the spill step"

    cat = ceiling.catalog_ceilings(sc.with_(compare_devices=("t4", "h200")))
    floor = cat[cat["metric"] == "overhead_floor_tg_tps"].set_index("value")["result"]
    pred = cat[(cat["metric"] == "tg_tps") & (cat["source"] == "predicted")].set_index("value")["result"]
    ceil = cat[cat["metric"] == "weights_ceiling_tg_tps"].set_index("value")["result"]
    # the CUDA class fitted on published rows (rates.fit_cuda_rows) puts the T4 about half on its bandwidth, half on
    # its launch overhead for this 135M model; the H200, with 15x the bandwidth, on its overhead limit
    bw_ratio = ceil["h200"] / ceil["t4"]
    assert bw_ratio > 5 and pred["h200"] / pred["t4"] < bw_ratio / 3, "bandwidth is not what limits it"
    assert pred["h200"] >= 0.8 * floor["h200"], "the big card sits on its overhead limit"


def test_the_tuned_command_names_its_model_by_a_path_a_reader_can_use():
    import sys

    from v100lab.workbook.levers.final import display_path

    inside = str(Path(sys.prefix) / "lib" / "site-packages" / "x" / "model.gguf")
    assert display_path(inside) == "model.gguf"
    assert display_path("models/m.gguf") == "models/m.gguf"
    from v100lab.workbook import render

    lines = render.command_lines(["llama-server", "-m", "m.gguf", "--batch-size", "2048", "-ts", "1,-2", "--mlock"])
    assert lines == ["llama-server", "-m m.gguf", "--batch-size 2048", "-ts 1,-2", "--mlock"], "a flag never splits"


def test_no_lever_module_is_named_after_a_scenario_key():
    """A notebook imports the lever modules it calls after its parameters cell: a module named after a scenario
    key (gpu_layers, flash_attn) would replace that parameter."""
    from v100lab.workbook import levers
    from v100lab.workbook.scenario import keys

    modules = {p.stem for p in Path(levers.__file__).parent.glob("*.py")} - {"__init__"}
    assert not modules & set(keys()), sorted(modules & set(keys()))
