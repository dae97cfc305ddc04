"""``tune --users N``: llama-server's slots, context and cache types for a workload, under an SLO.

:func:`v100lab.advise.tune.tune` picks the fastest configuration for one stream. A server has users: ``N``
concurrent streams, each sending a typical request of ``prompt_tokens`` in and ``output_tokens`` out, and
perhaps a service-level objective — a limit on time to first token (TTFT) and on time per output token after
the first (TPOT), vLLM's goodput definitions as :mod:`v100lab.measure.loadgen` measures them. :func:`advise` searches
what serving changes and predicts each candidate with :func:`v100lab.predict.serving.predict_serving`:

* **slots** ``--parallel`` from 1 to ``users`` (every value up to 8, then powers of two and ``users``; more
  slots than users buy nothing): ``B = min(users, slots)`` sequences decode together, the rest wait for a slot;
* **context** ``--ctx-size`` = slots × the cells one slot must hold — the prompt plus the output, or
  ``min_ctx`` when that is more, padded to 256 — because llama-server splits ``--ctx-size`` across its slots
  unless ``--kv-unified`` (src/llama-context.cpp, ``llama_context::llama_context``:
  ``n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)``; :func:`v100lab.gguf.llama_context.context_sizes`);
* **cache types** f16, q8_0, q4_0 for K and V alike (a quantized V gets ``--flash-attn on``): a smaller cache
  lets more slots fit;
* **ubatch** the largest of the workload's candidates (the prompt padded up to 2048, then 512, 256, 128) that
  fits: a larger one only costs compute buffer and never slows prompt processing;
* quants and layers as :func:`~v100lab.advise.tune.tune` searches them (a family's ladder; every layer on the GPU,
  else — only when no cache type and ubatch lets every layer fit at that slot count — a MoE's experts in host
  memory, then the most layers that fit).

**Feasibility first, then the SLO, then throughput.** A candidate that does not fit
(:func:`v100lab.predict.memory.feasibility`, with the margin) is never recommended: when none fits, :func:`advise`
raises :class:`~v100lab.advise.tune.NothingFits` with the closest one and what would have to change. Among those
that fit, the ones whose predicted TTFT and TPOT are within the limits come first and the highest predicted
output tok/s (vLLM's output token throughput: prompts included) wins, a tie (:data:`~v100lab.advise.tune.TIE`)
going to the better quant, then the less quantized cache, then the lower TTFT, then fewer slots. When no
candidate that fits meets the SLO, the closest one (the least worst ratio of predicted to limit) is returned
with ``slo_met`` false and :meth:`WorkloadResult.slo_message` saying by how much and why.

Arrival: ``phases="staggered"`` (default; requests at random phases, as real users send them: each prompt
stalls the other slots' decoding once) or ``"together"`` (a benchmark's closed loop of equal requests,
in lockstep). Not modelled: :mod:`v100lab.predict.serving`'s list (sampling and HTTP per token, per-slot bookkeeping,
a prompt longer than ``--batch-size`` split over steps), and ``--kv-unified`` (one buffer of ``--ctx-size``
cells for every slot: the same full-attention cells for the same total, so it is left to the reader: a note
says so).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from v100lab.advise import tune
from v100lab.gguf import llama_context
from v100lab.predict import memory, rates, serving, speed
from v100lab.advise.tune import TIE, Candidate, NothingFits, Reason, Recommendation
from v100lab.facts.config import ALL_LAYERS, RunConfig
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError
from v100lab.predict.memory import margin_bytes
from v100lab.facts.results import TPS, Observation, tidy_frame
from v100lab.base.safeio import json_number

log = logging.getLogger(__name__)

DEFAULT_PROMPT_TOKENS = 512
DEFAULT_OUTPUT_TOKENS = 128
WORKLOAD_UBATCHES = (2048, 1024, 512, 256, 128)
SMALL_SLOTS = 8                                   # every slot count up to this; then powers of two and the users
CACHE_TYPES = tune.CACHE_TYPES
PHASES = serving.PHASES


# ------------------------------------------------------------------------------------------------
# the workload
# ------------------------------------------------------------------------------------------------

def _whole(flag: str, v, least: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ConfigError(f"{flag}: must be a whole number >= {least}, got {v!r}")
    return v


def _limit(flag: str, v) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{flag}: must be a number of milliseconds > 0, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Workload:
    """``users`` concurrent streams of requests of ``prompt_tokens`` in and ``output_tokens`` out, and an
    SLO: ``ttft_ms`` / ``tpot_ms`` limits (None: no limit). ``min_ctx``: the context one slot must hold when it
    is more than a request (None: prompt + output). Bad values raise :class:`ConfigError` naming the flag."""

    users: int = 1
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    min_ctx: int | None = None
    phases: str = "staggered"

    def __post_init__(self):
        _whole("--users", self.users)
        _whole("--prompt-tokens", self.prompt_tokens)
        _whole("--output-tokens", self.output_tokens)
        if self.min_ctx is not None:
            _whole("--min-ctx", self.min_ctx)
        object.__setattr__(self, "ttft_ms", _limit("--ttft-ms", self.ttft_ms))
        object.__setattr__(self, "tpot_ms", _limit("--tpot-ms", self.tpot_ms))
        if self.phases not in PHASES:
            raise ConfigError(f"--phases: must be one of {', '.join(PHASES)}, got {self.phases!r}")

    @property
    def request_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def slot_ctx(self) -> int:
        """Cells one slot gets: a whole request (or ``min_ctx``), padded as llama.cpp pads n_ctx_seq."""
        return llama_context.pad(max(self.request_tokens, self.min_ctx or 0), llama_context.CTX_PAD)

    @property
    def has_slo(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def excess(self, p: serving.ServingPrediction) -> float:
        """The worst ratio of a predicted figure to its limit (<= 1: the SLO is met; 0 without one)."""
        r = [p.ttft_ms / self.ttft_ms] if self.ttft_ms is not None else []
        # vLLM: a request with one output token has no TPOT and meets a TPOT limit
        if self.tpot_ms is not None and self.output_tokens > 1:
            r.append(p.tpot_ms / self.tpot_ms)
        return max(r, default=0.0)

    def slo_text(self) -> str:
        parts = ([f"TTFT <= {self.ttft_ms:g} ms"] if self.ttft_ms is not None else []) + (
            [f"TPOT <= {self.tpot_ms:g} ms"] if self.tpot_ms is not None else [])
        return ", ".join(parts) if parts else "no SLO"

    def line(self) -> str:
        ctx = f", each slot {self.min_ctx} tokens of context" if self.min_ctx and self.min_ctx > self.request_tokens else ""
        return (f"{self.users} user(s), prompt {self.prompt_tokens} + output {self.output_tokens} tokens{ctx} "
                f"({self.phases}); {self.slo_text()}")

    def as_dict(self) -> dict[str, Any]:
        return {"users": self.users, "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "min_ctx": self.min_ctx,
                "slot_ctx": self.slot_ctx, "phases": self.phases}


def slot_counts(users: int, parallel: int | None = None) -> list[int]:
    """The ``--parallel`` values searched: ``parallel`` alone when given; else 1..min(users, 8), then powers of
    two below ``users`` and ``users`` itself, at most llama.cpp's 256 sequences."""
    if parallel is not None:
        return [parallel]
    top = min(users, memory.LLAMA_MAX_SEQ)
    out = set(range(1, min(top, SMALL_SLOTS) + 1)) | {top}
    k = SMALL_SLOTS
    while k < top:
        out.add(k)
        k *= 2
    return sorted(out)


def ubatches(prompt_tokens: int) -> list[int]:
    """The ``--ubatch-size`` values tried, largest first: the prompt padded to a power of two (at most 2048) and
    the smaller rungs of :data:`WORKLOAD_UBATCHES` (a larger ubatch than the prompt only costs memory)."""
    cap = 1 << max(7, (prompt_tokens - 1).bit_length())
    return [u for u in WORKLOAD_UBATCHES if u <= cap] or [WORKLOAD_UBATCHES[-1]]


# ------------------------------------------------------------------------------------------------
# one candidate served
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServingPlan:
    """A configuration (its memory fit: :class:`v100lab.advise.tune.Candidate`) and, when it fits, its predicted
    serving figures for the workload."""

    candidate: Candidate
    serving: serving.ServingPrediction | None     # None: it does not fit (never predicted)
    slo_met: bool = False
    excess: float = math.inf                        # Workload.excess; inf when not predicted

    @property
    def fits(self) -> bool:
        return self.candidate.fits

    @property
    def config(self) -> RunConfig:
        return self.candidate.config

    @property
    def quant(self) -> str:
        return self.candidate.quant

    @property
    def slots(self) -> int:
        return self.config.n_parallel

    @property
    def label(self) -> str:
        return self.candidate.label

    # the figures (NaN when not predicted)
    def _s(self, attr: str) -> float:
        return float(getattr(self.serving, attr)) if self.serving is not None else math.nan

    @property
    def output_tps(self) -> float:
        """vLLM's output token throughput: every stream's tokens over the time their requests take, prompts included."""
        return self._s("output_throughput")

    @property
    def tg_tps(self) -> float:
        """Aggregate decode: B sequences per step (prompt steps not counted)."""
        return self.serving.batch.aggregate_tps if self.serving is not None else math.nan

    @property
    def tg_tps_per_stream(self) -> float:
        """What one user sees while the answer streams: 1000 / TPOT."""
        return self._s("decode_ts")

    @property
    def ttft_ms(self) -> float:
        return self._s("ttft_ms")

    @property
    def tpot_ms(self) -> float:
        return self._s("tpot_ms")

    def as_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {"label": self.label, "quant": self.quant, "slots": self.slots, "fits": self.fits,
                "slo_met": self.slo_met if self.serving is not None else None,
                "slo_excess": json_number(self.excess, 4), "config": self.config.as_dict(),
                "offloaded_layers": c.offloaded_layers, "n_layer_total": c.n_layer_total,
                "margin_bytes": c.margin_bytes, "used_bytes": c.used_bytes, "tight_device": c.tight_device,
                "kv_bytes": c.kv_bytes, "compute_bytes": c.compute_bytes,
                "tg_tps": json_number(self.tg_tps), "tg_tps_per_stream": json_number(self.tg_tps_per_stream),
                "output_tps": json_number(self.output_tps), "ttft_ms": json_number(self.ttft_ms), "tpot_ms": json_number(self.tpot_ms),
                "serving": self.serving.as_dict() if self.serving is not None else None,
                "note": c.note, "blockers": [b.as_dict() for b in c.blockers]}

    def figures(self) -> str:
        """One line: the predicted serving figures."""
        s = self.serving
        if s is None:
            return "does not fit"
        return (f"TTFT {s.ttft_ms:.0f} ms, TPOT {s.tpot_ms:.1f} ms; decode {self.tg_tps_per_stream:.1f} tok/s per "
                f"stream, {self.tg_tps:.1f} aggregate; output {s.output_throughput:.1f} tok/s "
                f"({s.request_throughput:.3g} req/s)")



def _serve(m, devices, c: Candidate, w: Workload) -> ServingPlan:
    if not c.fits:
        return ServingPlan(c, None)
    # where each layer runs: the plan's (without its max-context search, which serving does not need)
    placement = speed.placement_from_plan(memory.plan(m.spec, devices, c.config, with_max_ctx=False), devices)
    p = serving.predict_serving(m.spec, devices, c.config, concurrency=w.users, prompt_tokens=w.prompt_tokens,
                                output_tokens=w.output_tokens, placement=placement, phases=w.phases)
    ex = w.excess(p)
    return ServingPlan(c, p, slo_met=ex <= 1.0, excess=ex)


# ------------------------------------------------------------------------------------------------
# the result
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkloadResult(Recommendation):
    """The recommended configuration for a workload: its llama-server command, a reason per flag, its
    predicted serving figures, whether it meets the SLO, and every plan evaluated (best first)."""

    model: str
    device: str
    workload: Workload
    best: ServingPlan
    argv: tuple[str, ...]
    reasons: tuple[Reason, ...]
    plans: tuple[ServingPlan, ...]
    margin_bytes: int
    notes: tuple[str, ...] = ()
    per_slot: tuple[ServingPlan, ...] = ()     # the choice at each slot count where one fits, fewest slots first

    @property
    def quant(self) -> str:
        return self.best.quant

    @property
    def slo_met(self) -> bool:
        return self.best.slo_met

    def per_slots(self) -> list[ServingPlan]:
        """The plan :func:`advise` would choose at each slot count where one fits (the same rule: the SLO, then
        output tok/s, then quality)."""
        return list(self.per_slot)

    def slo_message(self) -> str:
        """One line: the SLO met, or which plan is the closest and why it misses."""
        w, b = self.workload, self.best
        if not w.has_slo:
            return "no SLO given"
        if b.slo_met:
            return f"SLO met ({w.slo_text()}): predicted {b.figures()}"
        return f"no configuration that fits meets the SLO ({w.slo_text()}); the closest, {b.label}: {_why_missed(self)}"

    def observations(self) -> list:
        """Every plan as tidy rows (lever "config", value = the plan's label; source predicted): tg_tps (aggregate
        decode), tg_tps_per_stream, output_tps, ttft_ms, tpot_ms, e2el_ms and slo_met for the plans that fit;
        used_bytes, margin_bytes and fits for every one."""
        rows = []
        wl = self.workload.line()
        for p in self.plans:
            c = p.candidate
            base = {"model": self.model, "quant": p.quant, "device": self.device, "lever": "config",
                    "value": p.label, "source": "predicted", "cache_type": p.config.cache_type_v, "fits": p.fits}
            note = f"workload: {wl}" + ("" if p.fits else "; does not fit with the margin")
            if p.serving is not None:
                s = p.serving
                figs = (("tg_tps", p.tg_tps, TPS), ("tg_tps_per_stream", p.tg_tps_per_stream, TPS),
                        ("output_tps", p.output_tps, TPS), ("ttft_ms", s.ttft_ms, "ms"), ("tpot_ms", s.tpot_ms, "ms"),
                        ("e2el_ms", s.e2el_ms, "ms"))
                for metric, val, unit in figs:
                    rows.append(Observation(**base, metric=metric, result=float(val), unit=unit, note=note,
                                            bound=s.batch.bound if unit == TPS else "",
                                            above_ceiling=(val > c.physical_ceiling_tg_tps)
                                            if metric == "tg_tps_per_stream" else None))
                if self.workload.has_slo:
                    rows.append(Observation(**base, metric="slo_met", result=float(p.slo_met), unit="bool", note=note))
            for metric, val, unit in (("used_bytes", c.used_bytes, "bytes"), ("margin_bytes", c.margin_bytes, "bytes"),
                                      ("fits", float(p.fits), "bool")):
                rows.append(Observation(**base, metric=metric, result=float(val), unit=unit, note=note))
        return rows

    def frame(self):
        """The plans as a tidy DataFrame (:func:`v100lab.facts.results.tidy_frame`)."""
        return tidy_frame(self.observations())

    def as_dict(self) -> dict[str, Any]:
        b = self.best
        return {"model": self.model, "device": self.device, "workload": self.workload.as_dict(), "fits": True,
                "slo_met": b.slo_met, "slo_message": self.slo_message(), "quant": self.quant,
                "margin_bytes": self.margin_bytes, "slots": b.slots, "slot_ctx": self.workload.slot_ctx,
                "predicted": {"tg_tps": json_number(b.tg_tps), "tg_tps_per_stream": json_number(b.tg_tps_per_stream),
                              "output_tps": json_number(b.output_tps), "ttft_ms": json_number(b.ttft_ms), "tpot_ms": json_number(b.tpot_ms),
                              "e2el_ms": json_number(b.serving.e2el_ms), "queue_ms": json_number(b.serving.queue_ms),
                              "request_tps": json_number(b.serving.request_throughput)},
                "config": b.config.as_dict(), "argv": list(self.argv), "command": self.command,
                "reasons": [asdict(r) for r in self.reasons], "best": b.as_dict(),
                "per_slots": [p.as_dict() for p in self.per_slots()],
                "plans": [p.as_dict() for p in self.plans], "notes": list(self.notes)}

    def format_text(self) -> str:
        b, w = self.best, self.workload
        c = b.candidate
        head = [f"{self.model} on {self.device} for {w.line()}",
                (f"{b.quant}, -np {b.slots}: predicted {b.figures()}; {c.margin_bytes / 2**20:.0f} MiB left "
                 f"(margin {self.margin_bytes / 2**20:.0f} MiB)")]
        if w.has_slo:
            head.append(("SLO met" if b.slo_met else "SLO MISSED: ") + ("" if b.slo_met else _why_missed(self)))
        lines = head + ["", self.command, "", "why each flag:"]
        lines += [f"  {r.line()}" for r in self.reasons]
        fitting = [p for p in self.plans if p.fits]
        met = [p for p in fitting if p.slo_met]
        count = f"{len(fitting)} of {len(self.plans)} configurations fit"
        if w.has_slo:
            count += f", {len(met)} meet the SLO"
        lines += ["", count + "; the best at each slot count:"]
        for p in self.per_slots():
            mark = "" if not w.has_slo else ("  SLO met" if p.slo_met else f"  SLO x{p.excess:.2f}")
            lines.append(f"  -np {p.slots:<3} {p.output_tps:7.1f} out tok/s  TTFT {p.ttft_ms:7.0f} ms  "
                         f"TPOT {p.tpot_ms:6.1f} ms  {p.label}{mark}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _why_missed(r: WorkloadResult) -> str:
    """Which limit the closest plan misses, by how much, where the time goes, and whether more slots would fit."""
    w, b = r.workload, r.best
    s = b.serving
    parts = []
    if w.ttft_ms is not None and s.ttft_ms > w.ttft_ms:
        why = [f"{s.t_pp_s * 1e3:.0f} ms to process the {w.prompt_tokens}-token prompt"]
        if s.queue_ms > 0:
            why.append(f"{s.queue_ms:.0f} ms waiting for one of {b.slots} slot(s) ({w.users} users)")
        if w.phases == "together" and s.batch.batch > 1:
            why.append(f"{s.batch.batch} prompts processed in one batch")
        parts.append(f"TTFT {s.ttft_ms:.0f} ms > {w.ttft_ms:g} ms (" + ", ".join(why) + ")")
    if w.tpot_ms is not None and w.output_tokens > 1 and s.tpot_ms > w.tpot_ms:
        why = [(f"one decode step of {s.batch.batch} sequence(s) takes {s.batch.t_step_s * 1e3:.1f} ms "
                f"({s.batch.bound}-bound)")]
        if w.phases == "staggered" and s.batch.batch > 1:
            why.append(f"the other {s.batch.batch - 1} prompts stall each answer once ({s.t_pp_s * 1e3:.0f} ms each)")
        parts.append(f"TPOT {s.tpot_ms:.1f} ms > {w.tpot_ms:g} ms (" + ", ".join(why) + ")")
    whole = [p.slots for p in r.plans if p.fits and p.candidate.offloaded_layers >= p.candidate.n_layer_total]
    if s.queue_ms > 0 and whole and max(whole) < w.users and any(
            p.fits and p.slots > max(whole) for p in r.plans):
        parts.append(f"every layer stays on {r.device} only up to -np {max(whole)}: more slots put layers on the CPU")
    most = max((p.slots for p in r.plans if p.fits), default=0)
    if most < w.users and not r.best.slo_met:
        over = [p for p in r.plans if p.slots > most and p.candidate.blockers]
        if over:
            o = min(over, key=lambda p: (p.slots, p.candidate.distance))
            parts.append(f"at most -np {most} fits: {o.label} does not ({o.candidate.blockers[0].problem})")
    return "; ".join(parts) or "within the limits"


# ------------------------------------------------------------------------------------------------
# the search
# ------------------------------------------------------------------------------------------------

def _configs(gpu: bool, w: Workload, slots: int, cache: str) -> list[RunConfig]:
    fa = "auto" if cache in ("f16", "f32", "bf16") else "on"
    return [RunConfig(n_gpu_layers=ALL_LAYERS if gpu else 0, n_ctx=w.slot_ctx * slots,
                      n_batch=max(tune.DEFAULT_BATCH, ub), n_ubatch=ub, cache_type_k=cache, cache_type_v=cache,
                      flash_attn=fa, n_parallel=slots) for ub in ubatches(w.prompt_tokens)]


def _largest_ubatch_that_fits(m, devices, cfgs: Sequence[RunConfig], depth: int) -> Candidate:
    """The first (largest-ubatch) configuration that fits with every layer on the GPU, or the closest of them."""
    tried = []
    for cfg in cfgs:
        c = tune._fitted(m, devices, cfg, depth, gpu=True, partial=False)
        if c.fits:
            return c
        tried.append(c)
    return min(tried, key=lambda c: (c.distance, -c.pp_tps))


def _key_met(p: ServingPlan, bpw) -> tuple:
    return tune._quality_key(p.candidate, bpw) + (p.ttft_ms, p.slots, p.config.n_ubatch != 512,
                                                     -p.candidate.margin_bytes)


def _choose(plans: Sequence[ServingPlan], bpw: Mapping[str, float]) -> ServingPlan:
    """Among the plans that fit: those that meet the SLO, the highest output tok/s (within TIE: quality, then
    the lower TTFT, then fewer slots); when none meets it, the least excess (within TIE: output tok/s, quality)."""
    pool = [p for p in plans if p.fits]
    met = [p for p in pool if p.slo_met]
    if met:
        top = max(p.output_tps for p in met)
        near = [p for p in met if p.output_tps >= top * (1 - TIE)]
        return min(near, key=lambda p: _key_met(p, bpw))
    low = min(p.excess for p in pool)
    near = [p for p in pool if p.excess <= low * (1 + TIE)]
    top = max(p.output_tps for p in near)
    near = [p for p in near if p.output_tps >= top * (1 - TIE)]
    return min(near, key=lambda p: _key_met(p, bpw))


def _order(plans: Sequence[ServingPlan]) -> list[ServingPlan]:
    """Fitting plans that meet the SLO (fastest first), then the other fitting ones (closest first), then the
    rest (closest to fitting first)."""
    return sorted(plans, key=lambda p: (not p.fits, not p.slo_met,
                                        -p.output_tps if p.slo_met else p.excess,
                                        p.candidate.distance, -(p.output_tps if p.fits else p.candidate.tg_tps)))


def advise(model: str, device, workload: Workload, *, quants: Sequence[str] | None = None,
           parallel: int | None = None, host=None) -> WorkloadResult:
    """The llama-server configuration for ``workload`` on ``device`` (see the module docstring).

    ``model`` and ``quants`` as :func:`v100lab.advise.tune.tune` takes them; ``parallel``: search only that slot
    count. Raises :class:`~v100lab.advise.tune.NothingFits` when no configuration fits the memory, ConfigError on bad
    input (naming the flag). A result whose ``slo_met`` is false is the closest configuration to the SLO."""
    if not isinstance(workload, Workload):
        raise ConfigError(f"workload must be a Workload, got {type(workload).__name__}")
    if parallel is not None:
        _whole("--parallel", parallel)
    w = workload
    dev = get_device(device)
    devices = [dev] if dev.kind == "cpu" else [dev] + ([get_device(host)] if host is not None else [])
    gpu = dev.kind != "cpu"
    counts = slot_counts(w.users, parallel)
    # llama.cpp's limits that no candidate can meet (slots, a context beyond its int32): bad input
    for n in counts:
        for b in memory.limit_blockers(None, RunConfig(n_ctx=w.slot_ctx * n, n_parallel=n), devices):
            raise ConfigError(b.line())
    models = tune._models(model, quants)
    depth = w.prompt_tokens + w.output_tokens // 2      # the mean depth a stream decodes at (serving's)
    notes: list[str] = []
    if any(d.id == "host" for d in devices):      # the host's rates: their profile's age, quality, mismatches
        hp = rates.describe_host_rates()
        notes += [f"host: {hp.line}"] + [f"host: warning: {x}" for x in hp.warnings]
    for m in models:
        if m.spec.n_ctx_train and w.slot_ctx > m.spec.n_ctx_train:
            notes.append(f"each slot's {w.slot_ctx} cells: {memory.ctx_train_warning(m.spec, w.slot_ctx)}")
            break
    cands: list[tuple[Any, Candidate]] = []
    for m in models:
        for n in counts:
            full = [_largest_ubatch_that_fits(m, devices, _configs(gpu, w, n, ct), depth) for ct in CACHE_TYPES]
            if gpu and not any(c.fits for c in full):
                # no cache type lets every layer fit at n slots: experts to the host, then fewer layers
                full = [tune._fitted(m, devices, c.config, depth, gpu=True) for c in full]
            cands += [(m, c) for c in full]
    plans = [_serve(m, devices, c, w) for m, c in cands]
    if not any(p.fits for p in plans):
        nofit = tune._no_fit(model, dev, devices, models, [c for _, c in cands], w.slot_ctx, notes)
        raise NothingFits(nofit)
    bpw = {m.quant: m.spec.bits_per_weight for m in models}
    best = _choose(plans, bpw)
    m_best = next(m for m in models if m.quant == best.quant)
    notes += [f"serving: {x}" for x in best.serving.batch.notes]     # e.g. no batched-decode calibration for a CPU
    bc = best.candidate
    if gpu and not any(d.id == "host" for d in devices) and (bc.offloaded_layers < bc.n_layer_total or bc.config.cpu_moe
                                                            or bc.config.n_cpu_moe):
        hp = rates.describe_host_rates()      # what stays on the CPU runs at this machine's rates
        notes += [f"host (the CPU layers): {hp.line}"] + [f"host: warning: {x}" for x in hp.warnings]
    if w.users > 1:
        notes.append("--kv-unified (one buffer of --ctx-size cells shared by every slot, each able to use more than "
                     "its share) holds the same full-attention cells for the same --ctx-size; this search gives each "
                     "slot its own share")
    argv = ("llama-server", "-m", m_best.file_arg, *best.config.to_server_argv())
    ordered = _order(plans)
    ordered = [best] + [p for p in ordered if p is not best]
    reasons = _reasons(best, m_best, models, dev, ordered, w, bpw)
    per_slot = tuple(_choose(g, bpw) for n in counts if (g := [p for p in plans if p.fits and p.slots == n]))
    return WorkloadResult(model=str(model), device=dev.id, workload=w, best=best, argv=argv, reasons=tuple(reasons),
                          plans=tuple(ordered), margin_bytes=margin_bytes(dev), notes=tuple(dict.fromkeys(notes)),
                          per_slot=per_slot)


# ------------------------------------------------------------------------------------------------
# reasons: one per flag, against the alternative that matters for the workload
# ------------------------------------------------------------------------------------------------

def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def _short(p: ServingPlan) -> str:
    return f"{p.output_tps:.1f} out tok/s, TTFT {p.ttft_ms:.0f} ms, TPOT {p.tpot_ms:.1f} ms"


def _best_of(plans: Sequence[ServingPlan], bpw, **match) -> ServingPlan | None:
    """The chosen plan among those that fit and match (attribute → value on the plan or its config)."""
    pool = [p for p in plans if p.fits and all(
        (getattr(p, k) if hasattr(p, k) else getattr(p.config, k)) == v for k, v in match.items())]
    return _choose(pool, bpw) if pool else None


def _reasons(best: ServingPlan, m, models, dev, plans: Sequence[ServingPlan], w: Workload, bpw) -> list[Reason]:
    cfg, c = best.config, best.candidate
    out: list[Reason] = []
    gpu = dev.kind != "cpu"
    # -m: the quant
    why = f"{best.quant}: {c.weight_bytes / 1e9:.2f} GB of weights on {dev.id}"
    better = sorted((x.quant for x in models if bpw.get(x.quant, 0) > bpw.get(best.quant, 0)), key=lambda q: bpw[q])
    if better:
        q = better[0]
        alt = _best_of(plans, bpw, quant=q)
        if alt is None:
            why += f"; the better {q} does not fit with the margin at any slot count searched"
        else:
            why += f"; the better {q} at best: {_short(alt)} (-np {alt.slots}" + (
                "" if alt.slo_met or not w.has_slo else ", misses the SLO") + ")"
    elif len(models) > 1:
        why += "; the best-quality quant searched"
    out.append(Reason(f"-m {m.file_arg}", why))
    # --gpu-layers
    if gpu:
        if c.offloaded_layers >= c.n_layer_total:
            out.append(Reason(f"--gpu-layers {cfg.n_gpu_layers}", f"all {c.n_layer_total} layer slots on {dev.id}"))
        else:
            out.append(Reason(f"--gpu-layers {cfg.n_gpu_layers}",
                              f"{c.offloaded_layers}/{c.n_layer_total} layer slots fit with the margin at -np "
                              f"{best.slots}; the rest run on the CPU (no cache type lets every layer fit)"))
        if cfg.cpu_moe or cfg.n_cpu_moe:
            flag = "--cpu-moe" if cfg.cpu_moe else f"--n-cpu-moe {cfg.n_cpu_moe}"
            out.append(Reason(flag, "experts in host memory before whole layers, as llama.cpp's --fit does"))
    else:
        out.append(Reason(f"--gpu-layers {cfg.n_gpu_layers}", "a CPU device: nothing to offload"))
    # --parallel
    b = min(w.users, best.slots)
    why = f"{best.slots} slot(s) for {w.users} user(s): {b} decode together"
    if best.slots < w.users:
        why += f", the others wait for a slot ({best.serving.queue_ms:.0f} ms of TTFT)"
    alts = []
    for n in sorted({best.slots + 1 if best.slots < w.users else None, w.users, 1} - {None, best.slots}):
        a = _best_of(plans, bpw, slots=n)
        if a is None:
            if any(p.slots == n for p in plans):
                alts.append(f"-np {n} does not fit")
            continue
        alts.append(f"-np {n}: {_short(a)}" + ("" if a.slo_met or not w.has_slo else " (misses the SLO)"))
    if alts:
        why += "; vs " + "; ".join(alts)
    out.append(Reason(f"--parallel {best.slots}", why))
    # --ctx-size
    per = llama_context.context_sizes(m.spec, cfg).n_ctx_seq
    need = (f"prompt {w.prompt_tokens} + output {w.output_tokens} = {w.request_tokens} tokens"
            + (f", or --min-ctx {w.min_ctx}" if w.min_ctx and w.min_ctx > w.request_tokens else ""))
    out.append(Reason(f"--ctx-size {cfg.n_ctx}",
                      f"{best.slots} slot(s) × {per} cells ({need}, padded to 256): llama-server splits --ctx-size "
                      f"across slots; KV cache {_mib(c.kv_bytes)}"))
    # --batch-size / --ubatch-size
    out.append(Reason(f"--batch-size {cfg.n_batch}", "the logical batch: at least the physical one"))
    out.append(Reason(f"--ubatch-size {cfg.n_ubatch}",
                      f"the largest tried that fits ({', '.join(map(str, ubatches(w.prompt_tokens)))}): compute "
                      f"buffer {_mib(c.compute_bytes)}, prompt {best.serving.t_pp_s * 1e3:.0f} ms of TTFT"))
    # cache types
    ct = cfg.cache_type_v
    others = []
    for alt_ct in CACHE_TYPES:
        if alt_ct == ct:
            continue
        same = _best_of(plans, bpw, quant=best.quant, slots=best.slots, cache_type_v=alt_ct)
        if same is None:
            fits_n = [p.slots for p in plans if p.fits and p.quant == best.quant and p.config.cache_type_v == alt_ct]
            others.append(f"{alt_ct} does not fit at -np {best.slots}"
                          + (f" (at most -np {max(fits_n)})" if fits_n else ""))
        else:
            others.append(f"{alt_ct}: {_short(same)}, KV {_mib(same.candidate.kv_bytes)}")
    lead = ("f16 keeps the cache exact" if ct == "f16"
            else f"{ct}: KV {_mib(c.kv_bytes)}, a smaller cache for more slots or room")
    out.append(Reason(f"--cache-type-k {cfg.cache_type_k}", lead + "; " + "; ".join(others)))
    out.append(Reason(f"--cache-type-v {cfg.cache_type_v}",
                      "same type as K" + (" (a quantized V needs flash attention)" if ct != "f16" else "")))
    # flash attention
    if cfg.kv_quantized_v:
        out.append(Reason(f"--flash-attn {cfg.flash_attn}", "on: required — llama.cpp refuses a quantized V cache "
                                                            "without flash attention"))
    else:
        out.append(Reason(f"--flash-attn {cfg.flash_attn}", "auto: llama.cpp turns it on where the device has the "
                                                            "kernels"))
    return out
