"""Notebook 05, ``-ngl``: layers offloaded, predicted for a GPU (the scenario's, or the one beside this machine), and
the effect of spilled layers.
"""

from __future__ import annotations

from v100lab.predict import memory, speed
from v100lab.facts.config import ALL_LAYERS
from v100lab.predict.rates import rates_for
from v100lab.facts.results import TPS, Observation
from v100lab.workbook.scenario import Scenario
from v100lab.predict.work import decode_work
from v100lab.workbook.levers.steps import (bench_tests, conditions, ctx_for, devices_for, gpu_backend, gpu_subject,
                                  lever_frame, measure_sweep, parameters, predict_rows, study)

PARAMETERS = parameters("compare_gpu", "n_ctx", "cache_type_k", "cache_type_v", "n_threads", "gpu_layers", "ctx_sizes", "n_prompt",
                        "n_gen", "repetitions")


def gpu_layers_sweep(sc: Scenario):
    """-ngl from 0 to every layer (or ``gpu_layers``): predicted decode and prompt speed on a GPU, with each
    value's fit — the scenario's model on its device, or, when the scenario predicts for a CPU (where -ngl
    changes nothing), the seed's model on the GPU beside it (:func:`gpu_subject`); measured where llama.cpp
    here has a GPU backend."""
    st = study(sc)
    gpu = gpu_subject(sc)
    cfg = ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    slots = memory.layer_slots(gpu.spec)
    values = list(sc.gpu_layers) or list(range(0, slots + 1))
    devs = devices_for(gpu.device)
    rows: list[Observation] = []
    for ngl in values:
        c = cfg.with_(n_gpu_layers=ngl)
        fits = memory.plan(gpu.spec, devs, c, with_max_ctx=False).fits
        rows += predict_rows(gpu.spec, gpu.label, gpu.device, c, lever="n_gpu_layers", value=ngl,
                             n_prompt=sc.n_prompt, n_gen=sc.n_gen, fit=False,
                             metrics=("tg_tps", "pp_tps", "physical_ceiling_tg_tps"),
                             fits=fits)
        rows.append(Observation(gpu.label, gpu.spec.file_type, gpu.device.id, "n_gpu_layers", str(ngl), "fits",
                                float(fits), "bool", "predicted", fits=fits))
    backend = gpu_backend()
    failures: list[dict[str, str]] = []
    measured_note = ""
    if st.measuring and backend:
        own = values if gpu.spec == st.spec else list(range(0, memory.layer_slots(st.measured_spec) + 1))
        step = max(1, len(own) // 6)
        obs, failures = measure_sweep(st, "n_gpu_layers", own[::step] + ([own[-1]] if own[-1] not in
                                      own[::step] else []), cfg, bench_tests(sc))
        rows += obs
    elif not backend:
        measured_note = ("this llama.cpp build has no GPU backend (CPU only): -ngl changes nothing here, "
                         "so only predictions are shown")
    else:
        measured_note = st.why_not_measured
    return lever_frame(rows, failures, why_not_measured=measured_note, max_gpu_layers=memory.max_gpu_layers(
        gpu.spec, devs, cfg), layer_slots=slots, device_kind=gpu.device.kind, depth=sc.n_gen // 2,
        conditions=conditions(cfg, f"{gpu.label} {gpu.spec.file_type} on {gpu.device.id}", depth=sc.n_gen // 2,
                              threads=False, extra=[f"prompt {sc.n_prompt} tokens"]))


def spill_effect(sc: Scenario):
    """The spill: for each context size with -ngl 999 on a GPU (:func:`gpu_subject`: the scenario's device, or
    the GPU beside this machine), how many layer slots fit, the decode speed predicted with those (llama.cpp's
    --fit), the speed if every layer were on the GPU, and the KV cache bytes a token reads at a short chat's
    depth (lever "n_ctx")."""
    gpu = gpu_subject(sc)
    devs = devices_for(gpu.device)
    rows: list[Observation] = []
    depth = 128
    for n_ctx in sc.ctx_sizes:
        cfg = sc.run_config().with_(n_ctx=n_ctx, n_gpu_layers=ALL_LAYERS)
        ngl = memory.max_gpu_layers(gpu.spec, devs, cfg)
        slots = memory.layer_slots(gpu.spec)
        fitted = cfg.with_(n_gpu_layers=ngl)
        p_fit = speed.predict(gpu.spec, devs, fitted, depth=depth, n_prompt=max(1, sc.n_prompt))
        p_all = speed.predict(gpu.spec, [gpu.device], cfg, depth=depth, n_prompt=max(1, sc.n_prompt))
        kv_read = sum(w.kv_bytes for w in decode_work(
            gpu.spec, speed.placement_for(gpu.spec, [gpu.device], cfg), cfg, depth).values())
        common = dict(model=gpu.label, quant=gpu.spec.file_type, device=gpu.device.id, lever="n_ctx",
                      value=str(n_ctx), source="predicted")
        rows += [Observation(metric="layers_on_gpu", result=float(ngl), unit="layers", **common),
                 Observation(metric="layers_spilled", result=float(slots - ngl), unit="layers", **common),
                 Observation(metric="tg_tps", result=p_fit.tg_tps, unit=TPS,
                             note=f"-ngl {ngl} (what fits); bound: {p_fit.bound}", **common),
                 Observation(metric="tg_tps_all_layers", result=p_all.tg_tps, unit=TPS,
                             note="every layer on the device, memory ignored", **common),
                 Observation(metric="kv_bytes_read_per_token", result=float(kv_read), unit="bytes",
                             note=f"at depth {depth}", **common)]
    cfg = sc.run_config()
    return lever_frame(rows, depth=depth, conditions=conditions(
        cfg, f"{gpu.label} {gpu.spec.file_type} on {gpu.device.id}", depth=depth, threads=False, ctx=False,
        extra=["-ngl 999"]))


def offload_split(sc: Scenario, n_gpu_layers: int) -> dict[str, float]:
    """One decoded token with ``-ngl n_gpu_layers`` on :func:`gpu_subject`'s device (the CPU beside it holds the rest),
    at depth 0, as the speed model accounts it: seconds reading the weights each side holds at its peak
    bandwidth, and seconds on the host link (activations across, logits back). Keys: "device_s", "host_s",
    "link_s", "total_s" — the time per token the by-hand cell rebuilds from the header."""
    gpu = gpu_subject(sc)
    devs = devices_for(gpu.device)
    cfg = sc.run_config().with_(n_gpu_layers=n_gpu_layers)
    placement = speed.placement_for(gpu.spec, devs, cfg)
    work = decode_work(gpu.spec, placement, cfg, 0)
    rates = {k: rates_for(p.device, cfg) for k, p in placement.items()}
    active = [k for k, w in work.items() if w.layers or w.has_output]
    out = {"device_s": 0.0, "host_s": 0.0}
    for k, w in work.items():
        side = "host_s" if placement[k].device.kind == "cpu" else "device_s"
        out[side] += w.weight_bytes_read / (placement[k].device.bandwidth_gbs * 1e9)
    out["link_s"] = speed.tg_link_time(gpu.spec, placement, rates, active)
    out["total_s"] = out["device_s"] + out["host_s"] + out["link_s"]
    return out
