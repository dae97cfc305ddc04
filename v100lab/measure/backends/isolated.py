"""The default backend: llama-cpp-python's in-process harness (:mod:`.inprocess`), run in a worker child.

``open`` starts a :class:`v100lab.models.worker.Worker` and loads the model there; each ``run`` is one call to the
worker, so the model stays loaded across a configuration's tests and repetitions and the timing (taken in the
child around ``llama_decode``) is the in-process harness's own. A crash or a hang of llama.cpp raises
:class:`v100lab.models.worker.WorkerCrashed` from ``open`` or ``run``; the session is then dead, and
:func:`v100lab.measure.harness.run_tests` records the row as ``crashed``/``timeout`` and opens a new session for the
next test.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from v100lab.facts import loadlog
from v100lab.measure.backends.inprocess import InProcessBackend, build_info, cpu_gpu_info
from v100lab.measure.backends.types import BenchTest, Measurement
from v100lab.facts.config import RunConfig
from v100lab.base.errors import RunFailed
from v100lab.models.worker import DEFAULT_TIMEOUT_S, FAULT_ENV, START_TIMEOUT_S, Worker, call_isolated, fire_fault, parse_fault

log = logging.getLogger(__name__)

# ---- in the worker: one session per worker process
_session = None


def _arm_fault(session, model_path: Path) -> None:
    """Test-only fault injection (``V100LAB_FAULT``, see :mod:`v100lab.models.worker`): crash at the N-th decode."""
    fault = parse_fault(os.environ.get(FAULT_ENV, ""))
    if fault is None or fault[2] not in str(model_path):
        return
    kind, n, _ = fault
    real = session._decode
    count = [0]

    def decode(arr, k):
        count[0] += 1
        if count[0] >= n:
            fire_fault(kind)
        return real(arr, k)

    session._decode = decode


def _open(model: Path, cfg: RunConfig, depth_states: Path | None = None) -> dict[str, Any]:
    global _session
    _session = InProcessBackend().open(model, cfg, depth_states)
    _arm_fault(_session, model)
    return {"info": _session.info, "load": _session.load, "raw_log": _session.raw_log}


def _run(test: BenchTest, repetitions: int, warmup: bool) -> tuple[Measurement, str]:
    return _session.run(test, repetitions, warmup=warmup), _session.raw_log


def _build_info_here() -> dict[str, Any]:
    """llama.cpp's build facts, read in this process (the worker's side of :func:`llama_build`)."""
    info = build_info()
    info["cpu_info"], info["gpu_info"] = cpu_gpu_info()
    return info


def _stderr_of(fn):
    """``fn()`` with file descriptor 2 captured: ggml's backends report at registration straight to stderr (e.g.
    ggml-cuda.cu ``ggml_cuda_init``: "failed to initialize CUDA: …"), before any log callback is set. Returns
    (result, the captured lines); they are also written back to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    sys.stderr.write(text)
    return result, [line.strip() for line in text.splitlines() if line.strip()]


def _gpu_probe_here(model_path: str) -> dict[str, Any]:
    """In a worker: does this llama.cpp offload, and where do the model's buffers go with every layer asked for?
    Without offload, the answer carries what the library said while its backends registered (``backend_log``)."""
    def offload() -> bool:
        import llama_cpp  # heavy: the compiled library (a CUDA build without libcuda.so.1 fails right here)
        return bool(llama_cpp.llama_supports_gpu_offload())

    supported, said = _stderr_of(offload)
    if not supported:
        return {"gpu_offload": False, "backend_log": said[-20:]}
    facts, _ = loadlog.load_and_capture(model_path, RunConfig(n_ctx=256))
    return {"gpu_offload": True, "offloaded": facts.offloaded_layers, "offloadable": facts.offloadable_layers,
            "buffers": facts.by_device()}


def gpu_probe(model_path: str | os.PathLike, timeout: float | None = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """:func:`_gpu_probe_here` in a fresh worker (a library that does not load raises, it does not kill us)."""
    return call_isolated(_gpu_probe_here, str(model_path), timeout=timeout, what="loading on the GPU")


@lru_cache(maxsize=1)
def llama_build() -> dict[str, Any]:
    """The llama.cpp build in use (commit, ggml version, system-info line, CPU/GPU devices), read once per
    process in a worker, so that a library that cannot even load costs a message, not this process."""
    try:
        return call_isolated(_build_info_here, timeout=START_TIMEOUT_S, what="reading the build")
    except RunFailed as exc:
        log.warning("llama.cpp build facts unavailable: %s", exc)
        return {"error": str(exc)}


# ---- in the parent
class IsolatedBackend:
    """llama-cpp-python in a worker child process (the default backend; its rows say ``inprocess``)."""

    name = "inprocess"

    def __init__(self, timeout: float | None = DEFAULT_TIMEOUT_S, depth_states: Path | None = None):
        self.timeout = timeout
        self.depth_states = depth_states     # a folder for filled contexts, shared by loads (InProcessSession)

    def open(self, model: Path, cfg: RunConfig) -> "IsolatedSession":
        return IsolatedSession(Path(model), cfg, self.timeout, self.depth_states)


class IsolatedSession:
    """A model loaded in a worker; the parent side of :class:`v100lab.measure.backends.inprocess.InProcessSession`."""

    def __init__(self, model_path: Path, cfg: RunConfig, timeout: float | None, depth_states: Path | None = None):
        self.timeout = timeout
        self._worker = Worker()
        self.monitor_pid = self._worker.pid          # the monitor watches the process that runs llama.cpp
        try:
            got = self._worker.call(_open, model_path, cfg, depth_states, timeout=timeout,
                                    what=f"loading {model_path.name}")
        except BaseException:
            self._worker.close()
            raise
        self.info: dict[str, Any] = got["info"]
        self.load: dict[str, Any] | None = got["load"]
        self.raw_log: str = got["raw_log"]

    @property
    def alive(self) -> bool:
        return not self._worker.closed

    def run(self, test: BenchTest, repetitions: int, warmup: bool = True) -> Measurement:
        m, self.raw_log = self._worker.call(_run, test, repetitions, warmup, timeout=self.timeout,
                                            what=f"running {test.name}")
        return m

    def close(self) -> None:
        self._worker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
