"""Tables of a serve-bench run: the text tables the command prints."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from v100lab.measure.loadgen.metrics import fmt_figure
from v100lab.measure.loadgen.workload import METRICS


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------

def format_levels(levels: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: throughput per level, then the latency percentiles (ms)."""
    head = ["level", "ok/req", "req/s", "out tok/s", "total tok/s", "goodput", "decode tok/s (1 stream)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    for s in levels:
        lines.append("| " + " | ".join([
            str(s["level"]), f"{s['completed']}/{s['requests']}", fmt_figure(s["request_throughput"]),
            fmt_figure(s["output_throughput"]), fmt_figure(s["total_token_throughput"]),
            fmt_figure(s.get("request_goodput")), fmt_figure(s.get("decode_ts_median"))]) + " |")
    head2 = ["level"] + [f"{m.upper()} {s}" for m in METRICS for s in ("mean", "median", "p90", "p99")]
    lines += ["", "| " + " | ".join(head2) + " |",
              "|" + "|".join("---:" if i else "---" for i in range(len(head2))) + "|"]
    for s in levels:
        lines.append("| " + " | ".join([str(s["level"])] + [fmt_figure(s.get(f"{m}_ms_{st}")) for m in METRICS
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
            str(s["level"]), fmt_figure(s.get("client_decode_ts_median")), fmt_figure(s.get("server_predicted_ts_median")),
            fmt_figure(s.get("decode_ts_ratio")), fmt_figure(s.get("client_ttft_ms_median")),
            fmt_figure(s.get("server_prompt_ms_median")), fmt_figure(s.get("ttft_minus_prompt_ms_median")),
            fmt_figure(s.get("output_throughput")), fmt_figure(s.get("server_output_throughput")),
            fmt_figure(s.get("output_throughput_ratio")), fmt_figure(s.get("server_n_busy_slots_per_decode"))]) + " |")
    spec = [s for s in rows if s.get("server_draft_n")]
    if spec:
        lines += ["", "| level | drafted | accepted | acceptance | median per request |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {s['level']} | {s['server_draft_n']} | {s['server_draft_n_accepted']} | "
                  f"{fmt_figure(s.get('draft_acceptance'))} | {fmt_figure(s.get('draft_acceptance_median'))} |"
                  for s in spec]
    return "\n".join(lines)
