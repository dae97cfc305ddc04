"""Notebook 07, the serving levers: batch sizes, flash attention, ``--parallel`` (via llama-server), mmap/mlock and threads — one sweep each, predicted and measured.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from v100lab.results import TPS, Observation
from v100lab.scenario import Scenario
from v100lab.levers._study import _ctx_for, _frame, HOST, _measured, predict_rows, study, _tests


def _lever_rows(sc: Scenario, lever: str, values: Sequence[Any], cfg_of, tests: Sequence[str], depth: int = 0,
                backend: str | None = None, predict: bool = True):
    """Predicted rows for each value (this machine and the scenario's device) and the measured sweep."""
    st = study(sc)
    rows: list[Observation] = []
    metrics = tuple(m for m, on in (("tg_tps", any(t.startswith("tg") for t in tests)),
                                    ("pp_tps", any(t.startswith("pp") for t in tests))) if on)
    metrics = metrics or ("tg_tps", "pp_tps")
    for v in values:
        cfg = cfg_of(v)
        if predict:
            if not st.same_model_here:
                rows += predict_rows(st.spec, st.label, st.device, cfg, lever=lever, value=v, depth=depth,
                                     n_prompt=sc.n_prompt, n_gen=sc.n_gen, metrics=metrics + ("strict_ceiling_tg_tps",))
            if st.measuring:
                rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever=lever, value=v,
                                     depth=depth, n_prompt=sc.n_prompt, n_gen=sc.n_gen,
                                     metrics=metrics + ("strict_ceiling_tg_tps",))
    obs, failures = [], []
    if st.measuring and tests:
        from v100lab import bench

        got = []
        for v in values:
            got += bench.run_tests(str(st.measured_path), cfg_of(v), list(tests), [depth], sc.repetitions,
                                   backend=backend, monitor=False, lever=lever, value=v)
        obs, failures = _measured(got, st.measured_label)
    return rows + obs, failures


def batch_sweep(sc: Scenario):
    """-ub (with -b at least as large): prompt processing and decode, measured vs predicted (lever
    "n_ubatch"). The batch sizes change how many prompt tokens one graph holds, not single-stream decode."""
    st = study(sc)
    base = _ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    vals = list(sc.batch_sizes)

    def cfg_of(v):
        return base.with_(n_batch=max(v, base.n_batch), n_ubatch=v)

    rows, failures = _lever_rows(sc, "n_ubatch", vals, cfg_of, _tests(sc))
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


def flash_attn_sweep(sc: Scenario):
    """Flash attention off vs on at the deepest context of ``depths``: measured vs predicted (lever
    "flash_attn")."""
    st = study(sc)
    depth = max(sc.depths) if sc.depths else 0
    base = _ctx_for(sc.run_config(), depth + sc.n_prompt + sc.n_gen + 1)

    def cfg_of(v):
        return base.with_(flash_attn=v)

    rows, failures = _lever_rows(sc, "flash_attn", ["off", "on"], cfg_of, _tests(sc), depth=depth)
    return _frame(rows, failures, why_not_measured=st.why_not_measured, depth=depth)


def parallel_sweep(sc: Scenario):
    """--parallel through llama-server (the seed's server): total decode tok/s of all slots together and
    per stream, measured; the single-stream prediction beside them (the speed model predicts one stream;
    lever "n_parallel", metrics "tg_tps" total and "tg_tps_per_stream")."""
    from v100lab import bench
    from v100lab.backends.server import find_llama_server

    st = study(sc)
    base = _ctx_for(sc.run_config(), sc.n_gen + 1)
    vals = list(sc.parallel_slots)
    rows: list[Observation] = []
    for v in vals:
        cfg = base.with_(n_parallel=v, n_ctx=max(base.n_ctx, (sc.n_gen + 64) * v))
        if st.measuring:
            rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever="n_parallel", value=v,
                                 n_gen=sc.n_gen, metrics=("tg_tps",), note="one stream (the model predicts one)")
        else:
            rows += predict_rows(st.spec, st.label, st.device, cfg, lever="n_parallel", value=v, n_gen=sc.n_gen,
                                 metrics=("tg_tps",), note="one stream (the model predicts one)")
    failures: list[dict[str, str]] = []
    why = st.why_not_measured
    server = find_llama_server() if st.measuring and sc.n_gen else None
    if st.measuring and sc.n_gen and server is None:
        why = "no llama-server binary here (install the extra [server-bin]): --parallel not measured"
    if server is not None:
        got = []
        for v in vals:
            cfg = base.with_(n_parallel=v, n_ctx=max(base.n_ctx, (sc.n_gen + 64) * v))
            got += bench.run_tests(str(st.measured_path), cfg, [f"tg{sc.n_gen}"], [0], sc.repetitions,
                                   backend=f"server-bin:{server}", monitor=False, lever="n_parallel", value=v)
        obs, failures = _measured(got, st.measured_label)
        rows += obs
        for r in got:
            if r.get("status") != "ok":
                continue
            slot_ts = (r.get("extra") or {}).get("slot_ts") or []   # per repetition: each slot's tok/s
            flat = [x for rep in slot_ts for x in (rep if isinstance(rep, list) else [rep])]
            per = [float(x) for x in flat if x] or [float(r["avg_ts"]) / max(1, int(r.get("value") or 1))]
            rows.append(Observation(st.measured_label, r.get("model_file_type") or "", HOST, "n_parallel",
                                    str(r.get("value")), "tg_tps_per_stream", sum(per) / len(per), TPS, "measured",
                                    note=f"mean of {len(per)} slot(s); llama-server"))
    return _frame(rows, failures, why_not_measured=why)


def mmap_mlock(sc: Scenario):
    """Loading: mmap (default), --no-mmap, and --mlock — the time to load the model and create the context,
    and the time to the first token after it (pp + one decoded token), measured here (lever "load_mode").
    The speed model does not model loading, so these rows have no prediction."""
    from v100lab.backends import BenchTest, MeasureFailed
    from v100lab.backends.isolated import IsolatedBackend
    from v100lab.worker import WorkerCrashed

    st = study(sc)
    rows: list[Observation] = []
    failures: list[dict[str, str]] = []
    if not st.measuring:
        return _frame(rows, why_not_measured=st.why_not_measured)
    base = _ctx_for(sc.run_config(), sc.n_prompt + 2)
    modes = (("mmap", dict(use_mmap=True, use_mlock=False)), ("no-mmap", dict(use_mmap=False, use_mlock=False)),
             ("mmap + mlock", dict(use_mmap=True, use_mlock=True)))
    n_prompt = max(1, sc.n_prompt)
    for _ in range(max(1, min(sc.repetitions, 3))):
        for name, flags in modes:
            cfg = base.with_(**flags)
            try:
                sess = IsolatedBackend().open(st.measured_path, cfg)
            except (MeasureFailed, WorkerCrashed) as exc:
                failures.append({"lever": "load_mode", "value": name, "test": "load", "reason": str(exc)})
                continue
            try:
                load_s = sess.info["load_s"]            # timed in the worker, around load + context creation
                m = sess.run(BenchTest(n_prompt, 1), 1, warmup=False)
            except (MeasureFailed, WorkerCrashed) as exc:
                failures.append({"lever": "load_mode", "value": name, "test": "first token", "reason": str(exc)})
                sess.close()
                continue
            try:
                first = sum(m.samples_ns) / 1e9
                warn = [w for w in (sess.load or {}).get("warnings", []) if "mlock" in w.lower()]
            finally:
                sess.close()
            note = "; ".join(["measured in-process"] + warn[:1])
            for metric, val in (("load_s", load_s), ("first_token_s", first)):
                rows.append(Observation(st.measured_label, st.measured_spec.file_type, HOST, "load_mode", name,
                                        metric, float(val), "s", "measured", note=note))
    return _frame(rows, failures, why_not_measured="")


def threads_sweep(sc: Scenario):
    """-t: prompt processing and decode vs CPU threads, measured vs predicted (lever "n_threads")."""
    st = study(sc)
    base = _ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    vals = list(sc.thread_counts) or list(range(1, (os.cpu_count() or 1) + 1))

    def cfg_of(v):
        return base.with_(n_threads=v)

    rows, failures = _lever_rows(sc, "n_threads", vals, cfg_of, _tests(sc))
    return _frame(rows, failures, why_not_measured=st.why_not_measured)
