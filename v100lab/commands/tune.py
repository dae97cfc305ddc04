"""``v100lab tune MODEL --device D [--min-ctx N] [--parallel N] [--quants LIST] [--measure] [--json]``.

The fastest llama.cpp configuration that fits the device with a margin, as a llama-server command with one line
per flag saying why it is there and what it buys (see :mod:`v100lab.advisor`). MODEL is an architecture name
(``qwen35-27b``: its quant ladder as skeletons, nothing downloaded), ``skeleton:ARCH:QUANT``, a synthetic alias
(``synth-tiny``: its ladder, built), or one GGUF file / alias / URL. ``--measure`` runs the best predictions for
real and chooses by measurement (real files, on the device this llama.cpp runs on).

JSON keys (a contract): model, device, fits, quant, min_ctx, margin_bytes, measured, predicted_tg_tps,
predicted_pp_tps, weights_ceiling_tg_tps, measured_tg_tps, config, argv, command, reasons (flag, why, delta_tps,
delta_bytes), best, candidates, notes.

When no configuration fits (:func:`v100lab.memory.feasibility`, the rule ``plan`` prints), no command is
printed: one line on stderr says what would have to change, the exit status is 1, and ``--json`` prints
model, device, fits (false), min_ctx, margin_bytes, argv ([]), command (null), message, blocker, blockers,
closest, candidates, notes.
"""

from __future__ import annotations

import json
import sys

from v100lab.advisor import NothingFits, tune
from v100lab.errors import ConfigError
from v100lab.safeio import json_safe, term_lines

NAME = "tune"
HELP = "the fastest llama.cpp configuration that fits a device, as a llama-server command with reasons"


def add_arguments(p):
    p.add_argument("model", metavar="MODEL",
                   help="architecture name (qwen35-27b, gemma3-27b, ...), skeleton:ARCH:QUANT, synth-* alias, or a GGUF "
                        "file/alias/URL")
    p.add_argument("--device", "-d", required=True, metavar="D", help="catalog id, 'host', or a device file")
    p.add_argument("--min-ctx", type=int, default=4096, help="context the configuration must hold (default %(default)s)")
    p.add_argument("--parallel", "-np", type=int, default=1, help="server slots (default %(default)s)")
    p.add_argument("--quants", default=None,
                   help="comma-separated quants to consider (default for a family: Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0)")
    p.add_argument("--host-device", default=None, metavar="D",
                   help="the CPU that holds what the GPU does not (default: this machine, measured)")
    p.add_argument("--measure", action="store_true", help="measure the best predictions and choose by measurement")
    p.add_argument("--measure-top", type=int, default=3, help="how many candidates to measure (default %(default)s)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="tokens generated per measurement (default %(default)s)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per measurement (default %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args) -> int:
    quants = None
    if args.quants:
        quants = [q.strip().upper() for q in args.quants.split(",") if q.strip()]
        if not quants:
            raise ConfigError("--quants: give a comma-separated list, e.g. Q4_0,Q4_K_M")
    if args.measure_top < 1 or args.repetitions < 1 or args.n_gen < 1:
        raise ConfigError("--measure-top, --repetitions and --n-gen must be >= 1")
    try:
        r = tune(args.model, args.device, min_ctx=args.min_ctx, parallel=args.parallel, quants=quants,
                 measure=args.measure, measure_top=args.measure_top, n_gen=args.n_gen, repetitions=args.repetitions,
                 host=args.host_device)
    except NothingFits as exc:
        # no command: the JSON document says so (fits false, argv empty, the blockers); one line on stderr
        if args.json:
            json.dump(json_safe(exc.result.as_dict()), sys.stdout, indent=2, allow_nan=False)
            print()
        raise
    if args.json:
        json.dump(json_safe(r.as_dict()), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(term_lines(r.format_text()))   # model names and notes come from files: escape them
    return 0
