"""The "try it" exercises that close each notebook: change one thing, predict the result, then open the
answer — :func:`what_if`, the scenario as it is beside the scenario with the change, as the package predicts
it for the scenario's model on its device.
"""

from __future__ import annotations

from typing import Any, Mapping

from v100lab.predict import memory, speculative, speed
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError
from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.steps import GIB, MIB, devices_for, spec_at_quant, study


def _state(sc: Scenario, quant: str | None, draft: tuple[float, int] | None = None) -> dict[str, Any]:
    st = study(sc)
    spec = spec_at_quant(sc.model, quant) if quant else st.spec
    device = get_device(sc.device)
    devs = devices_for(device)
    cfg = sc.run_config()
    plan = memory.plan(spec, devs, cfg, with_max_ctx=False)
    fitted = cfg
    if device.kind != "cpu" and not plan.fits:
        fitted = cfg.with_(n_gpu_layers=memory.max_gpu_layers(spec, devs, cfg))
    ctx = plan.n_ctx_seq or cfg.n_ctx or spec.n_ctx_train
    depth = max(0, ctx // 2)
    p0 = speed.predict(spec, devs, fitted, depth=0, n_prompt=max(1, sc.n_prompt))
    pd = speed.predict(spec, devs, fitted, depth=depth, n_prompt=max(1, sc.n_prompt))
    on_device = plan.devices.get(device.id) or max(plan.devices.values(), key=lambda m: m.total_bytes)
    host = plan.devices.get("host")
    out = {
        "model and quant": f"{st.label} {spec.file_type}",
        "device": device.name,
        "context per sequence (tokens)": f"{plan.n_ctx_seq:,}",
        "KV cache (MiB, all sequences)": f"{sum(m.kv_cache_bytes for m in plan.devices.values()) / MIB:,.1f}",
        "memory on the device (GiB)": f"{on_device.total_bytes / GIB:,.2f} of {on_device.capacity_bytes / GIB:,.1f}",
        "memory on the host (GiB)": f"{host.total_bytes / GIB:,.2f}" if host is not None and host is not on_device
        else "—",
        "fits": "yes" if plan.fits else f"no: -ngl {fitted.n_gpu_layers} fits" if fitted is not cfg else "no",
        "decode at depth 0 (tok/s)": f"{p0.tg_tps:,.1f} ({p0.bound}-bound)",
        "decode halfway through the context (tok/s)": f"{pd.tg_tps:,.1f} at depth {depth:,}",
        "prompt processing (tok/s)": f"{p0.pp_tps:,.1f} ({sc.n_prompt} tokens)",
        "physical ceiling at depth 0 (tok/s)": f"{p0.physical_ceiling_tg_tps:,.1f}",
    }
    if draft is not None:
        alpha, n = draft
        sp = speculative.predict(spec, devs, fitted, spec_type="ngram-simple", n_draft=n, alpha=alpha)
        out[f"decode with {n} n-gram tokens drafted at α {alpha:g} (tok/s)"] = \
            f"{sp.tps:,.1f} ({sp.speedup:.2f}× without; best draft length {sp.best_n})"
    return out


def what_if(sc: Scenario, scale: Mapping[str, float] | None = None, quant: str | None = None,
            draft: tuple[float, int] | None = None, **changes):
    """The answer to a "try it": predicted for the scenario's model on its device, now and with the change —
    keys set to new values (``n_threads=1``), numeric keys scaled (``scale={"n_ctx": 0.5}``), or the model
    at another quant (``quant="Q8_0"``). A table of what changes: context, KV cache, memory, whether it fits,
    decode at depth 0 and halfway through the context, prompt processing, the physical ceiling; with
    ``draft=(α, n)`` also speculative decode with n n-gram tokens drafted at per-token acceptance α."""
    import pandas as pd  # heavy third-party dependency

    new = dict(changes)
    for key, factor in (scale or {}).items():
        value = getattr(sc, key)
        if key == "n_ctx" and not value:
            value = study(sc).spec.n_ctx_train
        new[key] = max(1, int(round(value * factor)))
    after = sc.with_(**new)
    before_state, after_state = _state(sc, None, draft), _state(after, quant, draft)
    what = ", ".join([f"{k} = {v}" for k, v in new.items()] + ([f"quant = {quant}"] if quant else []))
    if not what:
        raise ConfigError("what_if: name a change (a key, scale= or quant=)")
    rows = [(k, before_state[k], after_state[k]) for k in before_state]
    df = pd.DataFrame(rows, columns=["", "now", f"with {what}"])
    df.attrs["change"] = what
    return df
