"""A validation's drift-corrected errors recomputed from its own references, with the code as it is now (no measuring).

    .venv/bin/python benchmarks/redrift_speed.py VALIDATION.json PROFILE.json

VALIDATION.json: ``benchmarks/bench_speed.py --part host[,llamabench] --json``'s output (its rows and its drift
references); PROFILE.json: the host profile the validation was judged against (a copy of ``host-profile.json`` made
right after its calibration). Each row is predicted again — raw, with the references applied through the Q4_0 rung
only, and by type (``v100lab.drift_check.with_check``, as ``v100lab calibrate --check`` applies a check) — and the
medians and worsts printed, with the default model against llama-bench when the validation has that part. The raw
figures reproduce the validation's own when nothing in the speed model changed since: a check of the recomputation.
Run it with the build the validation measured (its F16 SIMD step sets head_dim tails).
"""

from __future__ import annotations

import json
import statistics
import sys

import bench_speed
from v100lab import calibration, drift_check, rates, speed, zoo
from v100lab.config import RunConfig
from v100lab.devices import get_device
from v100lab.header import read_spec


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    val, prof = (json.load(open(a)) for a in args)
    ref = (val.get("host") or {}).get("drift_reference")
    if not ref:
        sys.exit("redrift_speed: the validation has no drift reference (bench_speed.py ran with --no-drift-reference)")
    rec = {"rungs": ref["rungs"], "bandwidth_gbs": ref.get("bandwidth_gbs"), "measured_at": ref["at_utc"][-1],
           "calibration_measured_at": prof[rates.PROFILE_KEY]["measured_at"]}
    raw = drift_check.without_check(prof)
    profiles = {"raw": raw,
                "Q4_0 rung": drift_check.with_check(raw, drift_check.only_types(rec, [calibration.DEPTH_TYPE])),
                "by type": drift_check.with_check(raw, rec)}
    host = get_device("host")
    errs = {name: {"tg": [], "pp": []} for name in profiles}
    for r in val["host"]["rows"]:
        spec = read_spec(zoo.resolve(r["model"]))
        cfg = RunConfig(n_ctx=bench_speed._n_ctx(r["depth"]), n_threads=r["threads"], n_gpu_layers=0)
        test = r["test"][:2]
        for name, p in profiles.items():
            if test == "tg":
                pred = speed.predict(spec, [host], cfg, depth=r["depth"] + bench_speed.N_GEN // 2, profile=p).tg_tps
            else:
                pred = speed.predict(spec, [host], cfg, depth=r["depth"], n_prompt=bench_speed.N_PROMPT,
                                     profile=p).pp_tps
            errs[name][test].append(abs(pred / r["measured_tps"] - 1))
    print("| predictions | tg median | tg worst | pp median | pp worst |\n|---|--:|--:|--:|--:|")
    for name, d in errs.items():
        cells = [f"{100 * f(v):.1f} %" if v else "—" for v in (d["tg"], d["pp"]) for f in (statistics.median, max)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    rows = (val.get("llamabench") or {}).get("rows") or []
    if rows:
        spec = read_spec(zoo.resolve("default"))
        print("\n| default model vs llama-bench | " + " | ".join(profiles) + " |\n|---|" + "--:|" * len(profiles))
        for r in rows:
            n = int(r["test"][2:])
            cfg = RunConfig(n_ctx=max(512, n + 256), n_threads=r["threads"], n_gpu_layers=0)
            cells = [f"{100 * (speed.predict(spec, [host], cfg, depth=n // 2, profile=p).tg_tps / r['median_mean_tps'] - 1):+.1f} %"
                     for p in profiles.values()]
            print(f"| {r['threads']} t {r['test']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
