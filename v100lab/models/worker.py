"""Crash isolation: llama.cpp runs in a worker child process, so a crash in it costs one result, not the run.

llama.cpp is C++: a bad kernel (the AMX matmul on some Xeons), an abort in an assertion, the kernel's
out-of-memory killer or a hang takes down the process it runs in. Every llama.cpp run the package starts — the
in-process bench backend, calibration, quality, the memory check, the quantizer — therefore runs in a
:class:`Worker`: a child ``python -m v100lab.models.worker`` that executes module-level functions sent to it and
keeps whatever they store (a loaded model) between calls, so a configuration's repetitions and tests share
one model load. The parent keeps the results.

A worker that dies or overruns its timeout raises :class:`WorkerCrashed` in the parent, with the status
(``crashed`` or ``timeout``), the signal, and the last lines llama.cpp logged (the worker's stdout and stderr
go to a log file, and :mod:`v100lab.facts.loadlog` tees every captured llama.cpp line there too).

The protocol is pickled frames (an 8-byte length, then the pickle) over the child's stdin and a private
duplicate of its original stdout: llama.cpp may print to fd 1 and 2, which point at the log file.

Fault injection, for tests only: ``V100LAB_FAULT="KIND@N[:MATCH]"`` makes a worker session crash at its N-th
``llama_decode`` — KIND ``segv`` (SIGSEGV), ``abort`` (SIGABRT) or ``hang`` (sleeps forever) — when the model
file's path contains MATCH (every model when MATCH is omitted). Read by the worker, never by the parent.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from v100lab.facts import loadlog
from v100lab.base.errors import RunFailed

log = logging.getLogger(__name__)

TIMEOUT_ENV = "V100LAB_WORKER_TIMEOUT"


def _timeout_from_env(default: float = 900.0) -> float:
    """``$V100LAB_WORKER_TIMEOUT`` (seconds, finite and > 0), else ``default``; a bad value is logged, not fatal."""
    text = os.environ.get(TIMEOUT_ENV, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        log.warning("$%s=%r is not a positive number of seconds; using %g", TIMEOUT_ENV, text, default)
        return default
    return value


#: seconds one call may take before the worker is killed and the call reported as ``timeout``
DEFAULT_TIMEOUT_S = _timeout_from_env()
#: seconds the child may take to import and say it is ready
START_TIMEOUT_S = 60.0
#: lines of the worker's log kept in a crash report
LOG_TAIL_LINES = 12
FAULT_ENV = "V100LAB_FAULT"
_HEADER = struct.Struct("!Q")


class WorkerCrashed(RunFailed):
    """The worker died (a signal, a non-zero exit) or was killed after its timeout.

    ``status`` is "crashed" or "timeout"; ``signal_name`` e.g. "SIGSEGV"; ``log_tail`` the worker's last log
    lines (llama.cpp's own, mostly)."""

    def __init__(self, status: str, detail: str, *, returncode: int | None = None, signal_name: str | None = None,
                 log_tail: str = ""):
        self.status = status
        self.detail = detail
        self.returncode = returncode
        self.signal_name = signal_name
        self.log_tail = log_tail
        super().__init__(detail)


def describe_exit(returncode: int | None) -> tuple[str | None, str]:
    """(signal name or None, words) for a child's return code: -11 → ("SIGSEGV", "killed by SIGSEGV …")."""
    if returncode is None:
        return None, "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = {"SIGSEGV": "segmentation fault", "SIGABRT": "aborted", "SIGKILL": "killed (out of memory?)",
               "SIGBUS": "bus error", "SIGILL": "illegal instruction (a build for another CPU?)",
               "SIGFPE": "arithmetic fault"}.get(name, "killed")
        return name, f"{why}, {name}"
    if returncode > 128 and returncode - 128 in {s.value for s in signal.Signals}:  # a shell's 128 + signal
        return describe_exit(128 - returncode)
    return None, f"exit status {returncode}"


def _tail(path: Path, n: int = LOG_TAIL_LINES, limit: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read(limit).decode(errors="replace")
    except OSError:
        return ""
    lines = [line.rstrip() for line in data.splitlines() if line.strip()]
    return "\n".join(lines[-n:])


# --------------------------------------------------------------------------------------------- the parent
class Worker:
    """One child process that runs functions for the parent; see the module docstring.

    ``call(func, *args, **kwargs)`` runs ``func`` (a module-level function: it is pickled by name) in the child
    and returns its result or re-raises its exception; a crash or a timeout raises :class:`WorkerCrashed` and
    leaves the worker closed. Use as a context manager, or ``close()`` it."""

    def __init__(self, *, env: dict[str, str] | None = None, log_dir: str | os.PathLike | None = None):
        self._log_dir = tempfile.mkdtemp(prefix="v100lab-worker-", dir=log_dir)
        self.log_path = Path(self._log_dir) / "worker.log"
        self._logf = open(self.log_path, "wb")
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        self._proc = subprocess.Popen([sys.executable, "-m", "v100lab.models.worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._logf, env=child_env, close_fds=True,
                                      start_new_session=True)   # Ctrl-C in a terminal reaches the parent only
        self.pid = self._proc.pid
        self.closed = False
        try:
            self._receive(START_TIMEOUT_S, "starting")
        except WorkerCrashed:
            self.close()
            raise

    # ---- framing
    def _send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        assert self._proc.stdin is not None
        self._proc.stdin.write(_HEADER.pack(len(data)) + data)
        self._proc.stdin.flush()

    def _read_exact(self, n: int, deadline: float | None) -> bytes:
        out = bytearray()
        fd = self._proc.stdout.fileno()
        while len(out) < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def _receive(self, timeout: float | None, what: str) -> Any:
        deadline = None if not timeout else time.monotonic() + timeout
        try:
            (size,) = _HEADER.unpack(self._read_exact(_HEADER.size, deadline))
            return pickle.loads(self._read_exact(size, deadline))
        except TimeoutError:
            self._kill()
            raise WorkerCrashed("timeout", f"llama.cpp worker timed out after {timeout:g} s while {what}",
                                log_tail=_tail(self.log_path)) from None
        except (EOFError, OSError, pickle.UnpicklingError, struct.error):
            try:
                rc = self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
                rc = self._proc.returncode
            name, words = describe_exit(rc)
            self.closed = True
            raise WorkerCrashed("crashed", f"llama.cpp worker crashed while {what}: {words}", returncode=rc,
                                signal_name=name, log_tail=_tail(self.log_path)) from None

    def call(self, func: Callable, *args, timeout: float | None = DEFAULT_TIMEOUT_S, what: str | None = None,
             **kwargs) -> Any:
        if self.closed:
            raise RunFailed("the llama.cpp worker is closed (it crashed or was shut down)")
        what = what or getattr(func, "__name__", "working")
        try:
            self._send(("call", func, args, kwargs))
        except (BrokenPipeError, OSError):
            return self._receive(1.0, what)           # it died before the call arrived: report how
        kind, payload = self._receive(timeout, what)
        if kind == "ok":
            return payload
        raise payload

    # ---- lifetime
    def _kill(self) -> None:
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
            self._proc.wait()
        self.closed = True

    def close(self, timeout: float = 10.0) -> None:
        """Ask the worker to exit (it frees llama.cpp's objects), kill it if it does not; remove its log."""
        if self._proc.poll() is None and not self.closed:
            try:
                self._send(("exit", None, (), {}))
                self._proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._logf.close()
        try:
            self.log_path.unlink(missing_ok=True)
            os.rmdir(self._log_dir)
        except OSError:
            pass

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten worker must not outlive its parent's interest in it
        try:
            if not self.closed:
                self._kill()
        except Exception:
            pass


def call_isolated(func: Callable, *args, timeout: float | None = DEFAULT_TIMEOUT_S, what: str | None = None,
                  **kwargs) -> Any:
    """Run ``func(*args, **kwargs)`` in a fresh worker and return its result (one-shot :class:`Worker`)."""
    with Worker() as w:
        return w.call(func, *args, timeout=timeout, what=what, **kwargs)


# ---------------------------------------------------------------------------------------------- the child
def parse_fault(spec: str) -> tuple[str, int, str] | None:
    """``V100LAB_FAULT`` → (kind, n, match) or None: ``segv@3``, ``abort@1:calib-wide``, ``hang@2``."""
    if not spec:
        return None
    head, _, match = spec.partition(":")
    kind, _, n = head.partition("@")
    if kind not in ("segv", "abort", "hang"):
        raise ValueError(f"{FAULT_ENV}: unknown fault '{kind}' (segv, abort or hang)")
    return kind, int(n or 1), match


def fire_fault(kind: str) -> None:
    """Crash or hang the calling process, as a broken llama.cpp would (tests only)."""
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "abort":
        os.abort()
    while True:   # hang
        time.sleep(3600)


def _child_main() -> int:
    # The protocol gets a private copy of the original stdout; fd 1 then joins fd 2 (the log file), so
    # whatever llama.cpp prints can never corrupt a frame.
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    loadlog.set_tee(sys.stderr)

    def read_exact(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = proto_in.read(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def send(obj: Any) -> None:
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:   # an unpicklable result or exception: say what it was
            data = pickle.dumps(("err", RunFailed(f"worker could not return {type(obj[1]).__name__}: {exc}")))
        proto_out.write(_HEADER.pack(len(data)) + data)

    send(("ready", os.getpid()))
    while True:
        try:
            (size,) = _HEADER.unpack(read_exact(_HEADER.size))
            op, func, args, kwargs = pickle.loads(read_exact(size))
        except EOFError:
            return 0
        if op == "exit":
            return 0
        try:
            result = ("ok", func(*args, **kwargs))
        except BaseException as exc:  # everything goes back to the parent, which decides
            log.debug("worker call %s failed", getattr(func, "__name__", func), exc_info=True)
            result = ("err", exc)
        send(result)


if __name__ == "__main__":
    raise SystemExit(_child_main())
