"""Notebook 02, the bandwidth ceiling: tok/s ≤ bandwidth / bytes per token per quant and device, the roofline with this machine's calibration, and published Apple Silicon rows.
"""

from __future__ import annotations

from typing import Any

from v100lab.predict import memory, speed
from v100lab.predict.speed import apple_rows
from v100lab.measure.harness import run_tests
from v100lab.predict.rates import stored_calibration
from v100lab.advise.seed import load_seed_claims
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import catalog, get_device
from v100lab.base.errors import ConfigError
from v100lab.predict.memory import fit_gpu_layers
from v100lab.facts.results import TPS, Observation
from v100lab.workbook.scenario import Scenario
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.facts.spec import ModelSpec
from v100lab.predict.work import Placed, decode_work
from v100lab.workbook.levers.triangle import quant_specs
from v100lab.workbook.levers.steps import (conditions, devices_for, lever_frame, measured_rows, parameters,
                                  predict_rows, spec_at_quant, study)

PARAMETERS = parameters("claims", "compare_devices", "n_ctx", "n_threads", "quants", "n_gen", "repetitions")


def ceilings(sc: Scenario):
    """Per quant, on the scenario's device: the seed's ceiling (bandwidth / weight bytes), the physical ceiling
    and the predicted decode speed (layers that do not fit run on the CPU); plus, when the claims are the
    seed's, its own ceiling table beside the same figures for its assumed model and device (lever "quant")."""
    st = study(sc)
    cfg = sc.run_config()
    rows: list[Observation] = []
    for q, spec in quant_specs(sc).items():
        rows += predict_rows(spec, st.label, st.device, cfg, lever="quant", value=q, n_gen=sc.n_gen,
                             n_prompt=sc.n_prompt, metrics=("tg_tps",))
        rows += device_ceilings(spec, st.label, st.device, cfg, lever="quant", value=q, depth=sc.n_gen // 2)
    if sc.claims == "seed":
        claims = load_seed_claims()
        dev = get_device(claims["device"])
        seed_label = claims["model"]["label"]
        for row in claims["ceiling_table"]:
            q = row["quant"]
            spec = skeleton_spec(claims["model"]["arch"], q)
            rows += device_ceilings(spec, seed_label, dev, RunConfig(n_ctx=2048), lever="quant", value=q)
            rows.append(Observation(seed_label, q, dev.id, "quant", q, "weights_ceiling_tg_tps",
                                    float(row["claimed_ceiling_tps"]), TPS, "claimed",
                                    note=f"the seed's table: {row['file_gb']} GB file"))
    return lever_frame(rows, conditions=conditions(cfg, depth=sc.n_gen // 2, threads=False)
                  + (" (the seed's table: its own figures)" if sc.claims == "seed" else ""))


def device_ceilings(spec: ModelSpec, label: str, device, cfg: RunConfig, *, lever: str, value: Any,
                    depth: int = 0) -> list[Observation]:
    """The two ceilings with *every* weight on ``device``, fit or not: the seed's (bandwidth / weight bytes)
    and the physical one (bytes a token must read — weights used, KV at ``depth``, state — at peak bandwidth)."""
    plain = speed.ceiling_tps(spec.weight_bytes, device.bandwidth_gbs)
    strict = speed.physical_ceiling_tps(spec, device, cfg, depth)
    return [Observation(label, spec.file_type, device.id, lever, str(value), "weights_ceiling_tg_tps", plain, TPS,
                        "predicted", note=f"the bandwidth ceiling: {device.bandwidth_gbs:g} GB/s / "
                                          f"{spec.weight_bytes / 1e9:.2f} GB of weights"),
            Observation(label, spec.file_type, device.id, lever, str(value), "physical_ceiling_tg_tps", strict, TPS,
                        "predicted", note="bytes a token must read, all on the device, at peak bandwidth")]


def catalog_ceilings(sc: Scenario):
    """The scenario's model (its own quant) on every device of ``compare_devices`` (default: the catalog):
    the seed's ceiling, the predicted decode speed, whether it fits, and the per-token overhead limit
    (``overhead_floor_tg_tps``: 1 / the time a token costs whatever its bytes — launching the graph, each
    layer's kernels, synchronising — which a small model hits long before any bandwidth; lever "device")."""
    st = study(sc)
    ids = list(sc.compare_devices) or list(catalog())
    if st.device.id not in ids and st.device.kind != "cpu":
        ids.insert(0, st.device.id)
    cfg = sc.run_config()
    rows: list[Observation] = []
    for dev_id in ids:
        dev = get_device(dev_id)
        devs = devices_for(dev)
        fits = memory.plan(st.spec, devs, cfg, with_max_ctx=False).fits
        rows += predict_rows(st.spec, st.label, dev, cfg, lever="device", value=dev.id, n_gen=sc.n_gen,
                             n_prompt=sc.n_prompt, metrics=("tg_tps",), fits=fits)
        rows += device_ceilings(st.spec, st.label, dev, cfg, lever="device", value=dev.id, depth=sc.n_gen // 2)
        p = speed.predict(st.spec, devs, fit_gpu_layers(st.spec, devs, cfg)[0], depth=sc.n_gen // 2,
                          n_prompt=max(1, sc.n_prompt))
        overhead = p.t_overhead_token_s + sum(d.t_overhead_s for d in p.by_device.values())
        if overhead > 0:
            rows.append(Observation(st.label, st.spec.file_type, dev.id, "device", dev.id, "overhead_floor_tg_tps",
                                    1.0 / overhead, TPS, "predicted",
                                    note=f"{overhead * 1e3:.3f} ms of fixed cost per token"))
    return lever_frame(rows, conditions=conditions(cfg, st.label + " " + st.spec.file_type, depth=sc.n_gen // 2,
                                              threads=False),
                  weights_mb=st.spec.weight_bytes / 1e6)


def roofline(sc: Scenario):
    """This machine's roofline for the measured model (else the scenario's model): per quant, the plain
    bandwidth ceiling and the calibrated prediction with the bound that limits it; and the measured decode
    speed of the measured model itself (lever "quant")."""
    st = study(sc)
    model = st.measured if st.measuring else sc.model
    spec = st.measured_spec if st.measuring else st.spec
    label = st.measured_label if st.measuring else st.label
    cfg = sc.run_config()
    rows: list[Observation] = []
    quants = list(dict.fromkeys([spec.file_type] + [q.upper() for q in sc.quants]))
    for q in quants:
        try:
            qs = spec if q == spec.file_type else spec_at_quant(str(st.measured_path) if st.measuring else model, q)
        except ConfigError:
            continue
        rows += predict_rows(qs, label, st.host, cfg, lever="quant", value=q, n_gen=sc.n_gen,
                             n_prompt=sc.n_prompt, metrics=("tg_tps",))
        rows += device_ceilings(qs, label, st.host, cfg, lever="quant", value=q, depth=sc.n_gen // 2)
    failures = []
    if st.measuring and sc.n_gen:
        got = run_tests(str(st.measured_path), cfg, [f"tg{sc.n_gen}"], [0], sc.repetitions, monitor=False,
                        lever="quant", value=spec.file_type, backend=st.backend)
        obs, failures = measured_rows(got, label)
        rows += obs

    return lever_frame(rows, failures, calibrated=bool(stored_calibration()), host_bandwidth_gbs=st.host.bandwidth_gbs,
                  why_not_measured=st.why_not_measured, depth=sc.n_gen // 2,
                  conditions=conditions(cfg, label, depth=f"0 (tg{sc.n_gen} × {sc.repetitions})"))


def apple(sc: Scenario):
    """Published llama.cpp rows on Apple Silicon (Llama 2 7B; source "claimed": published by others) against
    the speed model's prediction for the same chip (fitted on the *other* chips: leave-one-chip-out)."""
    df = apple_rows()
    rows = []
    for _, r in df[df["comparable"]].iterrows():
        value = f"{r['chip']} {int(r['gpu_cores'])}c"
        metric = "tg_tps" if r["test"] == "tg128" else "pp_tps"
        dev = f"apple {r['chip']}"
        rows.append(Observation("Llama 2 7B", r["quant"], dev, "chip", value, metric, float(r["published"]), TPS,
                                "claimed", above_ceiling=bool(r["above_ceiling"]), note=f"published: {r['source']}"))
        rows.append(Observation("Llama 2 7B", r["quant"], dev, "chip", value, metric, float(r["predicted"]), TPS,
                                "predicted", note=f"fit on {r['fit_on']}"))
    return lever_frame(rows, conditions="Llama 2 7B · tg128 and pp512 at depth 0 · llama-bench as published (Metal)")


def flops_per_token(sc: Scenario, spec: ModelSpec | None = None) -> float:
    """FLOPs of one decoded token at depth 0 with every layer on the scenario's device (the speed model's
    count: 2 per weight multiplied, 2 per attention multiply-add)."""
    st = study(sc)
    spec = spec or st.spec
    placed = {st.device.id: Placed(st.device, tuple(range(spec.n_layer)), True)}
    return sum(w.flops for w in decode_work(spec, placed, sc.run_config(), 0).values())
