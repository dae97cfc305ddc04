"""A model served for the run: llama-server started on 127.0.0.1 with the run config's flags for the duration
of a serve-bench run (or a URL passed through), SIGTERM turned into a clean stop, and the check that the
workload fits the server's slots."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from v100lab.models import zoo
from v100lab.measure.backends.server import LLAMA_SERVER_LOG_ARGS, ServerBackend, find_llama_server
from v100lab.measure.harness import model_facts
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError
from v100lab.measure.loadgen.request import RequestResult
from v100lab.measure.loadgen.runner import ServeRun, run_serve_bench
from v100lab.measure.loadgen.workload import Workload
from v100lab.facts.store import ResultsStore
from v100lab.gguf.header import is_url


log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# a model: llama-server started for the run
# --------------------------------------------------------------------------------------------

def serve_bench(target: "str | os.PathLike", workload: Workload, cfg=None, *, server_binary=None,
                server_args: Sequence[str] = (), results=None, progress: bool | None = None,
                startup_timeout: float = 180.0, log_args: Sequence[str] | None = None,
                on_request: Callable[[RequestResult], None] | None = None) -> ServeRun:
    """Run ``workload`` against ``target``: a URL (a server already running), or a model (a GGUF path or a
    zoo alias) that llama-server serves on 127.0.0.1 for the run with ``cfg``'s flags (a
    :class:`~v100lab.facts.config.RunConfig`; ``-np`` defaults to the workload's largest concurrency) plus
    ``--metrics`` and ``server_args``; the server is stopped afterwards, always (a failure, Ctrl-C).

    With a model, each request needs prompt + output tokens in one slot's context: ``n_ctx / n_parallel``
    unless ``kv_unified`` — a workload that cannot fit raises ConfigError before the server starts.
    A server that does not start raises :class:`~v100lab.measure.backends.MeasureFailed` (exit status 1) with
    llama.cpp's reason. ``on_request(result)`` is called as each request finishes (a progress display)."""
    if is_url(target):
        return run_serve_bench(str(target), workload, results=results, progress=progress, on_request=on_request)

    path = _resolve_model(target)
    cfg = cfg or RunConfig(n_parallel=max(lv.in_flight_cap or 1 for lv in workload.levels))
    check_fits(cfg, workload)
    binary = server_binary or find_llama_server()
    backend = ServerBackend(binary=binary, extra_args=("--metrics", *server_args),
                            log_args=LLAMA_SERVER_LOG_ARGS if log_args is None else tuple(log_args),
                            startup_timeout=startup_timeout)

    store = results if isinstance(results, ResultsStore) or results is None else ResultsStore(results)
    if store is not None:
        store.check_writable()
    restore = _sigterm_as_interrupt()       # a kill (SIGTERM) stops the server too, as Ctrl-C does
    try:
        session = backend.open(path, cfg)
    except BaseException:
        restore()
        raise
    try:
        facts = _model_facts(path)
        base = {**facts, "model": str(path), "backend": backend.name, "config": cfg.as_dict(),
                "n_parallel": cfg.n_parallel, "n_threads": cfg.threads, "n_batch": cfg.n_batch,
                "n_ubatch": cfg.n_ubatch, "type_k": cfg.cache_type_k, "type_v": cfg.cache_type_v,
                "n_gpu_layers": cfg.n_gpu_layers, "flash_attn": cfg.flash_attn,
                "build_commit": session.info.get("build_commit"), "build_number": session.info.get("build_number"),
                "model_type": session.info.get("model_type"), "model_size": session.info.get("model_size"),
                "model_n_params": session.info.get("model_n_params"), "load": session.load}
        run = run_serve_bench(session.url, workload, results=store, progress=progress, dead=session.exit_reason,
                              base_row=base, on_request=on_request)
        run.server.update(argv=getattr(session, "argv", None), started=True, load=session.load)
        return run
    finally:
        session.close()
        restore()


def _sigterm_as_interrupt() -> Callable[[], None]:
    """While a server we started runs: SIGTERM raises KeyboardInterrupt (so ``finally`` stops the server)
    instead of ending the process at once and orphaning it. Only from the main thread, only over the
    default handler; returns the function that puts the previous handler back."""

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return lambda: None

        def handler(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def check_fits(cfg, workload: Workload) -> None:
    """ConfigError when one request (prompt + output) cannot fit in a server slot's context."""
    need = workload.tokens_per_request_max
    if cfg.n_ctx == 0:
        return                                  # the model's training context: checked by the server
    per_slot = cfg.n_ctx if cfg.kv_unified else cfg.n_ctx // cfg.n_parallel
    if need > per_slot:
        how = "" if cfg.kv_unified else f" (-c {cfg.n_ctx} split over -np {cfg.n_parallel} slots)"
        raise ConfigError(f"a request needs up to {need} tokens of context (prompt {workload.prompt_tokens.max} + "
                          f"output {workload.max_tokens.max}) but each slot holds {per_slot}{how}: "
                          f"raise -c{', use --kv-unified' if not cfg.kv_unified else ''} or shorten the requests")


def _resolve_model(target) -> Path:

    text = os.fspath(target)
    return zoo.model_path(text)


def _model_facts(path: Path) -> dict[str, Any]:
    try:

        return model_facts(path)
    except Exception as exc:  # the header is a nicety here
        log.debug("no model facts for %s: %s", path, exc)
        return {"model_filename": str(path)}
