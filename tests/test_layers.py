"""The package's layers only look down, and its modules import each other without a cycle.

The layer contract is ``[tool.importlinter]`` in pyproject.toml (import-linter's ``layers`` contracts), run
here through import-linter's Python API on grimp's import graph of the package as it is; ``lint-imports``
runs the same contracts from the command line. The cycle check is grimp's graph and Tarjan's strongly
connected components. Each check is also shown failing: on a tiny package with an upward import, and on the
real graph with one upward edge added.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import pytest
from importlinter import api as _api  # noqa: F401 - configures import-linter's adapters on import
from importlinter.application import use_cases
from importlinter.contracts.layers import LayersContract

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PACKAGE = "v100lab"


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

def contracts(config: Path = PYPROJECT) -> list[LayersContract]:
    """The layers contracts of ``config``, as import-linter builds them from its ``[tool.importlinter]``."""
    options = use_cases.read_user_options(str(config))
    session = dict(options.session_options)
    if "root_packages" not in session:          # older import-linter keeps the singular spelling
        session["root_packages"] = [session["root_package"]]
    out = []
    for c in options.contracts_options:
        assert c["type"] == "layers", f"contract {c['name']!r}: only layers contracts are expected here"
        out.append(LayersContract(name=c["name"], session_options=session, contract_options=c))
    return out


def package_graph(package: str = PACKAGE) -> grimp.ImportGraph:
    return grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=True)


def broken_imports(contract: LayersContract, graph: grimp.ImportGraph) -> list[str]:
    """Every import that breaks ``contract`` on ``graph``, one line each (importer -> imported, line numbers),
    and every module the exhaustive contract does not place in a layer."""
    check = contract.check(copy.deepcopy(graph), verbose=False)
    lines = []
    for dep in check.metadata["invalid_dependencies"]:
        for route in dep["routes"]:
            hops = " -> ".join(f"{link['importer']} -> {link['imported']} "
                               f"(l.{','.join(str(n) for n in link['line_numbers'])})" for link in route["chain"])
            lines.append(f"{dep['importer']} imports {dep['imported']}: {hops}")
    lines += [f"{m} is in no layer" for m in sorted(check.metadata["undeclared_modules"])]
    assert check.kept == (not lines)
    return lines


def import_cycles(graph: grimp.ImportGraph, depth: int | None = None) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan). ``depth`` squashes each module into its
    first ``depth`` name parts (2: a subpackage is one node, so a cycle between two top-level modules or
    packages shows, whatever their submodules); None keeps every module, package ``__init__`` included, as its
    own node (so ``backends/__init__`` ↔ ``backends.server`` shows)."""
    def key(m: str) -> str:
        return ".".join(m.split(".")[:depth]) if depth else m

    edges: dict[str, set[str]] = {}
    for m in graph.modules:
        for t in graph.find_modules_directly_imported_by(m):
            if key(m) != key(t):
                edges.setdefault(key(m), set()).add(key(t))
    nodes = sorted({key(m) for m in graph.modules})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in nodes:                          # iterative Tarjan: no recursion limit on a deep graph
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


# ------------------------------------------------------------------------------------------------
# the package
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return package_graph()


def test_pyproject_declares_the_layer_contracts():
    names = [c.name for c in contracts()]
    assert any("layer folders only look down" in n for n in names)
    # one contract inside each folder whose modules are ordered
    folders = {"cli", "workbook", "advise", "measure", "predict", "models", "gguf"}
    inside = {c.name.split(":")[0].split(".")[1] for c in contracts() if c.name.startswith("v100lab.")}
    assert folders <= inside, folders - inside


@pytest.mark.parametrize("contract", contracts(), ids=lambda c: c.name)
def test_layer_contract_is_kept(contract, graph):
    broken = broken_imports(contract, graph)
    assert not broken, f"{contract.name}: {len(broken)} import(s) break the layers:\n" + "\n".join(broken)


@pytest.mark.parametrize("depth", [2, None], ids=["top-level", "module"])
def test_no_import_cycle(graph, depth):
    cycles = import_cycles(graph, depth)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


# ------------------------------------------------------------------------------------------------
# the checks can fail
# ------------------------------------------------------------------------------------------------

def test_an_upward_import_in_the_package_breaks_the_real_contract(graph):
    """The real contract on the real graph plus one upward import: the GGUF reader importing the zoo."""
    (layers,) = [c for c in contracts() if c.contract_options.get("id") == "layers"]
    g = copy.deepcopy(graph)
    g.add_import(importer="v100lab.gguf.header", imported="v100lab.models.zoo", line_number=1, line_contents="import zoo")
    broken = broken_imports(layers, g)
    assert any(line.startswith("v100lab.gguf imports v100lab.models") and "v100lab.gguf.header -> v100lab.models.zoo"
               in line for line in broken), broken


def test_an_upward_import_inside_a_folder_breaks_its_contract(graph):
    """A folder's own order is enforced too: the memory plan importing the speed model."""
    (predict,) = [c for c in contracts() if c.contract_options.get("id") == "predict"]
    g = copy.deepcopy(graph)
    g.add_import(importer="v100lab.predict.memory", imported="v100lab.predict.speed", line_number=1,
                 line_contents="import speed")
    broken = broken_imports(predict, g)
    assert any(line.startswith("v100lab.predict.memory imports v100lab.predict.speed") for line in broken), broken


def test_an_added_back_edge_is_an_import_cycle(graph):
    g = copy.deepcopy(graph)
    g.add_import(importer="v100lab.gguf.header", imported="v100lab.models.zoo", line_number=1, line_contents="import zoo")
    assert any({"v100lab.gguf", "v100lab.models"} <= set(c) for c in import_cycles(g, 2))
    assert any({"v100lab.gguf.header", "v100lab.models.zoo"} <= set(c) for c in import_cycles(g))


def _write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def tiny_package(tmp_path):
    """``tinypkg``: ``low`` imports ``high`` (upward), and a contract that says high sits above low."""
    _write_package(tmp_path, {
        "tinypkg/__init__.py": "",
        "tinypkg/high.py": "from tinypkg import low\n",
        "tinypkg/mid.py": "",
        "tinypkg/low.py": "def f():\n    from tinypkg import high  # upward, and hidden in a function\n    return high\n",
        "pyproject.toml": """
            [tool.importlinter]
            root_package = "tinypkg"

            [[tool.importlinter.contracts]]
            id = "layers"
            name = "tinypkg layers"
            type = "layers"
            containers = ["tinypkg"]
            exhaustive = true
            layers = ["high", "low"]
        """,
    })
    return tmp_path


def test_lint_imports_fails_on_an_upward_import(tiny_package):
    """The command-line linter, run on a package with an upward import (and a module in no layer), fails
    and names both."""
    env = {"PYTHONPATH": str(tiny_package), "PATH": str(Path(sys.executable).parent)}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    p = subprocess.run([sys.executable, "-c", code, "--no-cache", "--config", str(tiny_package / "pyproject.toml")],
                       cwd=tiny_package, env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "tinypkg.low is not allowed to import tinypkg.high" in out, out
    assert "tinypkg.mid" in out, out
    p = subprocess.run([sys.executable, "-c", "import tinypkg.low, tinypkg.high"], cwd=tiny_package, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr    # the package itself imports fine: only the contract objects


# ------------------------------------------------------------------------------------------------
# imports inside functions: only a heavy or optional third-party dependency, said so in a comment
# ------------------------------------------------------------------------------------------------

def function_level_imports(root: Path) -> list[str]:
    """Every import inside a function under ``root`` that breaks the rule, one line each: an import of the
    package itself (it hides an edge from the layer contract's reader of the code), of the standard library
    (nothing to defer, unless the comment says it is heavy), or of anything without a comment on its line or the line above saying why."""
    import ast

    bad = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if not isinstance(sub, (ast.Import, ast.ImportFrom)) or sub.col_offset == 0:
                    continue
                name = (sub.module or "") if isinstance(sub, ast.ImportFrom) else sub.names[0].name
                top = name.split(".")[0]
                where = f"{path.relative_to(root.parent)}:{sub.lineno}: {lines[sub.lineno - 1].strip()}"
                if isinstance(sub, ast.ImportFrom) and sub.level:
                    bad.append(f"{where} (a relative import of the package)")
                elif top == PACKAGE:
                    bad.append(f"{where} (the package itself: import it at the top)")
                elif top in sys.stdlib_module_names and "# heavy" not in lines[sub.lineno - 1]:
                    bad.append(f"{where} (the standard library: import it at the top)")
                elif "#" not in lines[sub.lineno - 1] and not lines[sub.lineno - 2].strip().startswith("#"):
                    bad.append(f"{where} (no comment saying why it is deferred)")
    return sorted(set(bad))


def test_function_level_imports_are_heavy_or_optional_and_say_so():
    bad = function_level_imports(Path(__file__).resolve().parents[1] / PACKAGE)
    assert not bad, f"{len(bad)} import(s) inside functions break the rule:\n" + "\n".join(bad)


def test_function_level_import_check_can_fail(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "m.py").write_text(textwrap.dedent("""\
        import json


        def f():
            import re
            from v100lab.base import errors
            import numpy
            import pandas  # heavy: only this table needs it
            return json, re, errors, numpy, pandas
        """))
    bad = function_level_imports(pkg)
    assert [b.split(": ", 1)[0] for b in bad] == [f"{PACKAGE}/m.py:5", f"{PACKAGE}/m.py:6", f"{PACKAGE}/m.py:7"]
    assert "standard library" in bad[0] and "the package itself" in bad[1] and "no comment" in bad[2]
