"""A load generator for OpenAI-compatible servers: serving measured the way serving benchmarks measure it.

What it sends: streamed ``POST /v1/completions`` (or ``/v1/chat/completions``) requests to llama-server,
llama-cpp-python's server, vLLM or any OpenAI-compatible URL, and reads each response's server-sent events
token by token (httpx, async). The workload:

* **levels** — closed-loop concurrency (``Level(concurrency=4)``: four requests always in flight, the next
  sent as one finishes) or open-loop arrival at a rate (``Level(rate=2.0, arrival="poisson")``: requests
  sent at exponential intervals, or ``"constant"`` ones, whatever the server's state; optionally capped
  at ``max_concurrency`` in flight, as ``vllm bench serve --max-concurrency``);
* **lengths** — prompt and output lengths fixed (``Lengths.parse("128")``) or drawn from a distribution
  (``"uniform:64-256"``, ``"normal:128,32"``), seeded: every level sends the same lengths in the same order
  (its prompts' *content* differs per level, and llama-server's prompt cache is off, so no level reuses
  another's cache);
* **prompts** — for llama-server, token ids (exact counts): real word tokens from the server's own
  ``/tokenize`` of a word list, drawn at random; for other servers, text of random common words, counted
  by the server's ``usage.prompt_tokens`` when it reports one. Output: greedy (temperature 0) with
  ``ignore_eos`` so each request generates its ``max_tokens``.

Per request (:class:`RequestResult`): TTFT, each inter-token gap, end-to-end latency, prompt and generated
token counts, status and the reason of a failure, and llama-server's own ``timings`` when it sends them.

Per level (:func:`summarize_level`), with **vLLM's definitions** (``vllm bench serve``,
``vllm/benchmarks/serve.py`` ``calculate_metrics`` and the OpenAI completions request function):

* TTFT — from sending the request to the first event carrying generated text;
* ITL (inter-token latency) — the gap between successive events carrying text, *pooled over all
  requests* (every gap of every request is one sample);
* TPOT (time per output token) — per request, ``(latency − TTFT) / (output tokens − 1)``, for requests with
  more than one output token; output tokens are the server's ``usage.completion_tokens`` (else
  llama-server's ``timings.predicted_n``, else the number of text events);
* E2EL (end-to-end latency) — from sending to the last event carrying ``choices``;
* request throughput = completed requests / level duration; output tok/s = output tokens / duration;
  total tok/s = (prompt + output tokens) / duration; the duration runs from the first send to the last
  response of the level;
* goodput = requests meeting every stated SLO (TTFT ≤ ``slo.ttft_ms``, TPOT ≤ ``slo.tpot_ms``, E2EL ≤
  ``slo.e2el_ms``) / duration (a request with one output token has no TPOT and meets a TPOT limit, as in vLLM);
* mean, median, p90, p99 (numpy's linear interpolation) and standard deviation of TTFT, TPOT, ITL, E2EL, in ms.

Faults never stop a run: a URL that is not an OpenAI-compatible server, an HTTP 4xx/5xx, a stream cut
mid-event, a server that dies, a request past its time limit — each becomes a request with status
``failed`` and its reason; the summary counts them. Every request is bounded in time (``timeout_s``,
``read_timeout_s`` between two events), every level in count, and optionally in time
(``level_time_limit_s``).

Against llama-server (:func:`server_side_by_side`), each level also holds the server's own figures for the
same requests: ``timings`` (prompt_ms, predicted_ms, predicted_per_second) and the deltas of its
``/metrics`` counters over the level (when started with ``--metrics``; :func:`serve_bench` does).

Entry points: :func:`run_serve_bench` (a URL), :func:`serve_bench` (a URL, or a model it serves with
llama-server on 127.0.0.1 for the duration), :func:`levels_frame` / :func:`requests_frame` (pandas).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import math
import os
import platform
import random
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from v100lab.errors import ConfigError
from v100lab.safeio import json_safe

log = logging.getLogger(__name__)

MAX_LENGTH = 1 << 20            # tokens: a prompt or output length above this is refused as a typo
MAX_REQUESTS = 100_000          # requests per level
MAX_CONCURRENCY = 4096
MAX_EVENT_LINE = 1 << 20        # bytes: a server-sent line longer than this fails the request
MAX_ERROR_BODY = 2048           # bytes of an error answer kept for the reason
DEFAULT_TIMEOUT_S = 300.0
STATS = ("mean", "median", "p90", "p99", "std")
METRICS = ("ttft", "tpot", "itl", "e2el")
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PROMPT_MODES = ("auto", "tokens", "text")

# Common English words: one token each (with their leading space) for most BPE vocabularies.
_WORDS = tuple("""the of and to in is was for on that with as by at from his her he she it they we you this
which are were be been has have had not but or an all one two three first new time year people way day man
woman work life world school state family group country problem hand part place case week company system
program question government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour game line end
member law car city name team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment air teacher force
education foot boy age policy music market sense nation plan college interest death experience effect use
class control care field development role effort rate heart drug show leader light voice wife police mind
price report decision son view relationship town road arm difference value building action model season
society tax director position player record paper space ground form event official matter center couple
site project activity star table need court oil situation cost industry figure street image phone data
picture practice piece land product doctor wall patient worker news test movie north love support
technology step baby computer type attention film tree source organization hair window evidence population
truth song energy""".split())


# --------------------------------------------------------------------------------------------
# the workload
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lengths:
    """A token length: ``fixed`` (a), ``uniform`` integers in [a, b], or ``normal`` (mean a, sd b, rounded,
    clipped to [1, a + 3b]). Drawn with the workload's seeded generator."""

    kind: str = "fixed"
    a: float = 128
    b: float = 0

    def __post_init__(self):
        if self.kind not in ("fixed", "uniform", "normal"):
            raise ConfigError(f"length distribution must be fixed, uniform or normal, got '{self.kind}'")
        for v in (self.a, self.b):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ConfigError(f"length {self}: not a finite number")
        if self.kind in ("fixed", "uniform") and self.a != int(self.a):
            raise ConfigError(f"length {self}: token counts are whole numbers")
        if self.kind == "uniform" and (self.b != int(self.b) or self.b < self.a):
            raise ConfigError(f"length {self}: a uniform range needs LO <= HI (whole numbers)")
        if self.kind == "normal" and self.b < 0:
            raise ConfigError(f"length {self}: the standard deviation must be >= 0")
        if self.a < 1:
            raise ConfigError(f"length {self}: must be at least 1 token")
        if self.max > MAX_LENGTH:
            raise ConfigError(f"length {self}: more than {MAX_LENGTH} tokens")

    @classmethod
    def parse(cls, text: "str | int | Lengths", what: str = "length") -> "Lengths":
        """``128`` (fixed), ``64-256`` or ``uniform:64-256``, ``normal:128,32`` (mean, sd)."""
        if isinstance(text, Lengths):
            return text
        if isinstance(text, int) and not isinstance(text, bool):
            return cls("fixed", text)
        s = str(text).strip().lower()
        kind, sep, rest = s.partition(":")
        if not sep:
            kind, rest = ("uniform", s) if "-" in s else ("fixed", s)
        try:
            if kind == "fixed":
                return cls("fixed", int(rest))
            if kind == "uniform":
                lo, dash, hi = rest.partition("-")
                if not dash:
                    raise ValueError
                return cls("uniform", int(lo), int(hi))
            if kind == "normal":
                mean, comma, sd = rest.partition(",")
                if not comma:
                    raise ValueError
                return cls("normal", float(mean), float(sd))
        except ValueError:
            pass
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
        raise ConfigError(f"{what}: '{text}' is not a length (N, LO-HI, uniform:LO-HI or normal:MEAN,SD)")

    @property
    def min(self) -> int:
        return int(self.a) if self.kind != "normal" else 1

    @property
    def max(self) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return int(self.b)
        return max(1, int(round(self.a + 3 * self.b)))

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else float(self.a)

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return min(self.max, max(1, int(round(rng.gauss(self.a, self.b)))))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}-{int(self.b)}"
        return f"normal:{self.a:g},{self.b:g}"


@dataclass(frozen=True)
class Level:
    """One load level: closed-loop ``concurrency`` requests in flight, or open-loop arrival at ``rate``
    requests/s (``arrival`` "constant" or "poisson"; ``math.inf`` sends them all at once), at most
    ``max_concurrency`` in flight (None: no cap)."""

    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "closed"
    max_concurrency: int | None = None

    def __post_init__(self):
        if (self.concurrency is None) == (self.rate is None):
            raise ConfigError("a level is either a concurrency or a request rate")
        if self.concurrency is not None:
            if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) \
                    or not 1 <= self.concurrency <= MAX_CONCURRENCY:
                raise ConfigError(f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY}, "
                                  f"got {self.concurrency!r}")
            if self.arrival != "closed":
                object.__setattr__(self, "arrival", "closed")
        else:
            if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or math.isnan(self.rate) \
                    or self.rate <= 0:
                raise ConfigError(f"request rate must be a number > 0 (requests/s) or inf, got {self.rate!r}")
            if self.arrival not in ("constant", "poisson"):
                raise ConfigError(f"arrival must be constant or poisson, got '{self.arrival}'")
        if self.max_concurrency is not None and (isinstance(self.max_concurrency, bool)
                                                 or not isinstance(self.max_concurrency, int)
                                                 or not 1 <= self.max_concurrency <= MAX_CONCURRENCY):
            raise ConfigError(f"max concurrency must be a whole number from 1 to {MAX_CONCURRENCY}")

    @property
    def name(self) -> str:
        if self.concurrency is not None:
            return f"c{self.concurrency}"
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        cap = f" max{self.max_concurrency}" if self.max_concurrency else ""
        return f"{'poisson' if self.arrival == 'poisson' else 'rate'}:{rate}/s{cap}"

    @property
    def in_flight_cap(self) -> int | None:
        return self.concurrency if self.concurrency is not None else self.max_concurrency


def parse_concurrency(text: "str | int | Iterable[int] | None") -> tuple[Level, ...]:
    """``"1,2,4,8"`` → closed-loop levels."""
    if text is None or text == "":
        return ()
    if isinstance(text, int) and not isinstance(text, bool):
        items: list = [text]
    elif isinstance(text, str):
        items = [p.strip() for p in text.split(",") if p.strip()]
    else:
        items = list(text)
    out = []
    for item in items:
        try:
            n = int(item)
        except (TypeError, ValueError):
            raise ConfigError(f"--concurrency: '{item}' is not a whole number (e.g. 1,2,4,8)") from None
        if str(item).strip() != str(n) and not isinstance(item, int):
            raise ConfigError(f"--concurrency: '{item}' is not a whole number (e.g. 1,2,4,8)")
        out.append(Level(concurrency=n))
    if not out:
        raise ConfigError("--concurrency: no level given (e.g. 1,2,4,8)")
    return tuple(out)


def parse_rate(text: "str | float | None", max_concurrency: int | None = None) -> tuple[Level, ...]:
    """``"2"``, ``"1,2,4"``, ``"poisson:2"``, ``"poisson:1,2,4"``, ``"constant:2"``, ``"inf"`` → open-loop levels."""
    if text is None or text == "":
        return ()
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return (Level(rate=float(text), arrival="constant", max_concurrency=max_concurrency),)
    s = str(text).strip().lower()
    arrival, sep, rest = s.partition(":")
    if not sep:
        arrival, rest = "constant", s
    if arrival not in ("constant", "poisson"):
        raise ConfigError(f"--rate: '{text}' (R, constant:R or poisson:R, R in requests/s; several: poisson:1,2,4)")
    out = []
    for part in [p.strip() for p in rest.split(",") if p.strip()]:
        try:
            rate = float(part)
        except ValueError:
            raise ConfigError(f"--rate: '{part}' is not a number of requests/s") from None
        out.append(Level(rate=rate, arrival=arrival, max_concurrency=max_concurrency))
    if not out:
        raise ConfigError(f"--rate: '{text}' names no rate")
    return tuple(out)


@dataclass(frozen=True)
class SLO:
    """Service-level objective for goodput: limits in milliseconds (None: no limit on that figure)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self):
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):
                raise ConfigError(f"SLO {name}: must be a number of milliseconds > 0, got {v!r}")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def met(self, r: "RequestResult") -> bool:
        if not r.ok:
            return False
        if self.ttft_ms is not None and r.ttft_ms > self.ttft_ms:
            return False
        if self.tpot_ms is not None and r.tpot_ms is not None and r.tpot_ms > self.tpot_ms:
            return False
        return not (self.e2el_ms is not None and r.e2el_ms > self.e2el_ms)


def default_requests(level: Level) -> int:
    """Requests per level when none is given: 4 × the concurrency (at least 8); 32 for a rate."""
    cap = level.in_flight_cap
    return max(8, 4 * level.concurrency) if level.concurrency is not None else max(32, 4 * (cap or 0))


@dataclass(frozen=True)
class Workload:
    """What to send. ``requests`` per level (None: :func:`default_requests`); ``timeout_s`` bounds each
    request from send to its last event, ``read_timeout_s`` the wait for any one event (default: timeout_s);
    ``level_time_limit_s`` stops sending new requests at a level after that long (the unsent ones are failed
    rows "not sent"). ``warmup`` requests (short, unrecorded) go before the first level."""

    levels: tuple[Level, ...] = (Level(concurrency=1),)
    requests: int | None = None
    prompt_tokens: Lengths = Lengths("fixed", 128)
    max_tokens: Lengths = Lengths("fixed", 64)
    seed: int = 0
    slo: SLO = SLO()
    timeout_s: float = DEFAULT_TIMEOUT_S
    read_timeout_s: float | None = None
    level_time_limit_s: float | None = None
    endpoint: str = "completions"
    prompt_mode: str = "auto"
    warmup: int = 1
    temperature: float = 0.0
    ignore_eos: bool = True

    def __post_init__(self):
        levels = tuple(self.levels)
        if not levels or not all(isinstance(lv, Level) for lv in levels):
            raise ConfigError("a workload needs at least one level (concurrency or rate)")
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "prompt_tokens", Lengths.parse(self.prompt_tokens, "--prompt-tokens"))
        object.__setattr__(self, "max_tokens", Lengths.parse(self.max_tokens, "--max-tokens"))
        if self.requests is not None:
            if isinstance(self.requests, bool) or not isinstance(self.requests, int) \
                    or not 1 <= self.requests <= MAX_REQUESTS:
                raise ConfigError(f"--requests: must be a whole number from 1 to {MAX_REQUESTS}, got {self.requests!r}")
            short = [lv.name for lv in levels if lv.concurrency is not None and lv.concurrency > self.requests]
            if short:
                raise ConfigError(f"--requests {self.requests} is fewer than the concurrency of level(s) "
                                  f"{', '.join(short)}: such a level never reaches its concurrency")
        for name in ("timeout_s", "read_timeout_s", "level_time_limit_s"):
            v = getattr(self, name)
            if v is None and name != "timeout_s":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{name}: must be a number of seconds > 0, got {v!r}")
        if self.endpoint not in ENDPOINTS:
            raise ConfigError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got '{self.endpoint}'")
        if self.prompt_mode not in PROMPT_MODES:
            raise ConfigError(f"prompt mode must be one of {', '.join(PROMPT_MODES)}, got '{self.prompt_mode}'")
        if self.endpoint == "chat" and self.prompt_mode == "tokens":
            raise ConfigError("the chat endpoint takes text: use prompt mode text or auto")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or not 0 <= self.warmup <= 100:
            raise ConfigError(f"warmup: must be a whole number of requests from 0 to 100, got {self.warmup!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed: must be a whole number, got {self.seed!r}")
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) \
                or self.temperature < 0:
            raise ConfigError(f"temperature: must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.slo, SLO):
            raise ConfigError("slo: must be an SLO")

    def n_requests(self, level: Level) -> int:
        return self.requests if self.requests is not None else default_requests(level)

    @property
    def tokens_per_request_max(self) -> int:
        """The most context one request can need (prompt + output): what each server slot must hold."""
        return self.prompt_tokens.max + self.max_tokens.max

    def as_dict(self) -> dict[str, Any]:
        return {"levels": [lv.name for lv in self.levels], "requests": self.requests,
                "prompt_tokens": str(self.prompt_tokens), "max_tokens": str(self.max_tokens), "seed": self.seed,
                "slo": asdict(self.slo), "timeout_s": self.timeout_s, "read_timeout_s": self.read_timeout_s,
                "level_time_limit_s": self.level_time_limit_s, "endpoint": self.endpoint,
                "prompt_mode": self.prompt_mode, "warmup": self.warmup, "temperature": self.temperature,
                "ignore_eos": self.ignore_eos}


# --------------------------------------------------------------------------------------------
# per request
# --------------------------------------------------------------------------------------------

@dataclass
class RequestResult:
    """One request as the client saw it. Times in seconds from the level's start (``t_send``) or from this
    request's send (``ttft_s``, ``e2el_s``); ``itl_s`` holds each gap between text events."""

    level: str
    level_index: int
    index: int
    max_tokens: int
    prompt_tokens_sent: int | None          # the prompt's length as sent (exact for token prompts)
    status: str = "failed"
    reason: str | None = None
    t_send: float | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2el_s: float | None = None
    n_events: int = 0                       # events carrying generated text
    n_prompt: int | None = None             # prompt tokens (server's count when reported)
    n_gen: int | None = None                # output tokens (server's count when reported)
    finish_reason: str | None = None
    http_status: int | None = None
    usage: dict[str, Any] | None = None
    server_timings: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ttft_ms(self) -> float | None:
        return None if self.ttft_s is None else 1e3 * self.ttft_s

    @property
    def e2el_ms(self) -> float | None:
        return None if self.e2el_s is None else 1e3 * self.e2el_s

    @property
    def tpot_ms(self) -> float | None:
        """vLLM's TPOT: (latency − TTFT) / (output tokens − 1); None with fewer than two output tokens."""
        if not self.ok or not self.n_gen or self.n_gen < 2 or self.ttft_s is None or self.e2el_s is None:
            return None
        return 1e3 * (self.e2el_s - self.ttft_s) / (self.n_gen - 1)

    @property
    def decode_ts(self) -> float | None:
        """This request's decode rate: output tokens after the first per second (1000 / TPOT)."""
        t = self.tpot_ms
        return 1e3 / t if t else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, e2el_ms=self.e2el_ms,
                 itl_ms=[1e3 * x for x in self.itl_s], decode_ts=self.decode_ts)
        del d["itl_s"]
        return json_safe(d)


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
    import httpx

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
    import httpx

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

@dataclass(frozen=True)
class PlannedRequest:
    index: int
    prompt: Any                       # list of token ids, or text
    prompt_tokens: int                # drawn length
    max_tokens: int
    exact: bool                       # token ids: the server sees exactly prompt_tokens


def _lengths(workload: Workload, n: int) -> list[tuple[int, int]]:
    """The seeded (prompt, output) lengths of the first n requests: the same at every level."""
    rng = random.Random(f"v100lab-lengths-{workload.seed}")
    return [(workload.prompt_tokens.draw(rng), workload.max_tokens.draw(rng)) for _ in range(n)]


def plan_level(workload: Workload, level_index: int, n: int, token_pool: Sequence[int] | None) -> list[PlannedRequest]:
    """The requests of one level: seeded lengths (shared by levels), seeded content (one per level)."""
    rng = random.Random(f"v100lab-prompts-{workload.seed}-{level_index}")
    out = []
    for i, (np_, nt) in enumerate(_lengths(workload, n)):
        if token_pool:
            prompt: Any = [rng.choice(token_pool) for _ in range(np_)]
            exact = True
        else:
            prompt = " ".join(rng.choice(_WORDS) for _ in range(np_))
            exact = False
        out.append(PlannedRequest(i, prompt, np_, nt, exact))
    return out


async def _token_pool(client, url: str, info: ServerInfo) -> list[int] | None:
    """Word tokens of this server's vocabulary (llama-server ``/tokenize`` of the word list): prompts of
    random real words with an exact token count, and no special tokens."""
    import httpx

    try:
        r = await client.post(url + "/tokenize", json={"content": " " + " ".join(_WORDS)}, timeout=30.0)
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


def _body(workload: Workload, info: ServerInfo, req: PlannedRequest) -> dict[str, Any]:
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
    import httpx

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
    rq.status = "ok"


def _int(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


async def _send(client, url: str, body: dict, rq: RequestResult, workload: Workload, level_t0: float,
                deadline: float | None, dead: Callable[[], str | None]) -> RequestResult:
    import httpx

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


# --------------------------------------------------------------------------------------------
# one level
# --------------------------------------------------------------------------------------------

def arrival_offsets(level: Level, n: int, seed: int) -> list[float]:
    """Send times (s from the level's start) of an open-loop level: the first at 0, then intervals of 1/rate
    (constant) or exponential with mean 1/rate (poisson, seeded), as vLLM's request generator."""
    if level.rate is None or math.isinf(level.rate):
        return [0.0] * n
    rng = random.Random(f"v100lab-arrivals-{seed}-{level.name}")
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(level.rate) if level.arrival == "poisson" else 1.0 / level.rate
    return out


async def _run_level(client, url: str, info: ServerInfo, workload: Workload, level: Level, li: int,
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
            await _send(client, endpoint, _body(workload, info, plan[i]), rq, workload, t0, deadline, dead)
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


# --------------------------------------------------------------------------------------------
# summaries
# --------------------------------------------------------------------------------------------

def _stats(values: Sequence[float]) -> dict[str, float | None]:
    import numpy as np

    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {s: None for s in STATS}
    a = np.asarray(vals, dtype=float)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "std": float(a.std())}


def summarize_level(results: Sequence[RequestResult], duration_s: float, slo: SLO = SLO(),
                    level: Level | None = None) -> dict[str, Any]:
    """One level's figures with vLLM's definitions (see the module docstring); flat keys
    (``ttft_ms_median``, ``itl_ms_p99``, ...) so levels make a table. Never NaN: an empty figure is None."""
    ok = [r for r in results if r.ok]
    dur = duration_s if duration_s and duration_s > 0 else None
    n_in = sum(r.n_prompt or 0 for r in ok)
    n_out = sum(r.n_gen or 0 for r in ok)
    out: dict[str, Any] = {
        "level": level.name if level else (results[0].level if results else None),
        "concurrency": level.concurrency if level else None,
        "request_rate": (None if level is None or level.rate is None or math.isinf(level.rate) else level.rate),
        "arrival": level.arrival if level else None,
        "max_concurrency": level.max_concurrency if level else None,
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": n_in, "total_output_tokens": n_out,
        "input_tokens_unknown": sum(1 for r in ok if r.n_prompt is None),   # the server did not count them
        "request_throughput": len(ok) / dur if dur and ok else None,
        "output_throughput": n_out / dur if dur and ok else None,
        "total_token_throughput": (n_in + n_out) / dur if dur and ok else None,
        "slo_ttft_ms": slo.ttft_ms, "slo_tpot_ms": slo.tpot_ms, "slo_e2el_ms": slo.e2el_ms,
    }
    if slo.any:
        good = sum(1 for r in ok if slo.met(r))
        out["good_requests"] = good
        out["request_goodput"] = good / dur if dur else None
        out["goodput_fraction"] = good / len(results) if results else None
    else:
        out.update(good_requests=None, request_goodput=None, goodput_fraction=None)
    series = {"ttft": [r.ttft_ms for r in ok], "tpot": [r.tpot_ms for r in ok],
              "itl": [1e3 * g for r in ok for g in r.itl_s], "e2el": [r.e2el_ms for r in ok]}
    for m in METRICS:
        for s, v in _stats(series[m]).items():
            out[f"{m}_ms_{s}"] = v
    decode = [r.decode_ts for r in ok if r.decode_ts]
    out["decode_ts_median"] = _stats(decode)["median"]      # one stream's decode rate (1000 / TPOT)
    reasons: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = (r.reason or "unknown")[:120]
            reasons[key] = reasons.get(key, 0) + 1
    out["failures"] = reasons or None
    return json_safe(out)


_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_seconds_total",
             "llamacpp:tokens_predicted_total",
             "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total")
_GAUGES = ("llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
           "llamacpp:n_busy_slots_per_decode", "llamacpp:requests_deferred")


def server_side_by_side(results: Sequence[RequestResult], duration_s: float,
                        before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> dict[str, Any]:
    """llama-server's own figures for one level beside the client's (keys ``server_*`` and ratios).

    From each request's ``timings``: median ``predicted_per_second`` (the server's decode rate of one
    stream) against the client's median decode rate (1000 / TPOT); median ``prompt_ms`` against the median
    TTFT (their difference is queueing, the first token's sampling and HTTP); summed ``predicted_n`` and
    ``prompt_n`` against the client's token counts. From the ``/metrics`` counters' deltas over the level:
    tokens predicted per second of the level's wall time (against the client's output tok/s), decode calls,
    and the gauges the server resets at each scrape (mean busy slots per decode = the batch size)."""
    ok = [r for r in results if r.ok]
    timed = [r for r in ok if r.server_timings]
    out: dict[str, Any] = {"server_timed_requests": len(timed)}
    if timed:
        tm = [r.server_timings for r in timed]
        pps = [t.get("predicted_per_second") for t in tm if t.get("predicted_per_second")]
        client_dec = [r.decode_ts for r in timed if r.decode_ts]
        s_med = _stats(pps)["median"]
        c_med = _stats(client_dec)["median"]
        out.update(server_predicted_ts_median=s_med, client_decode_ts_median=c_med,
                   decode_ts_ratio=(c_med / s_med) if s_med and c_med else None,
                   server_prompt_ms_median=_stats([t.get("prompt_ms") for t in tm])["median"],
                   server_predicted_ms_median=_stats([t.get("predicted_ms") for t in tm])["median"],
                   client_ttft_ms_median=_stats([r.ttft_ms for r in timed])["median"],
                   ttft_minus_prompt_ms_median=_stats([r.ttft_ms - t.get("prompt_ms", 0.0)
                                                       for r, t in zip(timed, tm)])["median"],
                   server_predicted_n=sum(int(t.get("predicted_n") or 0) for t in tm),
                   client_text_events=sum(r.n_events for r in timed),
                   server_prompt_n=sum(int((t.get("prompt_n") or 0) + (t.get("cache_n") or 0)) for t in tm),
                   client_prompt_tokens_sent=sum(r.prompt_tokens_sent or 0 for r in timed))
    if before is not None and after is not None:
        for name in _COUNTERS:
            if name in after and name in before:
                out["server_" + name.split(":", 1)[1] + "_delta"] = after[name] - before[name]
        for name in _GAUGES:
            if name in after:
                out["server_" + name.split(":", 1)[1]] = after[name]
        pred = out.get("server_tokens_predicted_total_delta")
        if pred is not None and duration_s and duration_s > 0:
            out["server_output_throughput"] = pred / duration_s
            client_out = sum(r.n_gen or 0 for r in ok) / duration_s
            out["output_throughput_ratio"] = (client_out / out["server_output_throughput"]
                                              if out["server_output_throughput"] else None)
    return json_safe(out)


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

    def as_json(self, requests: bool = True) -> dict[str, Any]:
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
    import datetime as _dt

    t = _dt.datetime.now(_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ"), t.isoformat(timespec="milliseconds")


def _env(info: ServerInfo) -> dict[str, Any]:
    try:
        from v100lab.buildflags import host_cpu

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

    ``results``: a JSONL path or :class:`~v100lab.store.ResultsStore` — each request's row is appended as it
    finishes, each level's summary row after the level. ``progress``: a tqdm bar on stderr (None: when
    stderr is a terminal). ``dead()``: returns why the server can no longer answer (None while it can);
    :func:`serve_bench` passes one for the server it started. Faults never raise (see the module docstring);
    bad input raises :class:`~v100lab.errors.ConfigError` before anything is sent."""
    from v100lab.store import ResultsStore

    if not isinstance(workload, Workload):
        raise ConfigError("workload: must be a Workload")
    url = normalize_url(url)
    store = results if isinstance(results, ResultsStore) or results is None else ResultsStore(results)
    if store is not None:
        store.check_writable()
    dead = dead or (lambda: None)
    return _run_coro(lambda: _main(url, workload, store, progress, dead, dict(base_row or {}), on_request))


def normalize_url(url: str) -> str:
    from urllib.parse import urlsplit

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
    import httpx

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
        pool = await _token_pool(client, url, info) if mode == "tokens" else None
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
                await _send(client, url + ENDPOINTS[workload.endpoint], _body(wl, info, p), rq, wl,
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
                    res, duration = await _run_level(client, url, info, workload, level, li, plan, done, dead)
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
                         summary["output_throughput"] or 0.0, _fmt(summary["ttft_ms_median"]))
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
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="req", desc="serve-bench", file=sys.stderr, leave=False)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


# --------------------------------------------------------------------------------------------
# a model: llama-server started for the run
# --------------------------------------------------------------------------------------------

def is_url(target: str | os.PathLike) -> bool:
    return isinstance(target, str) and target.strip().lower().startswith(("http://", "https://"))


def serve_bench(target: "str | os.PathLike", workload: Workload, cfg=None, *, server_binary=None,
                server_args: Sequence[str] = (), results=None, progress: bool | None = None,
                startup_timeout: float = 180.0, log_args: Sequence[str] | None = None,
                on_request: Callable[[RequestResult], None] | None = None) -> ServeRun:
    """Run ``workload`` against ``target``: a URL (a server already running), or a model (a GGUF path or a
    zoo alias) that llama-server serves on 127.0.0.1 for the run with ``cfg``'s flags (a
    :class:`~v100lab.config.RunConfig`; ``-np`` defaults to the workload's largest concurrency) plus
    ``--metrics`` and ``server_args``; the server is stopped afterwards, always (a failure, Ctrl-C).

    With a model, each request needs prompt + output tokens in one slot's context: ``n_ctx / n_parallel``
    unless ``kv_unified`` — a workload that cannot fit raises ConfigError before the server starts.
    A server that does not start raises :class:`~v100lab.backends.MeasureFailed` (exit status 1) with
    llama.cpp's reason. ``on_request(result)`` is called as each request finishes (a progress display)."""
    if is_url(target):
        return run_serve_bench(str(target), workload, results=results, progress=progress, on_request=on_request)
    from v100lab.backends.server import LLAMA_SERVER_LOG_ARGS, ServerBackend, find_llama_server
    from v100lab.config import RunConfig

    path = _resolve_model(target)
    cfg = cfg or RunConfig(n_parallel=max(lv.in_flight_cap or 1 for lv in workload.levels))
    check_fits(cfg, workload)
    binary = server_binary or find_llama_server()
    backend = ServerBackend(binary=binary, extra_args=("--metrics", *server_args),
                            log_args=LLAMA_SERVER_LOG_ARGS if log_args is None else tuple(log_args),
                            startup_timeout=startup_timeout)
    from v100lab.store import ResultsStore

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
    import signal
    import threading

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
    from v100lab import zoo

    text = os.fspath(target)
    return zoo.resolve(text)


def _model_facts(path: Path) -> dict[str, Any]:
    try:
        from v100lab.bench import model_facts

        return model_facts(path)
    except Exception as exc:  # the header is a nicety here
        log.debug("no model facts for %s: %s", path, exc)
        return {"model_filename": str(path)}


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------

def levels_frame(run: ServeRun):
    """One row per level (pandas DataFrame): the summary figures."""
    import pandas as pd

    return pd.DataFrame([{k: v for k, v in s.items() if k != "failures"} for s in run.levels])


def requests_frame(run: ServeRun):
    """One row per request (pandas DataFrame), without the ITL lists."""
    import pandas as pd

    return pd.DataFrame([{k: v for k, v in r.as_dict().items() if k not in ("itl_ms", "usage", "server_timings")}
                         for r in run.requests])


def format_levels(levels: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: throughput per level, then the latency percentiles (ms)."""
    head = ["level", "ok/req", "req/s", "out tok/s", "total tok/s", "goodput", "decode tok/s (1 stream)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    for s in levels:
        lines.append("| " + " | ".join([
            str(s["level"]), f"{s['completed']}/{s['requests']}", _fmt(s["request_throughput"]),
            _fmt(s["output_throughput"]), _fmt(s["total_token_throughput"]),
            _fmt(s.get("request_goodput")), _fmt(s.get("decode_ts_median"))]) + " |")
    head2 = ["level"] + [f"{m.upper()} {s}" for m in METRICS for s in ("mean", "median", "p90", "p99")]
    lines += ["", "| " + " | ".join(head2) + " |",
              "|" + "|".join("---:" if i else "---" for i in range(len(head2))) + "|"]
    for s in levels:
        lines.append("| " + " | ".join([str(s["level"])] + [_fmt(s.get(f"{m}_ms_{st}")) for m in METRICS
                                                            for st in ("mean", "median", "p90", "p99")]) + " |")
    return "\n".join(lines)


def format_side_by_side(levels: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: the client's figures beside llama-server's own (timings and /metrics), per level."""
    rows = [s for s in levels if s.get("server_timed_requests")]
    if not rows:
        return ""
    head = ["level", "decode tok/s client", "server predicted_per_second", "ratio", "TTFT ms client",
            "server prompt_ms", "TTFT − prompt_ms", "out tok/s client", "server /metrics tok/s", "ratio",
            "busy slots/decode"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    for s in rows:
        lines.append("| " + " | ".join([
            str(s["level"]), _fmt(s.get("client_decode_ts_median")), _fmt(s.get("server_predicted_ts_median")),
            _fmt(s.get("decode_ts_ratio")), _fmt(s.get("client_ttft_ms_median")),
            _fmt(s.get("server_prompt_ms_median")), _fmt(s.get("ttft_minus_prompt_ms_median")),
            _fmt(s.get("output_throughput")), _fmt(s.get("server_output_throughput")),
            _fmt(s.get("output_throughput_ratio")), _fmt(s.get("server_n_busy_slots_per_decode"))]) + " |")
    return "\n".join(lines)
