"""``v100lab doctor LOGFILE [--device D] [--no-host-gpus] [--json]``: diagnose a llama.cpp log, item by item.

LOGFILE is what llama-server, llama-cli or llama-bench printed (stderr and stdout together; for llama-server
``-lv 4`` adds the load lines), or one of v100lab's raw logs. Each finding gives the numbers from the log,
the line that shows them and a one-line fix (see :mod:`v100lab.advise.doctor`). Exit status 0 when the log was read
(findings or not), 2 when the file is missing, unreadable or not a llama.cpp log.

JSON keys (a contract): source, kind, device, device_guessed, model_bytes, weights_ceiling_tg_tps, host_free_bytes,
n_loads, findings (code, severity, title, evidence, line, fix, numbers), speeds, gpus, offloaded_layers,
offloadable_layers, flash_attn, buffers_mib, notes.
"""

from __future__ import annotations

import json
import math
import sys

from v100lab.base.cudabuild import detect_gpus
from v100lab.advise.doctor import diagnose_file
from v100lab.base.errors import ConfigError

NAME = "doctor"
HELP = "diagnose a llama.cpp log (llama-server, llama-cli, llama-bench): findings with evidence and fixes"


def add_arguments(p):
    p.add_argument("logfile", metavar="LOGFILE", help="a llama.cpp log file")
    p.add_argument("--device", "-d", metavar="D", default=None,
                   help="catalog id, 'host' or a device file: the memory and bandwidth to judge by "
                        "(default: the GPU the log names, when the catalog knows it)")
    p.add_argument("--free-ram-gib", type=float, default=None,
                   help="free host RAM when the log does not say (llama-server -lv 4 does)")
    p.add_argument("--no-host-gpus", action="store_true",
                   help="do not ask nvidia-smi for this machine's GPUs (a log made on another machine)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


MAX_RAM_GIB = float(1 << 20)   # 1 PiB: beyond any machine, so only typos fail


def _free_ram_bytes(gib: float | None) -> int | None:
    if gib is None:
        return None
    if not math.isfinite(gib) or not 0 <= gib <= MAX_RAM_GIB:
        raise ConfigError(f"--free-ram-gib must be a number of GiB in [0, {MAX_RAM_GIB:g}], got {gib:g}")
    return int(gib * 2**30)


def run(args) -> int:
    free = _free_ram_bytes(args.free_ram_gib)
    # the cards here: a GPU in the machine and a log without one is llama.cpp built without CUDA
    host_gpus = () if args.no_host_gpus else detect_gpus()[0]
    d = diagnose_file(args.logfile, args.device, free_ram_bytes=free, host_gpus=host_gpus)
    if args.json:
        json.dump(d.as_dict(), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(d.format_text())
    return 0
