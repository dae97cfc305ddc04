"""The speed and memory models' predictions over a fixed grid, to show that a refactor changed nothing it did
not mean to.

No llama.cpp run and no file built: the default model and gemma3-270m (headers) and four header-only skeletons
of the seed's scale, on the host (a fixed, made-up calibration: the grid must not depend on this machine), on
v100-16gb and on t4 with the host beside them — threads 1 and 2, depth 0/1024/4096, flash attention on and
off, 1 and 4 sequences, f16 and q8_0 caches, -ngl 99/20/0 — tg and pp predicted, and each device's planned
bytes. Run it on two checkouts and compare::

    git worktree add --detach /tmp/old REV
    (cd /tmp/old && PYTHONPATH=$PWD python /path/to/benchmarks/bench_predictions.py --json /tmp/old.json)
    python benchmarks/bench_predictions.py --json /tmp/new.json --compare /tmp/old.json

The script only uses names both sides have (speed.predict, memory.plan, skeleton.skeleton_spec,
header.read_spec, zoo's model paths), so it runs on older checkouts too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from types import MappingProxyType

from v100lab.predict import memory, speed
from v100lab.gguf import skeleton
from v100lab.models import zoo
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import Device, get_device
from v100lab.gguf.header import read_spec

TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0", "Q4_1", "Q5_0", "Q3_K", "Q2_K", "BF16", "F32")
SKELETONS = (("qwen35-27b", "Q4_K_M"), ("qwen35-27b", "Q4_0"), ("gemma3-27b", "Q4_K_M"), ("qwen3-32b", "Q3_K_M"))


def _per_thread(scale: float) -> dict:
    """A made-up calibration at one thread count (the shape `v100lab calibrate` stores), faster by ``scale``."""
    return {"bandwidth_gbs": 20.0 * scale, "efficiency": 1.1,
            "tg_s_per_weight": {t: (1 + i / 10) * 1e-10 / scale for i, t in enumerate(TYPES)},
            "attn_s_per_op": 1e-11 / scale, "attn_tail_s_per_op": 2e-11 / scale, "overhead_token_s": 1e-4,
            "overhead_layer_s": 1e-5, "pp_s_per_weight": {t: (1 + i / 20) * 2e-11 / scale for i, t in enumerate(TYPES)},
            "pp_attn_s_per_op": 1e-12 / scale, "pp_overhead_s": 1e-3}


def _as_dict(obj) -> dict:
    return obj.as_dict() if hasattr(obj, "as_dict") else obj.as_json()   # older checkouts spell it as_json


def grid() -> dict[str, dict]:
    cal = {"version": 1, "threads": {"1": _per_thread(1.0), "2": _per_thread(1.8)}}
    host = Device(id="host", name="bench host", kind="cpu", memory_gib=24, bandwidth_gbs=30.0,
                  extra=MappingProxyType({"speed_calibration": cal, "cores": 2, "threads": 2}))
    specs = {"default": read_spec(zoo.default_model_path()), "gemma3-270m": read_spec(zoo.gemma_model_path())}
    specs.update({f"{a}:{q}": skeleton.skeleton_spec(a, q) for a, q in SKELETONS})
    gpus = [get_device("v100-16gb"), get_device("t4")]
    out: dict[str, dict] = {}
    for name, spec in specs.items():
        small = name in ("default", "gemma3-270m")
        for t, depth, fa, npar, ck in itertools.product((1, 2), (0, 1024, 4096), ("on", "off"), (1, 4), ("f16", "q8_0")):
            cfg = RunConfig(n_threads=t, flash_attn=fa, n_parallel=npar, n_ctx=8192, cache_type_k=ck,
                            cache_type_v=ck if fa == "on" else "f16")
            for dname, devs in ([("host", [host])] if small else []) + [(g.id, [g, host]) for g in gpus]:
                for ngl in ((0,) if dname == "host" else (99, 20, 0)):
                    c = cfg.with_(n_gpu_layers=ngl)
                    key = f"{name}|{dname}|t{t}|d{depth}|fa-{fa}|np{npar}|{ck}|ngl{ngl}"
                    try:
                        p = speed.predict(spec, devs, c, depth=depth, n_prompt=512)
                        plan = _as_dict(memory.plan(spec, devs, c, with_max_ctx=False))
                        out[key] = {"tg": round(p.tg_tps, 6), "pp": round(p.pp_tps, 6),
                                    "bytes": {k: v.get("total_bytes") for k, v in plan["devices"].items()}}
                    except Exception as exc:      # a refusal is a result too: compared like the numbers
                        out[key] = {"error": f"{type(exc).__name__}: {str(exc)[:80]}"}
    return out


def compare(old: dict, new: dict) -> None:
    keys = sorted(set(old) | set(new))
    what: Counter = Counter()
    where: Counter = Counter()
    for k in keys:
        a, b = old.get(k), new.get(k)
        if a == b:
            what["identical"] += 1
            continue
        if a is None or b is None or "error" in a or "error" in b:
            kind = "refusal changed"
        else:
            kind = "+".join(f for f in ("tg", "pp", "bytes") if a[f] != b[f])
        what[kind] += 1
        model, _dev, _t, _d, fa, npar, *_ = k.split("|")
        where[f"{kind}: {model}, flash attention {fa[3:]}, {npar[2:]} sequence(s)"] += 1
    print(f"{len(keys)} predictions: " + ", ".join(f"{n} {w}" for w, n in what.most_common()))
    for w, n in sorted(where.items()):
        print(f"  {n:4d}  {w}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the grid's predictions to this file")
    ap.add_argument("--compare", help="a JSON file written by this script on another checkout")
    args = ap.parse_args(argv)
    new = grid()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(new, f, indent=0, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            compare(json.load(f), new)
    else:
        print(f"{len(new)} predictions" + (f" written to {args.json}" if args.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
