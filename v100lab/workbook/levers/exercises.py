"""The "try it" exercises that close each notebook: change one thing, predict the result, then open the
answer — :func:`what_if`, the scenario as it is beside the scenario with the change, as the package predicts
it for the subject the notebook's lesson is about (the scenario's model on its device, or with ``gpu=True``
the GPU lessons' model and card, :func:`~v100lab.workbook.levers.steps.gpu_subject`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from v100lab.gguf import llama_context
from v100lab.predict import memory, speculative, speed
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError
from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.build import card_plan
from v100lab.workbook.levers.steps import GIB, MIB, beside, devices_for, spec_at_quant, study

# The rows a change adds to the answer, beside the ones every answer has: what the lesson asks about.
_LOAD_KEYS = frozenset({"use_mmap", "use_mlock"})
_BATCH_KEYS = frozenset({"n_ubatch", "n_batch"})
_SLOT_KEYS = frozenset({"n_parallel", "kv_unified"})


def _subject(sc: Scenario, gpu: bool, device: str | None):
    """(model, spec, label, device) an answer predicts for: the scenario's model on its device, or with ``gpu``
    the seed's model on the GPU beside this machine (``device`` replacing that GPU when given)."""
    st = study(sc)
    target = beside(sc) if gpu else None
    if target is not None:
        return target.model, target.spec, target.label, get_device(device) if device else target.device
    return sc.model, st.spec, st.label, get_device(device or sc.device)


def _load_rows(spec, device, cfg) -> dict[str, str]:
    """Loading, as llama.cpp does it (src/llama-model-loader.cpp, llama_model_loader::load_all_data): with mmap
    the CPU tensors point into the mapped file (no copy at load; pages fault in at first use); with --no-mmap
    every byte is read into llama.cpp's own buffers, at best at the host's memory bandwidth (file cached)."""
    host = get_device("host") if device.kind == "cpu" else device
    copied = 0 if cfg.use_mmap and device.kind == "cpu" else spec.file_bytes or sum(spec.layer_bytes)
    bw = (host.bandwidth_gbs if device.kind == "cpu" else (device.host_link_gbs or host.bandwidth_gbs)) * 1e9
    return {"bytes copied at load (MiB)": f"{copied / MIB:,.1f}",
            "load time, lower bound (s)": f"{copied / bw:,.3f}" + (" (pages fault in at first token)"
                                                                 if not copied else ""),
            "pages locked in RAM (--mlock)": "yes" if cfg.use_mlock else "no"}


def _cuda_rows(device) -> dict[str, str]:
    """The CUDA build for ``device`` (:func:`v100lab.workbook.levers.build.card_plan`): its architecture, and the
    toolkit it takes with the registry's CUDA 13 alone and with a machine's CUDA 12.9 (a driver of the 580 branch)."""
    if device.kind != "gpu" or not device.compute_capability:
        return {"CUDA architecture (-DCMAKE_CUDA_ARCHITECTURES)": "— (no NVIDIA card)"}
    alone, with12 = card_plan(device), card_plan(device, machine_cuda12=True)

    def toolkit(plan):
        return plan.toolkit.label if plan.cuda else "none: needs CUDA 12.x" if plan.archs and min(plan.archs) < 75 \
            else "none"
    return {"CUDA architecture (-DCMAKE_CUDA_ARCHITECTURES)": f"{device.compute_capability} → "
            f"{';'.join(map(str, with12.archs or alone.archs))}",
            "toolkit with the registry's CUDA 13 alone": toolkit(alone),
            "toolkit with a CUDA 12.9 on the machine too": toolkit(with12)}


def _state(sc: Scenario, quant: str | None, gpu: bool, device: str | None, keys,
           draft: tuple[float, int] | None = None, cuda_build: bool = False) -> dict[str, Any]:
    model, spec, label, device = _subject(sc, gpu, device)
    spec = spec_at_quant(model, quant) if quant else spec
    devs = devices_for(device)
    cfg = sc.run_config()
    plan = memory.plan(spec, devs, cfg, with_max_ctx=False)
    fitted = cfg
    if device.kind != "cpu" and not plan.fits:
        fitted = cfg.with_(n_gpu_layers=memory.max_gpu_layers(spec, devs, cfg))
    ctx = plan.n_ctx_seq or cfg.n_ctx or spec.n_ctx_train
    depth = max(0, ctx // 2)
    n_prompt = max(1, sc.n_prompt)
    p0 = speed.predict(spec, devs, fitted, depth=0, n_prompt=n_prompt)
    pd = speed.predict(spec, devs, fitted, depth=depth, n_prompt=n_prompt)
    # memory as it runs: with the layers that fit when the asked-for split does not
    used = plan if fitted is cfg else memory.plan(spec, devs, fitted, with_max_ctx=False)
    on_device = used.devices.get(device.id) or max(used.devices.values(), key=lambda m: m.total_bytes)
    host = used.devices.get("host")
    out = {
        "model and quant": f"{label} {spec.file_type}",
        "device": device.name,
        "GPU layers (-ngl)": f"{min(fitted.n_gpu_layers, memory.layer_slots(spec))} of {memory.layer_slots(spec)}"
        if device.kind != "cpu" else "— (CPU)",
        "context per sequence (tokens)": f"{plan.n_ctx_seq:,}",
        "KV cache (MiB, all sequences)": f"{sum(m.kv_cache_bytes for m in used.devices.values()) / MIB:,.1f}",
        "memory on the device (GiB)": f"{on_device.total_bytes / GIB:,.2f} of {on_device.capacity_bytes / GIB:,.1f}",
        "memory on the host (GiB)": f"{host.total_bytes / GIB:,.2f}" if host is not None and host is not on_device
        else "—",
        "fits": "yes" if plan.fits else f"no: -ngl {fitted.n_gpu_layers} fits" if fitted is not cfg else "no",
        "decode at depth 0 (tok/s)": f"{p0.tg_tps:,.1f} ({p0.bound}-bound)",
        "decode halfway through the context (tok/s)": f"{pd.tg_tps:,.1f} at depth {depth:,}",
        "prompt processing (tok/s)": f"{p0.pp_tps:,.1f} ({n_prompt} tokens)",
        "bandwidth ceiling (tok/s)": f"{p0.weights_ceiling_tg_tps:,.1f}",
    }
    if keys & _BATCH_KEYS:
        out["prompt steps (graph runs)"] = f"{math.ceil(n_prompt / min(cfg.n_ubatch, cfg.n_batch)):,}" \
                                           f" of ≤ {min(cfg.n_ubatch, cfg.n_batch)} tokens"
        out["prompt time (s)"] = f"{n_prompt / p0.pp_tps:,.3f}"
    if keys & _SLOT_KEYS:
        sizes = llama_context.context_sizes(spec, cfg)
        slots = max(1, cfg.n_parallel)
        out["slots × context each"] = f"{slots} × {sizes.n_ctx_seq:,}"
        out["longest single conversation (tokens)"] = f"{sizes.n_ctx_seq:,}"
    if keys & _LOAD_KEYS:
        out.update(_load_rows(spec, device, cfg))
    if cuda_build:
        out.update(_cuda_rows(device))
    if draft is not None:
        alpha, n = draft
        sp = speculative.predict(spec, devs, fitted, spec_type="ngram-simple", n_draft=n, alpha=alpha)
        out[f"decode with {n} n-gram tokens drafted at α {alpha:g} (tok/s)"] = \
            f"{sp.tps:,.1f} ({sp.speedup:.2f}× without; best draft length {sp.best_n})"
    return out


def what_if(sc: Scenario, scale: Mapping[str, float] | None = None, quant: str | None = None, gpu: bool = False,
            draft: tuple[float, int] | None = None, cuda_build: bool = False, **changes):
    """The answer to a "try it", predicted now and with the change — keys set to new values (``n_threads=1``),
    numeric keys scaled (``scale={"n_ctx": 0.5}``), the model at another quant (``quant="Q8_0"``). With ``gpu``,
    for the seed's model on the GPU beside this machine (``device=`` then swaps that GPU). Rows: what fits,
    memory, decode, prompt, the bandwidth ceiling, and what the changed key's lesson asks (steps, slots, loading);
    with ``draft=(α, n)`` also speculative decode with n n-gram tokens drafted at per-token acceptance α; with
    ``cuda_build`` also the CUDA build for the card (its architecture, and the toolkit that compiles it)."""
    import pandas as pd  # heavy third-party dependency

    new = dict(changes)
    device = new.pop("device", None) if gpu and beside(sc) is not None else None
    for key, factor in (scale or {}).items():
        value = getattr(sc, key)
        if key == "n_ctx" and not value:
            value = study(sc).spec.n_ctx_train
        new[key] = max(1, int(round(value * factor)))
    what = ", ".join([f"{k} = {v}" for k, v in new.items()] + ([f"device = {device}"] if device else [])
                     + ([f"quant = {quant}"] if quant else []))
    if not what:
        raise ConfigError("what_if: name a change (a key, scale=, quant= or device=)")
    after = sc.with_(**new) if new else sc
    keys = set(new)
    before_state = _state(sc, None, gpu, None, keys, draft, cuda_build)
    after_state = _state(after, quant, gpu, device, keys, draft, cuda_build)
    rows = [(k, before_state[k], after_state[k]) for k in before_state]
    df = pd.DataFrame(rows, columns=["", "now", f"with {what}"])
    df.attrs["change"] = what
    df.attrs["subject"] = f"{before_state['model and quant']} on {before_state['device']}"
    return df
