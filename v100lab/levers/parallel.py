"""Notebook 10, ``--parallel``: llama-server's slots — decode of all slots together and per stream,
measured through llama-server when its binary is here, beside the single-stream prediction.
"""

from __future__ import annotations

from v100lab import harness
from v100lab.backends.server import find_llama_server
from v100lab.results import TPS, Observation
from v100lab.scenario import Scenario
from v100lab.work import Placed, decode_work
from v100lab.levers.steps import (HOST, conditions, ctx_for, lever_frame, loading_study, measured_rows, parameters,
                                  predict_rows, study)

PARAMETERS = parameters("n_ctx", "n_threads", "parallel_slots", "n_gen", "repetitions")


def _slot_config(sc: Scenario, slots: int):
    """The scenario's flags with ``slots`` slots and room for each; without --mlock (how the model is loaded is
    not this lever, and some llama-server builds refuse the flag)."""
    base = ctx_for(sc.run_config(), sc.n_gen + 1)
    return base.with_(n_parallel=slots, n_ctx=max(base.n_ctx, (sc.n_gen + 64) * slots), use_mlock=False)


def parallel_sweep(sc: Scenario):
    """--parallel through llama-server (the seed's server): total decode tok/s of all slots together and
    per stream, measured; beside them what the model says — the one-stream prediction (at one slot: the speed
    model predicts one stream) and, for every slot count, the bandwidth ceiling of all slots together and of
    each stream (:func:`aggregate_ceiling`: one step reads the weights once for every slot; lever
    "n_parallel", metrics "tg_tps" total and "tg_tps_per_stream"). A remote llama-server is not restarted
    per slot count: predictions only, with the reason."""
    st = loading_study(sc)
    vals = list(sc.parallel_slots)
    rows: list[Observation] = []
    spec, label, device = (st.measured_spec, st.measured_label, st.host) if st.measuring else \
        (st.spec, st.label, st.device)
    depth = sc.n_gen // 2
    for v in vals:
        cfg = _slot_config(sc, v)
        if v == 1:
            rows += predict_rows(spec, label, device, cfg, lever="n_parallel", value=v, n_gen=sc.n_gen,
                                 metrics=("tg_tps",), note="one stream (the model predicts one)")
        total = _aggregate_ceiling(spec, device, cfg, v, depth)
        for metric, val in (("physical_ceiling_tg_tps", total), ("physical_ceiling_tg_tps_per_stream", total / v)):
            rows.append(Observation(label, spec.file_type, device.id, "n_parallel", str(v), metric, val, TPS,
                                    "predicted", note=f"{v} slot(s) at depth {depth}: weights read once per step"))
    failures: list[dict[str, str]] = []
    why = st.why_not_measured
    server = find_llama_server() if st.measuring and sc.n_gen else None
    if st.measuring and sc.n_gen and server is None:
        why = "no llama-server binary here (install the extra [server-bin])"
    if server is not None:
        got = []
        for v in vals:
            got += harness.run_tests(str(st.measured_path), _slot_config(sc, v), [f"tg{sc.n_gen}"], [0],
                                   sc.repetitions, backend=f"server-bin:{server}", monitor=False,
                                   lever="n_parallel", value=v)
        obs, failures = measured_rows(got, st.measured_label)
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
    base = _slot_config(sc, 1)
    return lever_frame(rows, failures, why_not_measured=why, depth=depth,
                  conditions=conditions(base, label, ctx=False, depth=f"0 (tg{sc.n_gen} × {sc.repetitions} per slot)"))


def _aggregate_ceiling(spec, device, cfg, slots: int, depth: int) -> float:
    placed = {device.id: Placed(device, tuple(range(spec.n_layer)), True)}
    w = decode_work(spec, placed, cfg, depth)[device.id]
    step_bytes = w.weight_bytes_read + slots * (w.kv_bytes + w.state_bytes)
    return slots * device.bandwidth_gbs * 1e9 / step_bytes


def aggregate_ceiling(sc: Scenario, slots: int, depth: int) -> float:
    """The bandwidth ceiling of ``slots`` sequences decoding together at ``depth`` tokens each, every layer on
    the scenario's device: one step reads the weights once for all of them and each sequence's own KV cache
    and state (the speed model's per-token bytes), so tok/s of all slots ≤ slots × bandwidth / bytes."""
    st = study(sc)
    return _aggregate_ceiling(st.spec, st.device, ctx_for(sc.run_config(), depth + 1), slots, depth)
