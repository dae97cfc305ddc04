"""``v100lab tune MODEL --device D [--min-ctx N] [--parallel N] [--quants LIST] [--measure] [--json]``
``[--users N [--prompt-tokens P] [--output-tokens G] [--ttft-ms MS] [--tpot-ms MS] [--phases staggered|together]]``.

The fastest llama.cpp configuration that fits the device with a margin, as a llama-server command with one line
per flag saying why it is there and what it buys (see :mod:`v100lab.advise.tune`). MODEL is an architecture name
(``qwen35-27b``: its quant ladder as skeletons, nothing downloaded), ``skeleton:ARCH:QUANT``, a synthetic alias
(``synth-tiny``: its ladder, built), or one GGUF file / alias / URL. ``--measure`` runs the best predictions for
real and chooses by measurement (real files, on the device this llama.cpp runs on).

JSON keys (a contract): model, device, fits, quant, min_ctx, margin_bytes, measured, predicted_tg_tps,
predicted_pp_tps, weights_ceiling_tg_tps, measured_tg_tps, config, argv, command, reasons (flag, why, delta_tps,
delta_bytes), best, candidates, notes.

When no configuration fits (:func:`v100lab.predict.memory.feasibility`, the rule ``plan`` prints), no command is
printed: one line on stderr says what would have to change, the exit status is 1, and ``--json`` prints
model, device, fits (false), min_ctx, margin_bytes, argv ([]), command (null), message, blocker, blockers,
closest, candidates, notes.

**A workload** (any of ``--users``, ``--prompt-tokens``, ``--output-tokens``, ``--ttft-ms``, ``--tpot-ms``,
``--phases``; :mod:`v100lab.advise.tune_users`): ``--users`` concurrent streams of typical requests, and an SLO
(vLLM's TTFT and TPOT limits). The search adds the slot count (``--parallel``, unless given), the context per
slot (a whole request, or ``--min-ctx``: ``--ctx-size`` = slots × that) and the cache types, predicts each with
:func:`v100lab.predict.serving.predict_serving`, and recommends what fits first, then what meets the SLO, then the
highest output tok/s. Exit status 0 when the SLO is met (or none given); 1 when no configuration that fits
meets it — the closest is printed all the same, and one line on stderr says by how much and why. Its JSON keys
(a contract): model, device, workload, fits, slo_met, slo_message, quant, margin_bytes, slots, slot_ctx,
predicted (tg_tps, tg_tps_per_stream, output_tps, ttft_ms, tpot_ms, e2el_ms, queue_ms, request_tps), config,
argv, command, reasons, best, per_slots, plans, notes. When nothing fits: as above.
"""

from __future__ import annotations

import json
import sys

from v100lab.advise.tune import NothingFits, tune
from v100lab.base.errors import ConfigError
from v100lab.base.safeio import json_safe, term_lines, term_text
from v100lab.advise.tune_users import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    PHASES,
    Workload,
    advise,
)

NAME = "tune"
HELP = "the fastest llama.cpp configuration that fits a device, as a llama-server command with reasons"


def add_arguments(p):
    p.add_argument("model", metavar="MODEL",
                   help="architecture name (qwen35-27b, gemma3-27b, ...), skeleton:ARCH:QUANT, synth-* alias, or a GGUF "
                        "file/alias/URL")
    p.add_argument("--device", "-d", required=True, metavar="D", help="catalog id, 'host', or a device file")
    p.add_argument("--min-ctx", type=int, default=None,
                   help="context the configuration must hold (default 4096; with a workload: each slot, default a "
                        "whole request)")
    p.add_argument("--parallel", "-np", type=int, default=None,
                   help="server slots (default 1; with a workload: searched from 1 to --users)")
    p.add_argument("--quants", default=None,
                   help="comma-separated quants to consider (default for a family: Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0)")
    p.add_argument("--host-device", default=None, metavar="D",
                   help="the CPU that holds what the GPU does not (default: this machine, measured)")
    p.add_argument("--measure", action="store_true", help="measure the best predictions and choose by measurement")
    p.add_argument("--measure-top", type=int, default=3, help="how many candidates to measure (default %(default)s)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="tokens generated per measurement (default %(default)s)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per measurement (default %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    w = p.add_argument_group("a workload (serving: slots, context per slot and cache types for it)")
    w.add_argument("--users", type=int, default=None, metavar="N", help="concurrent streams (default 1)")
    w.add_argument("--prompt-tokens", type=int, default=None, metavar="P",
                   help=f"a typical request's prompt (default {DEFAULT_PROMPT_TOKENS})")
    w.add_argument("--output-tokens", type=int, default=None, metavar="G",
                   help=f"a typical request's output (default {DEFAULT_OUTPUT_TOKENS})")
    w.add_argument("--ttft-ms", type=float, default=None, metavar="MS", help="SLO: time to first token at most MS")
    w.add_argument("--tpot-ms", type=float, default=None, metavar="MS",
                   help="SLO: time per output token (after the first) at most MS")
    w.add_argument("--phases", choices=PHASES, default=None,
                   help="staggered (default: users at random phases) or together (a benchmark's lockstep loop)")


_WORKLOAD_FLAGS = ("users", "prompt_tokens", "output_tokens", "ttft_ms", "tpot_ms", "phases")


def _emit(doc, text: str, as_json: bool):
    if as_json:
        json.dump(json_safe(doc), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(term_lines(text))   # model names and notes come from files: escape them


def _run_workload(args, quants) -> int:
    if args.measure:
        raise ConfigError("--measure: a workload is predicted only; measure it with serve-bench")
    w = Workload(users=1 if args.users is None else args.users,
                 prompt_tokens=DEFAULT_PROMPT_TOKENS if args.prompt_tokens is None else args.prompt_tokens,
                 output_tokens=DEFAULT_OUTPUT_TOKENS if args.output_tokens is None else args.output_tokens,
                 ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, min_ctx=args.min_ctx, phases=args.phases or "staggered")
    try:
        r = advise(args.model, args.device, w, quants=quants, parallel=args.parallel, host=args.host_device)
    except NothingFits as exc:
        if args.json:
            _emit(exc.result.as_dict(), "", True)
        raise
    _emit(r.as_dict(), r.format_text(), args.json)
    if not r.slo_met:
        print(f"v100lab tune: {term_text(r.slo_message())}", file=sys.stderr)
        return 1
    return 0


def run(args) -> int:
    quants = None
    if args.quants:
        quants = [q.strip().upper() for q in args.quants.split(",") if q.strip()]
        if not quants:
            raise ConfigError("--quants: give a comma-separated list, e.g. Q4_0,Q4_K_M")
    if args.measure_top < 1 or args.repetitions < 1 or args.n_gen < 1:
        raise ConfigError("--measure-top, --repetitions and --n-gen must be >= 1")
    if any(getattr(args, f) is not None for f in _WORKLOAD_FLAGS):
        return _run_workload(args, quants)
    try:
        r = tune(args.model, args.device, min_ctx=4096 if args.min_ctx is None else args.min_ctx,
                 parallel=1 if args.parallel is None else args.parallel, quants=quants,
                 measure=args.measure, measure_top=args.measure_top, n_gen=args.n_gen, repetitions=args.repetitions,
                 host=args.host_device)
    except NothingFits as exc:
        # no command: the JSON document says so (fits false, argv empty, the blockers); one line on stderr
        if args.json:
            _emit(exc.result.as_dict(), "", True)
        raise
    _emit(r.as_dict(), r.format_text(), args.json)
    return 0
