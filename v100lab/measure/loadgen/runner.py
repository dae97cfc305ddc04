"""A serve-bench run against a URL: probe, plan, run every level, summarize, and store one row per request
and per level (:class:`~v100lab.facts.store.ResultsStore`); :class:`ServeRun` is what comes back."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as _dt
import hashlib
import logging
import math
import os
import platform
import sys
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from tqdm.auto import tqdm

from v100lab.base.buildflags import host_cpu
from v100lab.base.errors import ConfigError
from v100lab.measure.loadgen.client import (ServerInfo, probe, request_body, run_level, scrape_metrics, send_request,
                                    token_pool)
from v100lab.measure.loadgen.metrics import fmt_figure, server_side_by_side, summarize_level
from v100lab.measure.loadgen.request import RequestResult
from v100lab.measure.loadgen.workload import ENDPOINTS, Level, PlannedRequest, Workload, plan_level
from v100lab.base.safeio import json_safe
from v100lab.facts.store import ResultsStore


log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# a run
# --------------------------------------------------------------------------------------------

@dataclass
class ServeRun:
    """A serve-bench run: the server as probed, the workload, one summary per level, every request, and
    the rows as stored (``rows``: one ``serve_request`` row per request, one ``serve_level`` row per level)."""

    target: str
    server: dict[str, Any]
    workload: Workload
    levels: list[dict[str, Any]]
    requests: list[RequestResult]
    rows: list[dict[str, Any]]
    run_id: str

    @property
    def failed(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    def as_dict(self, requests: bool = True) -> dict[str, Any]:
        doc = {"target": self.target, "run_id": self.run_id, "server": self.server,
               "workload": self.workload.as_dict(), "levels": self.levels,
               "failed_requests": self.failed, "definitions": DEFINITIONS}
        if requests:
            doc["requests"] = [r.as_dict() for r in self.requests]
        return json_safe(doc)


DEFINITIONS = ("vLLM `vllm bench serve` definitions: TTFT = send → first text event; ITL = gaps between "
               "text events, pooled over requests; TPOT = (E2EL − TTFT) / (output tokens − 1) per request; "
               "E2EL = send → last event with choices; throughputs over the level's duration (first send → "
               "last response); goodput = requests meeting every SLO / duration")


def _key(*parts) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:20]


def _stamp() -> tuple[str, str]:

    t = _dt.datetime.now(_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ"), t.isoformat(timespec="milliseconds")


def _env(info: ServerInfo) -> dict[str, Any]:
    try:

        cpu = host_cpu().model
    except Exception as exc:  # /proc/cpuinfo unreadable: the row still stands
        log.debug("no CPU model: %s", exc)
        cpu = None
    return {"cpu_model": cpu, "cpu_count": os.cpu_count(), "os": platform.platform(),
            "python": platform.python_version(), "server_build_info": info.build_info}


def _request_row(base: Mapping[str, Any], rq: RequestResult, level: Level) -> dict[str, Any]:
    test_time, stamp = _stamp()
    d = rq.as_dict()
    row = {**base, "kind": "serve_request", "key": _key(base["run_id"], rq.level_index, rq.index),
           "test": f"serve {level.name}", "status": rq.status, "reason": rq.reason,
           "n_prompt": rq.n_prompt, "n_gen": rq.n_gen, "n_depth": 0,
           "avg_ts": d["decode_ts"] if rq.ok else None, "test_time": test_time, "timestamp": stamp,
           **{k: d[k] for k in ("level", "level_index", "index", "max_tokens", "prompt_tokens_sent", "t_send",
                                "ttft_ms", "tpot_ms", "e2el_ms", "itl_ms", "n_events", "finish_reason",
                                "http_status", "usage", "server_timings")},
           "concurrency": level.concurrency, "request_rate": level.rate if level.rate and math.isfinite(level.rate)
           else None, "arrival": level.arrival}
    if rq.ok and row["avg_ts"] is None and rq.e2el_s:
        row["avg_ts"] = (rq.n_gen or 0) / rq.e2el_s        # one output token: no TPOT; tokens over latency
    return json_safe(row)


def _level_row(base: Mapping[str, Any], summary: Mapping[str, Any], level: Level, li: int,
               workload: Workload) -> dict[str, Any]:
    test_time, stamp = _stamp()
    ok = summary["completed"] > 0
    reason = None
    if not ok:
        top = max((summary.get("failures") or {"unknown": 1}).items(), key=lambda kv: kv[1])[0]
        reason = f"all {summary['requests']} requests failed: {top}"
    return json_safe({**base, "kind": "serve_level", "key": _key(base["run_id"], li, "level"),
                    "test": f"serve {level.name}", "status": "ok" if ok else "failed", "reason": reason,
                    "n_prompt": int(workload.prompt_tokens.a) if workload.prompt_tokens.kind == "fixed" else None,
                    "n_gen": int(workload.max_tokens.a) if workload.max_tokens.kind == "fixed" else None,
                    "n_depth": 0, "avg_ts": summary.get("output_throughput") if ok else None,
                    "level_index": li, "test_time": test_time, "timestamp": stamp, **summary})


def _run_coro(factory: Callable[[], Any]):
    """asyncio.run, also from inside a running event loop (Jupyter): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def run_serve_bench(url: str, workload: Workload, *, results=None, progress: bool | None = None,
                    dead: Callable[[], str | None] | None = None, base_row: Mapping[str, Any] | None = None,
                    on_request: Callable[[RequestResult], None] | None = None) -> ServeRun:
    """Run ``workload`` against the OpenAI-compatible server at ``url`` (a server already running).

    ``results``: a JSONL path or :class:`~v100lab.facts.store.ResultsStore` — each request's row is appended as it
    finishes, each level's summary row after the level. ``progress``: a tqdm bar on stderr (None: when
    stderr is a terminal). ``dead()``: returns why the server can no longer answer (None while it can);
    :func:`serve_bench` passes one for the server it started. Faults never raise (see the module docstring);
    bad input raises :class:`~v100lab.base.errors.ConfigError` before anything is sent."""

    if not isinstance(workload, Workload):
        raise ConfigError("workload: must be a Workload")
    url = normalize_url(url)
    store = results if isinstance(results, ResultsStore) or results is None else ResultsStore(results)
    if store is not None:
        store.check_writable()
    dead = dead or (lambda: None)
    return _run_coro(lambda: _main(url, workload, store, progress, dead, dict(base_row or {}), on_request))


def normalize_url(url: str) -> str:

    u = str(url).strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        u = "http://" + u
    for suffix in ("/v1/completions", "/v1/chat/completions", "/v1"):
        if u.endswith(suffix):
            u = u[: -len(suffix)]
    try:
        parts = urlsplit(u)
        parts.port  # noqa: B018 — raises on a bad port
    except ValueError as exc:
        raise ConfigError(f"not a server URL: '{url}' ({exc})") from None
    if not parts.hostname:
        raise ConfigError(f"not a server URL: '{url}' (no host)")
    return u


async def _main(url: str, workload: Workload, store, progress: bool | None, dead, base_row: dict,
                on_request) -> ServeRun:
    import httpx  # network stack: loaded only when a run talks to a server

    run_id = uuid.uuid4().hex[:16]
    cap = max((lv.in_flight_cap or 0) for lv in workload.levels)
    open_loop_uncapped = any(lv.rate is not None and not lv.max_concurrency for lv in workload.levels)
    # no keep-alive: llama-server closes the connection after a streamed answer, and a pooled connection it
    # closed would fail the next request (a fresh loopback connection costs ~0.1 ms of that request's TTFT)
    limits = httpx.Limits(max_connections=None if open_loop_uncapped else cap + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=workload.timeout_s) as client:
        info = await probe(client, url)
        if info.problem:
            log.warning("%s: %s (sending anyway: each request records what happens)", url, info.problem)
        mode = workload.prompt_mode
        if mode == "auto":
            mode = "tokens" if info.kind == "llama-server" and workload.endpoint == "completions" else "text"
        pool = await token_pool(client, url, info) if mode == "tokens" else None
        if mode == "tokens" and not pool:
            log.warning("%s: no token ids available for prompts; sending text", url)
            mode = "text"
        base = {**base_row, "run_id": run_id, "backend": base_row.get("backend") or f"server:{url}",
                "server": info.as_dict(), "workload": workload.as_dict(), "prompt_mode": mode,
                "env": _env(info), "model": base_row.get("model") or info.model_id}
        if workload.warmup and not info.problem:
            warm = [PlannedRequest(i, p.prompt[:16] if isinstance(p.prompt, list) else " ".join(p.prompt.split()[:16]),
                                   16, 2, p.exact) for i, p in enumerate(plan_level(workload, -1, workload.warmup, pool))]
            wl = replace(workload, timeout_s=min(workload.timeout_s, 120.0), read_timeout_s=None,
                         level_time_limit_s=None)
            for p in warm:
                rq = RequestResult("warmup", -1, p.index, p.max_tokens, None)
                await send_request(client, url + ENDPOINTS[workload.endpoint], request_body(wl, info, p), rq, wl,
                            time.perf_counter(), None, dead)
                if not rq.ok:
                    log.warning("warmup request failed: %s", rq.reason)
        total = sum(workload.n_requests(lv) for lv in workload.levels)
        bar = _progress_bar(total, progress)
        all_requests: list[RequestResult] = []
        summaries: list[dict[str, Any]] = []
        rows: list[dict[str, Any]] = []
        n_failed = [0]

        def keep(row):
            rows.append(store.append(row) if store is not None else row)

        try:
            for li, level in enumerate(workload.levels):
                n = workload.n_requests(level)
                plan = plan_level(workload, li, n, pool if mode == "tokens" else None)
                before = await scrape_metrics(client, url) if info.metrics else None

                pending: list[dict[str, Any]] = []   # stored after the level: no disk I/O while streams run

                def done(rq: RequestResult, level=level, pending=pending):
                    pending.append(_request_row(base, rq, level))
                    n_failed[0] += not rq.ok
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix_str(f"{level.name} failed={n_failed[0]}", refresh=False)
                    all_requests.append(rq)
                    if on_request:
                        on_request(rq)

                log.info("level %s: %d requests", level.name, n)
                try:
                    res, duration = await run_level(client, url, info, workload, level, li, plan, done, dead)
                finally:          # also on Ctrl-C: the requests that finished are kept
                    for row in sorted(pending, key=lambda r: r["index"]):
                        keep(row)
                after = await scrape_metrics(client, url) if info.metrics and not dead() else None
                summary = summarize_level(res, duration, workload.slo, level)
                if info.kind == "llama-server":
                    summary.update(server_side_by_side(res, duration, before, after))
                summaries.append(summary)
                keep(_level_row(base, summary, level, li, workload))
                log.info("level %s: %d/%d ok, %.3g req/s, %.3g output tok/s, median TTFT %s ms",
                         level.name, summary["completed"], n, summary["request_throughput"] or 0.0,
                         summary["output_throughput"] or 0.0, fmt_figure(summary["ttft_ms_median"]))
        finally:
            if bar is not None:
                bar.close()
    all_requests.sort(key=lambda r: (r.level_index, r.index))
    return ServeRun(target=url, server=info.as_dict() | {"prompt_mode": mode}, workload=workload,
                    levels=summaries, requests=all_requests, rows=rows, run_id=run_id)


def _progress_bar(total: int, progress: bool | None):
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    return tqdm(total=total, unit="req", desc="serve-bench", file=sys.stderr, leave=False)

