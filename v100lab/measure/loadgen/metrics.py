"""Statistics of a level with vLLM's definitions (``vllm bench serve``, ``vllm/benchmarks/serve.py``
``calculate_metrics``): TTFT, TPOT, ITL, E2EL percentiles, throughputs, goodput; and llama-server's own
figures (``timings`` and ``/metrics`` counter deltas) beside the client's."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from v100lab.measure.loadgen.request import RequestResult
from v100lab.measure.loadgen.workload import METRICS, SLO, STATS, Level
from v100lab.base.safeio import json_safe


# --------------------------------------------------------------------------------------------
# summaries
# --------------------------------------------------------------------------------------------

def _stats(values: Sequence[float]) -> dict[str, float | None]:
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
        drafted = [r for r in timed if r.draft_n]
        if drafted:     # speculative decoding: drafted and accepted tokens over the level
            n, acc = sum(r.draft_n for r in drafted), sum(r.draft_n_accepted for r in drafted)
            out.update(server_draft_n=n, server_draft_n_accepted=acc, draft_acceptance=acc / n,
                       draft_acceptance_median=_stats([r.draft_acceptance for r in drafted])["median"])
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


def fmt_figure(v) -> str:
    """A figure for a log line or a table: 4 significant digits, "-" when missing."""
    return "-" if v is None else f"{v:.4g}"
