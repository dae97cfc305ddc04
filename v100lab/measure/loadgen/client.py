"""The HTTP client (httpx, async): probe what answers at a URL, build prompts from the server's vocabulary,
stream one request's server-sent events into a :class:`~v100lab.measure.loadgen.request.RequestResult`, and run
one level closed- or open-loop. httpx is imported inside the functions that use it (a network stack,
loaded only when a run talks to a server)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from v100lab.measure.loadgen.request import RequestResult
from v100lab.measure.loadgen.workload import (ENDPOINTS, MAX_ERROR_BODY, MAX_EVENT_LINE, WORDS, Level, PlannedRequest, Workload,
                                      arrival_offsets)

log = logging.getLogger(__name__)

class _Failed(Exception):
    """A request that failed, with its one-line reason."""


def _one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    s = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _error_message(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        return _one_line(text, 200) or "(empty body)"
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        err = err.get("message") or err
    return _one_line(err, 200)


# --------------------------------------------------------------------------------------------
# the server: what answers at the URL
# --------------------------------------------------------------------------------------------

@dataclass
class ServerInfo:
    """What the URL told us before the run (every field optional: any OpenAI-compatible server works)."""

    url: str
    kind: str | None = None            # "llama-server", "openai" (answers /v1/models), None (unknown)
    model_id: str | None = None
    n_vocab: int | None = None
    total_slots: int | None = None
    n_ctx: int | None = None           # one slot's context (llama-server)
    build_info: str | None = None
    metrics: bool = False
    problem: str | None = None         # why the probe found no OpenAI-compatible server (the run goes on)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _get_json(client, url: str, timeout: float = 10.0) -> tuple[int | None, Any, str | None]:
    import httpx  # network stack: loaded only when a run talks to a server

    try:
        r = await client.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return None, None, f"{type(exc).__name__}: {_one_line(exc, 200) or 'no answer'}"
    try:
        return r.status_code, r.json(), None
    except ValueError:
        return r.status_code, None, None


async def probe(client, url: str) -> ServerInfo:
    """GET /v1/models (OpenAI), /props and /metrics (llama-server). Never raises: a problem is recorded."""
    info = ServerInfo(url=url)
    st, body, err = await _get_json(client, url + "/v1/models")
    if err:
        info.problem = f"no answer from {url}: {err}"
        return info
    data = body.get("data") if isinstance(body, dict) else None
    if st == 200 and isinstance(data, list):
        info.kind = "openai"
        if data and isinstance(data[0], dict):
            info.model_id = data[0].get("id") if isinstance(data[0].get("id"), str) else None
            meta = data[0].get("meta")
            if isinstance(meta, dict) and isinstance(meta.get("n_vocab"), int):
                info.n_vocab = meta["n_vocab"]
            if isinstance(meta, dict) and isinstance(meta.get("n_ctx"), int):
                info.n_ctx = meta["n_ctx"]          # llama-server: the context of one slot
            if data[0].get("owned_by") == "llamacpp":
                info.kind = "llama-server"
    else:
        info.problem = f"GET /v1/models answered HTTP {st}" + ("" if body is not None else " (not JSON)")
    st, props, _ = await _get_json(client, url + "/props")
    if st == 200 and isinstance(props, dict) and ("total_slots" in props or "build_info" in props):
        info.kind = "llama-server"
        info.problem = None
        info.total_slots = props.get("total_slots") if isinstance(props.get("total_slots"), int) else None
        info.build_info = str(props.get("build_info")) if props.get("build_info") else None
        gen = props.get("default_generation_settings") or {}
        n_ctx = gen.get("n_ctx") if isinstance(gen, dict) else None
        info.n_ctx = n_ctx if isinstance(n_ctx, int) else info.n_ctx
    if info.kind == "llama-server":
        info.metrics = await scrape_metrics(client, url) is not None
    return info


async def scrape_metrics(client, url: str) -> dict[str, float] | None:
    """llama-server's Prometheus ``/metrics`` as {name: value} (None when not enabled: start with --metrics)."""
    import httpx  # network stack: loaded only when a run talks to a server

    try:
        r = await client.get(url + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return parse_prometheus(r.text)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition → {metric name (labels dropped): value}; comments and bad lines skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines()[:10000]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2:
            continue
        name = parts[0].split("{", 1)[0]
        try:
            v = float(parts[1])
        except ValueError:
            continue
        if math.isfinite(v):
            out[name] = v
    return out


# --------------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------------


async def token_pool(client, url: str, info: ServerInfo) -> list[int] | None:
    """Word tokens of this server's vocabulary (llama-server ``/tokenize`` of the word list): prompts of
    random real words with an exact token count, and no special tokens."""
    import httpx  # network stack: loaded only when a run talks to a server

    try:
        r = await client.post(url + "/tokenize", json={"content": " " + " ".join(WORDS)}, timeout=30.0)
        toks = r.json().get("tokens") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        toks = None
    if isinstance(toks, list) and toks and all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
        return sorted(set(toks))
    if info.n_vocab and info.n_vocab > 1000:
        lo, hi = info.n_vocab // 20, info.n_vocab * 9 // 10   # specials tend to sit at either end
        log.warning("%s/tokenize unavailable: prompts are random token ids in [%d, %d)", url, lo, hi)
        return list(range(lo, hi))
    return None


def request_body(workload: Workload, info: ServerInfo, req: PlannedRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": info.model_id or "default", "max_tokens": req.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}, "temperature": workload.temperature}
    if workload.endpoint == "chat":
        text = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = req.prompt
    if workload.ignore_eos:
        body["ignore_eos"] = True
    if info.kind == "llama-server":
        body["cache_prompt"] = False      # every prompt is processed in full (no reuse across requests)
    return body


# --------------------------------------------------------------------------------------------
# one request
# --------------------------------------------------------------------------------------------

def _event_lines(buf: bytearray, chunk: bytes):
    buf += chunk
    while True:
        i = buf.find(b"\n")
        if i < 0:
            if len(buf) > MAX_EVENT_LINE:
                raise _Failed(f"the server sent a line longer than {MAX_EVENT_LINE} bytes without a newline")
            return
        line = bytes(buf[:i]).rstrip(b"\r")
        del buf[: i + 1]
        yield line


async def _stream_request(client, url: str, body: dict, rq: RequestResult, t0: float, chat: bool,
                          read_timeout: float) -> None:
    """Send one streamed request and fill ``rq`` from its events (raises _Failed with the reason)."""
    import httpx  # network stack: loaded only when a run talks to a server

    times: list[float] = []
    last_choice_t: float | None = None
    done = False
    malformed = 0
    timeout = httpx.Timeout(connect=min(10.0, read_timeout), read=read_timeout, write=30.0, pool=None)
    async with client.stream("POST", url, json=body, timeout=timeout) as resp:
        rq.http_status = resp.status_code
        if resp.status_code != 200:
            raw = b""
            async for chunk in resp.aiter_bytes():
                raw += chunk
                if len(raw) >= MAX_ERROR_BODY:
                    break
            raise _Failed(f"HTTP {resp.status_code}: {_error_message(raw[:MAX_ERROR_BODY])}")
        ctype = resp.headers.get("content-type", "")
        if ctype and "text/event-stream" not in ctype:
            raw = b""
            async for chunk in resp.aiter_bytes():
                raw += chunk
                if len(raw) >= 200:
                    break
            raise _Failed(f"not an OpenAI-compatible stream: HTTP 200 with content-type '{_one_line(ctype, 60)}' "
                          f"instead of text/event-stream ({_one_line(raw[:80].decode('utf-8', 'replace'), 80)!r})")
        buf = bytearray()
        async for chunk in resp.aiter_raw():
            now = time.perf_counter()
            for line in _event_lines(buf, chunk):
                if not line.startswith(b"data:"):
                    continue               # blank separators, ": comments", "event:" fields
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                try:
                    ev = json.loads(payload)
                except ValueError:
                    malformed += 1
                    continue
                if not isinstance(ev, dict):
                    malformed += 1
                    continue
                if ev.get("error") is not None:
                    raise _Failed(f"error event in the stream after {len(times)} token(s): "
                                  f"{_error_message(json.dumps(ev).encode())}")
                choices = ev.get("choices")
                if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                    c0 = choices[0]
                    text = (c0.get("delta") or {}).get("content") if chat else c0.get("text")
                    last_choice_t = now
                    if text:
                        times.append(now)
                        rq.n_events = len(times)
                    if c0.get("finish_reason"):
                        rq.finish_reason = str(c0["finish_reason"])
                if isinstance(ev.get("usage"), dict):
                    rq.usage = {k: v for k, v in ev["usage"].items() if isinstance(v, (int, float))}
                if isinstance(ev.get("timings"), dict):
                    rq.server_timings = {k: v for k, v in ev["timings"].items() if isinstance(v, (int, float))}
            if done:
                break
    end = time.perf_counter()
    rq.n_events = len(times)
    if not done and rq.finish_reason is None:
        extra = f"; {malformed} malformed event(s)" if malformed else ""
        if buf.strip():
            extra += f"; the last event was cut mid-line ({len(buf)} bytes without a newline)"
        raise _Failed(f"stream ended before the response was complete (no finish_reason, no [DONE]) "
                      f"after {len(times)} token(s){extra}")
    if not times:
        raise _Failed("the stream carried no generated text (no TTFT)"
                      + (f"; {malformed} malformed event(s)" if malformed else ""))
    rq.ttft_s = times[0] - t0
    rq.itl_s = [b - a for a, b in zip(times, times[1:])]
    rq.e2el_s = (last_choice_t or end) - t0
    usage = rq.usage or {}
    tm = rq.server_timings or {}
    rq.n_gen = _int(usage.get("completion_tokens")) or _int(tm.get("predicted_n")) or len(times)
    rq.n_prompt = _int(usage.get("prompt_tokens"))
    if rq.n_prompt is None and tm.get("prompt_n") is not None:
        rq.n_prompt = _int(tm.get("prompt_n")) + (_int(tm.get("cache_n")) or 0)
    if rq.n_prompt is None:
        rq.n_prompt = rq.prompt_tokens_sent
    rq.draft_n, rq.draft_n_accepted = draft_counts(tm)
    rq.status = "ok"


def draft_counts(timings) -> tuple[int | None, int | None]:
    """(draft_n, draft_n_accepted) from llama-server's ``timings``; it reports them only for a request that
    drafted (tools/server/server-common.cpp server_slot_stats::to_json), so (None, None) otherwise."""
    tm = timings if isinstance(timings, dict) else {}
    n, acc = _int(tm.get("draft_n")), _int(tm.get("draft_n_accepted"))
    if n is None or n < 0 or acc is None or not 0 <= acc <= n:
        return None, None
    return n, acc


def _int(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


async def send_request(client, url: str, body: dict, rq: RequestResult, workload: Workload, level_t0: float,
                deadline: float | None, dead: Callable[[], str | None]) -> RequestResult:
    import httpx  # network stack: loaded only when a run talks to a server

    why = dead()
    if why:
        rq.reason = f"not sent: {why}"
        return rq
    timeout = workload.timeout_s
    if deadline is not None:
        timeout = min(timeout, max(0.001, deadline - time.perf_counter()))
    read_timeout = min(workload.read_timeout_s or workload.timeout_s, timeout)
    t0 = time.perf_counter()
    rq.t_send = t0 - level_t0
    try:
        await asyncio.wait_for(_stream_request(client, url, body, rq, t0, workload.endpoint == "chat",
                                               read_timeout), timeout)
    except _Failed as exc:
        rq.reason = str(exc)
    except asyncio.TimeoutError:
        limit = "the level's time limit" if timeout < workload.timeout_s else "its time limit"
        rq.reason = f"timed out after {timeout:.3g} s ({limit}) with {rq.n_events or 0} token(s) received"
    except httpx.ConnectError as exc:
        rq.reason = f"cannot connect to {url}: {_one_line(exc, 160) or 'connection refused'}"
    except httpx.ReadTimeout:
        rq.reason = f"no data from the server for {read_timeout:.3g} s (read timeout)"
    except httpx.RemoteProtocolError as exc:
        rq.reason = f"stream cut: the connection closed mid-response ({_one_line(exc, 160)})"
    except httpx.HTTPError as exc:
        rq.reason = f"{type(exc).__name__}: {_one_line(exc, 200) or 'connection lost'}"
    if not rq.ok:
        rq.ttft_s = rq.e2el_s = None
        rq.itl_s = []
        why = dead()
        if why:
            rq.reason = f"{rq.reason} — {why}"
    return rq



async def run_level(client, url: str, info: ServerInfo, workload: Workload, level: Level, li: int,
                     plan: list[PlannedRequest], on_done: Callable[[RequestResult], None],
                     dead: Callable[[], str | None]) -> tuple[list[RequestResult], float]:
    endpoint = url + ENDPOINTS[workload.endpoint]
    results = [RequestResult(level=level.name, level_index=li, index=p.index, max_tokens=p.max_tokens,
                             prompt_tokens_sent=p.prompt_tokens if p.exact else None) for p in plan]
    t0 = time.perf_counter()
    deadline = t0 + workload.level_time_limit_s if workload.level_time_limit_s else None

    async def one(i: int):
        rq = results[i]
        if deadline is not None and time.perf_counter() >= deadline:
            rq.reason = f"not sent: the level's time limit ({workload.level_time_limit_s:g} s) was reached"
        else:
            await send_request(client, endpoint, request_body(workload, info, plan[i]), rq, workload, t0, deadline, dead)
        on_done(rq)

    if level.concurrency is not None:
        next_i = iter(range(len(plan)))

        async def worker():
            for i in next_i:            # a shared iterator: each index is taken once
                await one(i)

        await asyncio.gather(*(worker() for _ in range(min(level.concurrency, len(plan)))))
    else:
        sem = asyncio.Semaphore(level.max_concurrency) if level.max_concurrency else None

        async def capped(i: int):
            if sem is None:
                return await one(i)
            async with sem:
                return await one(i)

        tasks = []
        for i, at in enumerate(arrival_offsets(level, len(plan), workload.seed)):
            wait = t0 + at - time.perf_counter()
            if deadline is not None and t0 + at >= deadline:
                wait = max(0.0, min(wait, deadline - time.perf_counter()))
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.ensure_future(capped(i)))
        await asyncio.gather(*tasks)
    sent = [r for r in results if r.t_send is not None]
    ends = [r.t_send + (r.e2el_s or 0.0) for r in results if r.ok]
    duration = max(ends) - min(r.t_send for r in sent) if ends else time.perf_counter() - t0
    return results, duration
