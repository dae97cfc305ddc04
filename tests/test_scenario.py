"""The scenario schema: parameter files, notebook parameters, the generated parameters cell."""

from __future__ import annotations

import ast
import dataclasses
import glob
import types
from pathlib import Path

import pytest
import yaml

from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError, V100labError
from v100lab.workbook.scenario import (Scenario, defaults, from_notebook, keys, load_scenario, notebook_parameters,
                              parameters_cell_source, run_config_keys)

ROOT = Path(__file__).resolve().parents[1]
PARAMS = sorted((ROOT / "params").glob("*.yaml"))
NOTEBOOKS = sorted(glob.glob(str(ROOT / "notebooks" / "*.ipynb"))
                   + glob.glob(str(ROOT / "tests" / "data" / "notebooks" / "*.ipynb")))


# ---- the schema reuses RunConfig --------------------------------------------------------------

def test_every_run_config_field_is_a_key_with_its_default():
    rc_fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert set(run_config_keys()) == set(rc_fields)
    s = Scenario()
    for name, default in rc_fields.items():
        assert getattr(s, name) == default, name
    assert s.run_config() == RunConfig()


def test_run_config_carries_the_scenario_flags():
    s = load_scenario({"n_ctx": 1024, "cache_type_k": "q8_0", "flash_attn": "on", "use_mmap": False,
                       "tensor_split": [3, 1]})
    rc = s.run_config()
    assert (rc.n_ctx, rc.cache_type_k, rc.flash_attn, rc.use_mmap, rc.tensor_split) == \
        (1024, "q8_0", "on", False, (3.0, 1.0))


def test_run_config_validation_applies_with_the_key_named():
    with pytest.raises(ConfigError, match="n_ubatch"):
        load_scenario({"n_batch": 256, "n_ubatch": 512})
    with pytest.raises(ConfigError, match="cache_type_v"):
        load_scenario({"cache_type_v": "q3"})
    with pytest.raises(ConfigError, match="flash_attn"):
        load_scenario({"flash_attn": "maybe"})


# ---- validation: one ConfigError naming the key -----------------------------------------------

@pytest.mark.parametrize("data, key, words", [
    ({"n_ctxx": 512}, "n_ctxx", "did you mean 'n_ctx'"),
    ({"model": 3}, "model", "a string"),
    ({"n_ctx": "4096"}, "n_ctx", "an integer"),
    ({"n_ctx": 4096.0}, "n_ctx", "an integer"),
    ({"n_gen": True}, "n_gen", "an integer"),
    ({"measure": "yes"}, "measure", "true or false"),
    ({"quants": "Q4_0"}, "quants", "a list of strings"),
    ({"depths": [0, "512"]}, "depths", "a list of integers"),
    ({"stand_in_model": 1}, "stand_in_model", "a string or null"),
    ({"tensor_split": ["a"]}, "tensor_split", "a list of numbers"),
    ({"quants": ["Q4_0", "Q9_X"]}, "quants", "Q9_X"),
    ({"cache_types": ["f16", "q2"]}, "cache_types", "q2"),
    ({"claims": "blog"}, "claims", "seed, none"),
    ({"perplexity_corpus": "wiki"}, "perplexity_corpus", "pydoc_data.topics"),
    ({"depths": [-1]}, "depths", ">= 0"),
    ({"repetitions": 0}, "repetitions", ">= 1"),
    ({"perplexity_ctx": 65}, "perplexity_ctx", "even"),
    ({"model": "  "}, "model", "empty"),
    ({"compare_gpu": "host"}, "compare_gpu", "not a GPU"),
    ({"compare_gpu": "apple-m2"}, "compare_gpu", "not a GPU"),
    ({"compare_gpu": "v100"}, "compare_gpu", "unknown device"),
    ({"compare_gpu": 16}, "compare_gpu", "a string"),
])
def test_bad_values_name_the_key(data, key, words):
    with pytest.raises(ConfigError) as err:
        load_scenario(data)
    message = str(err.value)
    assert key in message and words in message
    assert "\n" not in message


def test_lists_become_tuples_and_back():
    s = load_scenario({"quants": ["Q4_0", "Q8_0"], "tensor_split": [1, 2]})
    assert s.quants == ("Q4_0", "Q8_0") and s.tensor_split == (1.0, 2.0)
    hash(s)  # frozen and hashable
    p = s.to_parameters()
    assert p["quants"] == ["Q4_0", "Q8_0"] and load_scenario(p) == s
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.n_ctx = 1  # type: ignore[misc]


def test_with_validates_and_rejects_unknown():
    s = Scenario()
    assert s.with_(n_ctx=1024).n_ctx == 1024
    with pytest.raises(ConfigError, match="n_ctx"):
        s.with_(n_ctx=-5)
    with pytest.raises(ConfigError, match="nctx"):
        s.with_(nctx=1)


def test_stand_in_model():
    assert Scenario().measured_model == "default" and not Scenario().is_stand_in
    s = load_scenario({"model": "skeleton.gguf", "stand_in_model": "synth-1b"})
    assert s.measured_model == "synth-1b" and s.is_stand_in


# ---- parameter files ----------------------------------------------------------------------------

def test_parameter_file_errors_name_file_and_key(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("scenario: x\nn_ctx: big\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: n_ctx: expected an integer"):
        load_scenario(f)
    f.write_text("scenario: x\nnot_a_key: 1\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: unknown scenario key 'not_a_key'"):
        load_scenario(f)
    f.write_text("scenario: [unclosed\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: not valid YAML at line"):
        load_scenario(f)
    f.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_scenario(f)
    with pytest.raises(ConfigError, match="not found"):
        load_scenario(tmp_path / "missing.yaml")


def test_empty_parameter_file_is_an_error_but_braces_are_the_defaults(tmp_path):
    """An empty file (or only comments) is refused rather than run as the default scenario."""
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="empty"):
        load_scenario(f)
    f.write_text("{}\n")
    assert load_scenario(f) == Scenario()


@pytest.mark.parametrize("path", PARAMS, ids=[p.name for p in PARAMS])
def test_shipped_parameter_files_are_valid(path):
    s = load_scenario(path)
    assert s.scenario  # every file names its scenario
    raw = yaml.safe_load(path.read_text())
    assert set(raw) <= set(keys())


def test_ci_and_default_parameter_files_exist():
    names = {p.name for p in PARAMS}
    assert {"ci.yaml", "default.yaml"} <= names


# ---- notebooks: from_notebook and the parameters cell -------------------------------------------

def _run_cell(source: str) -> dict:
    ns: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(source, "<parameters>", "exec", dont_inherit=True), ns)  # no __future__ from here
    return ns


def test_parameters_cell_defines_every_key_with_its_default():
    src = parameters_cell_source()
    ast.parse(src)
    ns = _run_cell(src)
    assert from_notebook(ns) == Scenario()
    assert notebook_parameters(ns).keys() == set(keys())
    assert ns["__annotations__"]["stand_in_model"] == "Optional[str]"  # papermill-parsable annotation


def test_parameters_cell_is_readable_by_papermill(tmp_path):
    """Every key typed and commented as papermill's parser sees it (`papermill --help-notebook`)."""
    import nbformat
    import papermill

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(parameters_cell_source())
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "p.ipynb"
    nbformat.write(nb, path)
    inspected = papermill.inspect_notebook(str(path))
    assert set(inspected) == set(keys())
    d = defaults()
    for name, p in inspected.items():
        assert p["help"], name
        assert ast.literal_eval(p["default"]) == d[name], name


def test_from_notebook_ignores_ipython_modules_callables_and_underscores():
    ns = _run_cell(parameters_cell_source())
    ns.update({"In": [""], "Out": {}, "get_ipython": lambda: None, "exit": object(), "quit": object(),
               "_": 1, "_i1": "x", "__doc__": None, "np": types.ModuleType("numpy"),
               "from_notebook": from_notebook, "Path": Path})
    ns["n_ctx"] = 1024   # papermill's injected cell redefines a name
    assert from_notebook(ns).n_ctx == 1024


def test_from_notebook_reads_only_scenario_keys_and_refuses_a_typed_typo():
    ns = _run_cell(parameters_cell_source())
    ns["stairs"] = object()   # a later cell's frame: not a parameter, validating again still works
    ns["n_ctxx"] = 1024       # an untyped name is the notebook's own (papermill warns about unknown parameters)
    assert from_notebook(ns) == Scenario()
    ns["__annotations__"]["n_ctxx"] = "int"   # `n_ctxx: int = 1024` in the parameters cell: a misspelt key
    with pytest.raises(ConfigError, match="unknown scenario key 'n_ctxx'.*did you mean 'n_ctx'"):
        from_notebook(ns)
    del ns["__annotations__"]["n_ctxx"]
    ns["quants"] = "Q4_0"
    with pytest.raises(ConfigError, match="quants: expected a list of strings"):
        from_notebook(ns)


def test_from_notebook_inside_a_real_ipython_shell():
    """The hidden names of a live InteractiveShell are ignored, parameters are not."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_cell(parameters_cell_source() + "\nn_gen = 3\nimport os\n", store_history=True)
        result = shell.run_cell("from v100lab.workbook.scenario import from_notebook\nscn = from_notebook(globals())")
        result.raise_error()
        assert shell.user_ns["scn"].n_gen == 3
        rerun = shell.run_cell("scn = from_notebook(globals())")  # re-running the cell by hand works
        rerun.raise_error()
        later = shell.run_cell("stairs = [1, 2]\nn_depths = 3\nscn = from_notebook(globals())")  # later cells' names
        later.raise_error()
        assert shell.user_ns["scn"].n_gen == 3
        result = shell.run_cell("bogus_key: int = 1\nfrom_notebook(globals())")
        assert isinstance(result.error_in_exec, ConfigError) and "bogus_key" in str(result.error_in_exec)
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[Path(p).name for p in NOTEBOOKS])
def test_notebook_parameters_cell_matches_the_schema(path):
    """Notebooks and schema never drift: each parameters cell is the schema's for the keys its notebook
    reads (every key for a test notebook); fix with ``python -m v100lab.workbook.runner``."""
    import nbformat

    from v100lab.workbook.runner import notebook_keys, parameters_cell

    nb = nbformat.read(path, as_version=4)
    cell = parameters_cell(nb)
    assert cell is not None, f"{path} has no cell tagged 'parameters'"
    assert cell.source == parameters_cell_source(notebook_keys(path)), \
        f"{path}: parameters cell differs from the schema; run python -m v100lab.workbook.runner"


def test_parameters_cell_for_some_keys():
    src = parameters_cell_source(["n_gen", "model", "n_ctx"])
    ns = _run_cell(src)
    assert [k for k in keys() if k in ns] == ["model", "n_ctx", "n_gen"], "schema order, only those keys"
    assert "# -- llama.cpp flags" in src and "# -- levers swept" not in src, "group headings of the keys shown"
    assert from_notebook(ns) == Scenario()
    with pytest.raises(ConfigError, match="unknown scenario key 'n_ctxx'"):
        parameters_cell_source(["n_ctxx"])


def test_sync_parameters_cell(tmp_path):
    import nbformat

    from v100lab.workbook.runner import parameters_cell, sync_parameters_cell

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title")]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    assert sync_parameters_cell(path) is True
    cell = parameters_cell(nbformat.read(path, as_version=4))
    assert cell.source == parameters_cell_source()
    assert sync_parameters_cell(path) is False
    nb = nbformat.read(path, as_version=4)
    parameters_cell(nb).source = "n_ctx = 1"
    nbformat.write(nb, path)
    assert sync_parameters_cell(path) is True
    assert len(nbformat.read(path, as_version=4).cells) == 2


def test_config_error_is_a_package_error():
    assert issubclass(ConfigError, V100labError)


def test_from_notebook_refuses_a_parameter_shadowed_by_an_import():
    """`from v100lab import scenario` after the parameters cell replaces the `scenario` parameter with the
    module; the scenario's name would silently fall back to its default."""
    import v100lab.workbook.scenario as module

    with pytest.raises(ConfigError, match="'scenario' was replaced by a module"):
        from_notebook({"scenario": module, "n_ctx": 1024})


def test_compare_gpu_is_a_catalog_gpu_or_none():
    assert Scenario().compare_gpu == "v100-16gb", "the seed's V100 by default"
    assert load_scenario({"compare_gpu": "t4"}).compare_gpu == "t4"
    assert load_scenario({"compare_gpu": "none"}).compare_gpu == "none"
