"""The workbook's notebooks: committed without outputs, parameters cell generated from the schema, no
formulas or loops, and every notebook executes with papermill on params/ci.yaml (real llama.cpp runs).

The execution tests are the slow part (each notebook measures with the small CI scenario); they run the
notebooks exactly as ``papermill notebooks/X.ipynb out.ipynb -f params/ci.yaml`` would.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from v100lab.scenario import parameters_cell_source, read_parameters
from v100lab.workbook import KERNEL_NAME, parameters_cell, read_headline

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
CI_PARAMS = ROOT / "params" / "ci.yaml"
EXPECTED = ("00_overview", "01_vram_triangle", "02_bandwidth_ceiling", "03_baseline", "04_quantization",
            "05_gpu_layers", "06_context_and_kv_cache", "07_batch_flash_attn_parallel_mlock", "08_final_config")
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def test_the_workbook_is_complete():
    present = {p.stem for p in NOTEBOOKS}
    missing = [n for n in EXPECTED if n not in present]
    # 08 needs the advisor (issue 9); every other notebook must be there
    assert not [n for n in missing if n != "08_final_config"], missing
    assert not present - set(EXPECTED), f"unexpected notebooks: {sorted(present - set(EXPECTED))}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs(path):
    nb = _read(path)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert not cell.get("outputs"), f"{path.name} cell {i} has outputs: clear them before committing"
        assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
    assert "papermill" not in nb.metadata, f"{path.name} is an executed notebook (papermill metadata)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_parameters_cell_is_the_schemas(path):
    nb = _read(path)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
        f"{path.name} must open with a markdown title"
    cell = parameters_cell(nb)
    assert cell is not None, f"{path.name} has no cell tagged 'parameters'"
    assert nb.cells.index(cell) == 1, f"{path.name}: the parameters cell must follow the title"
    assert cell.source == parameters_cell_source(), (
        f"{path.name}: parameters cell differs from v100lab.scenario.parameters_cell_source(); "
        "regenerate with notebooks/make_notebooks.py")
    validate = nb.cells[2]
    assert validate.cell_type == "code" and "from_notebook(globals())" in validate.source
    others = [c for c in nb.cells[3:] if c.cell_type == "code" and "from_notebook" in c.source]
    assert not others, f"{path.name}: exactly one validation cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_formulas_or_loops(path):
    """Code cells after the parameters only call package functions: no loops, definitions, arithmetic or
    comprehensions — those live in v100lab.levers and v100lab.plots."""
    nb = _read(path)
    banned = (ast.For, ast.While, ast.FunctionDef, ast.ClassDef, ast.Lambda, ast.BinOp, ast.ListComp,
              ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.AugAssign)
    for i, cell in enumerate(nb.cells[2:], start=2):
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        bad = [type(n).__name__ for n in ast.walk(tree) if isinstance(n, banned)]
        assert not bad, f"{path.name} cell {i}: {bad} — move it into the package"
        calls = [n for n in tree.body if isinstance(n, (ast.Expr, ast.Assign))]
        assert len(calls) <= 2, f"{path.name} cell {i}: one package call (and one display) per cell"


def test_last_cells_summarise_from_the_numbers():
    for path in NOTEBOOKS:
        code = [c.source for c in _read(path).cells if c.cell_type == "code"]
        assert any(re.match(r"levers\.summary_\w+\(sc", s) for s in code), f"{path.name} has no summary cell"


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
    summary = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("levers.summary_")][0]
    md = [o["data"]["text/markdown"] for o in summary.outputs if "text/markdown" in (o.get("data") or {})]
    assert md and md[0].count("\n- ") + 1 >= 2, f"{path.name}: the summary says too little: {md}"
    assert re.search(r"\d", md[0]), "a summary written from the numbers contains numbers"
    if any("levers.headline(" in c.source for c in nb.cells if c.cell_type == "code"):
        h = read_headline(nb)
        assert h is not None and (h["measured_tok_s"] or h["predicted_tok_s"]), h


@pytest.mark.slow
@pytest.mark.parametrize("bad, key", [({"n_ctx": "big"}, "n_ctx"), ({"n_ctxx": 512}, "n_ctxx"),
                                      ({"cache_types": ["q9_9"]}, "cache_types")])
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
