"""What a serve-bench run sends: levels (closed-loop concurrency or open-loop arrival rate), prompt and output
lengths (fixed or a seeded distribution), SLOs, the workload as a whole, each level's planned requests and
its arrival schedule. Pure data and seeded randomness: nothing here touches the network."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from v100lab.base.errors import ConfigError
from v100lab.measure.loadgen.request import RequestResult


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
WORDS = tuple("""the of and to in is was for on that with as by at from his her he she it they we you this
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
            prompt = " ".join(rng.choice(WORDS) for _ in range(np_))
            exact = False
        out.append(PlannedRequest(i, prompt, np_, nt, exact))
    return out



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
