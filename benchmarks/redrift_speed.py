"""A validation's drift-corrected errors recomputed from its own references, with the code as it is now (no measuring).

    .venv/bin/python benchmarks/redrift_speed.py VALIDATION.json PROFILE.json

VALIDATION.json: ``benchmarks/bench_speed.py --part host[,llamabench] --json``'s output (its rows and its drift
references); PROFILE.json: the host profile the validation was judged against (a copy of ``host-profile.json`` made
right after its calibration). Each row is predicted again — raw, with the references applied through the Q4_0 rung
only, and by type (``v100lab.measure.drift_check.with_check``, as ``v100lab calibrate --check`` applies a check) — and the
medians and worsts printed, with the default model against llama-bench when the validation has that part. The raw
figures reproduce the validation's own when nothing in the speed model changed since: a check of the recomputation.
Run it with the build the validation measured (its F16 SIMD step sets head_dim tails).
"""

from __future__ import annotations

import json
import statistics
import sys

import bench_speed
from v100lab.measure import drift_check
from v100lab.predict import rates
from v100lab.models import zoo
from v100lab.gguf.header import read_spec


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
    profiles = {"raw": raw, **{"Q4_0 rung" if k == "base" else "by type": p
                               for k, p in bench_speed.corrected_profiles(raw, rec).items()}}
    errs = {name: {"tg": [], "pp": []} for name in profiles}
    for r in val["host"]["rows"]:
        spec = read_spec(zoo.model_path(r["model"]))
        test = r["test"][:2]
        for name, p in profiles.items():
            pred = bench_speed.predict_row(spec, test, r["depth"], r["threads"], p)
            errs[name][test].append(abs((pred.tg_tps if test == "tg" else pred.pp_tps) / r["measured_tps"] - 1))
    print("| predictions | tg median | tg worst | pp median | pp worst |\n|---|--:|--:|--:|--:|")
    for name, d in errs.items():
        cells = [f"{100 * f(v):.1f} %" if v else "—" for v in (d["tg"], d["pp"]) for f in (statistics.median, max)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    rows = (val.get("llamabench") or {}).get("rows") or []
    if rows:
        spec = read_spec(zoo.model_path("default"))
        print("\n| default model vs llama-bench | " + " | ".join(profiles) + " |\n|---|" + "--:|" * len(profiles))
        for r in rows:
            n = int(r["test"][2:])
            errs_lb = [bench_speed.predict_llamabench(spec, r["threads"], n, p) / r["median_mean_tps"] - 1
                       for p in profiles.values()]
            cells = [f"{100 * e:+.1f} %" for e in errs_lb]
            print(f"| {r['threads']} t {r['test']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
