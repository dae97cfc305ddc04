"""Notebook 01, the VRAM triangle: model size × context × card memory — the header's facts, the memory breakdown predicted vs llama.cpp's load log, what fits where, and the largest context.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

from v100lab.predict import memory
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError, RunFailed
from v100lab.gguf.llama_context import kv_bytes_per_token, kv_cache_bytes as _kv_cache_bytes
from v100lab.facts.results import Observation
from v100lab.workbook.scenario import Scenario
from v100lab.facts.spec import ModelSpec
from v100lab.workbook.levers.steps import (beside, capture_load, COMPONENTS, conditions, devices_for, lever_frame, GIB, HOST,
                                   spec_at_quant, loading_study, study, parameters)

PARAMETERS = parameters("compare_gpu", "n_gpu_layers", "n_ctx", "n_batch", "n_ubatch", "cache_type_k", "cache_type_v", "flash_attn",
                        "n_parallel", "swa_full", "quants", "ctx_sizes", "cache_types")

log = logging.getLogger(__name__)


def header_facts(sc: Scenario):
    """The scenario model's header, as the memory model reads it (a two-column table)."""
    import pandas as pd  # heavy third-party dependency

    s = study(sc).spec
    kv_layers = sum(1 for il in range(s.n_layer) if s.has_kv(il))
    rows = [
        ("name", s.name), ("architecture", s.architecture), ("file type", s.file_type),
        ("parameters", f"{s.n_params / 1e9:.3f} B"), ("weights", f"{s.weight_bytes / GIB:.3f} GiB "
                                                      f"({s.bits_per_weight:.2f} bits per weight)"),
        ("file size", f"{s.file_bytes / GIB:.3f} GiB" if s.file_bytes else "no file (skeleton)"),
        ("layers", f"{s.n_layer} ({kv_layers} with a KV cache, {len(s.recurrent_layers)} recurrent, "
                   f"{len(s.swa_layers)} sliding-window)"),
        ("n_embd / n_ff", f"{s.n_embd} / {s.n_ff if isinstance(s.n_ff, int) else max(s.n_ff)}"),
        ("heads / KV heads", f"{s.n_head_at(0)} / {s.n_head_kv(next((i for i in range(s.n_layer) if s.has_kv(i)), 0))}"),
        ("head size K / V", f"{s.head_dim_k} / {s.head_dim_v}"),
        ("training context", f"{s.n_ctx_train}"), ("vocabulary", f"{s.n_vocab}"),
        ("KV cache per token (f16)", f"{kv_bytes_per_token(s) / 1024:.1f} KiB"),
        ("tensor types", ", ".join(f"{k} ×{v}" for k, v in sorted(s.tensor_types.items()))),
    ]
    return pd.DataFrame(rows, columns=["field", "value"])


def _plan_rows(spec: ModelSpec, label: str, devices: Sequence, cfg: RunConfig, group: str) -> list[Observation]:
    p = memory.plan(spec, list(devices), cfg, with_max_ctx=False)
    # the plan calls its CPU "host" whichever CPU it is: beside a catalog GPU that is the GPU's server, not
    # this machine, so it keeps its own id
    cpu = next((d for d in devices if d.kind == "cpu"), None)
    server = cpu.id if cpu is not None and len(devices) > 1 and cpu.id != HOST else HOST
    rows = []
    for dev_name, m in p.devices.items():
        dev_name = server if dev_name == HOST else dev_name
        for comp, attr, _ in COMPONENTS:
            rows.append(Observation(label, spec.file_type, dev_name, "component", comp, "bytes",
                                    float(getattr(m, attr)), "bytes", "predicted", group=group))
        if dev_name != server or server == HOST:   # a GPU's server RAM is not what the lesson is about
            rows.append(Observation(label, spec.file_type, dev_name, "component", "capacity", "capacity_bytes",
                                    float(m.capacity_bytes), "bytes", "predicted", group=group))
    return rows


def memory_breakdown(sc: Scenario):
    """Where the bytes go: predicted per device and component for the scenario's model on its device, and —
    when measuring — llama.cpp's own buffer sizes for the measured model here beside their prediction.

    Lever "component"; metric "bytes" (and "capacity_bytes"); ``group`` names the rows shown together."""
    st = loading_study(sc, load_log=True)
    cfg = sc.run_config()
    rows: list[Observation] = []
    if not st.same_model_here:
        rows += _plan_rows(st.spec, st.label, devices_for(st.device), cfg, f"{st.label} on {st.device.id}")
    gpu = beside(sc)
    if gpu is not None:
        rows += _plan_rows(gpu.spec, gpu.label, devices_for(gpu.device), cfg, f"{gpu.label} on {gpu.device.id}")
    failures = []
    if st.measuring:
        mgroup = f"{st.measured_label} on this machine"
        rows += _plan_rows(st.measured_spec, st.measured_label, [st.host], cfg, mgroup)
        try:
            facts = capture_load(st, cfg)
        except RunFailed as exc:
            facts = None
            failures.append({"lever": "component", "value": "load", "test": "", "reason": str(exc)})
        if facts is not None:
            for comp, _, kind in COMPONENTS:
                if kind is None:
                    continue
                rows.append(Observation(st.measured_label, st.measured_spec.file_type, HOST, "component", comp,
                                        "bytes", float(facts.buffer_bytes(kind)), "bytes", "measured",
                                        group=mgroup))
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured,
                  conditions=conditions(cfg, depth=None, threads=False))


def _quant_specs(model: str, spec: ModelSpec, quants) -> dict[str, ModelSpec]:
    out = {}
    own = spec.file_type.upper()
    try:
        for q in quants:
            out[q.upper()] = spec_at_quant(model, q.upper())
    except ConfigError as exc:
        log.info("%s", exc)
        out = {}
    if own not in out:
        out = {own: spec, **out}
    return out


def quant_specs(sc: Scenario) -> dict[str, ModelSpec]:
    """The scenario's model at every quant of ``sc.quants`` (its own quant first when it is not listed)."""
    st = study(sc)
    return _quant_specs(sc.model, st.spec, sc.quants)


def fit_grid(sc: Scenario):
    """The VRAM triangle on the scenario's device — and on the GPU beside this machine (:func:`beside`, the
    seed's model on its V100) when the scenario predicts for a CPU: for every quant × context × cache type,
    the busiest device's total bytes and margin, whether it fits, how many layers fit, and the largest context
    per quant and cache type (memory.triangle, all predicted; model and device say which grid)."""
    st = study(sc)
    grids = [(st.label, st.device, quant_specs(sc))]
    gpu = beside(sc)
    if gpu is not None:
        grids.append((gpu.label, gpu.device, _quant_specs(gpu.model, gpu.spec, sc.quants)))
    rows = []
    for label, device, specs in grids:
        rows += [replace(o, model=label, device=device.id) for o in
                 memory.triangle(specs, devices_for(device), sc.ctx_sizes, sc.cache_types, sc.run_config())]
    return lever_frame(rows, device_name=st.device.name, capacity_gib=st.device.memory_gib,
                  device_names={d.id: d.name for _, d, _ in grids},
                  conditions=conditions(sc.run_config(), depth=None, threads=False,
                                        extra=[f"-ngl {sc.n_gpu_layers}"]))


def largest_context(grid):
    """The largest context that fits, per model and device, quant (rows) and cache type (columns), from
    :func:`fit_grid`."""
    m = grid[grid["metric"] == "max_ctx"].copy()
    m["cache type"] = m["cache_type"]
    m["model on device"] = m["model"] + " on " + m["device"]
    wide = m.pivot_table(index=["model on device", "quant"], columns="cache type", values="result", aggfunc="max",
                         sort=False)
    wide = wide.astype(int).reset_index()
    wide.columns.name = None
    return wide


def kv_cache_bytes(sc: Scenario) -> int:
    """The KV cache the memory model predicts for the scenario's model and flags (all sequences, all layers)."""
    return _kv_cache_bytes(study(sc).spec, sc.run_config())
