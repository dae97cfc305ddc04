"""What the by-hand cells use: the check that compares a value worked out by hand with the package's, and
the few header facts the arithmetic needs that are lists rather than single fields.

Each notebook has one or more cells tagged ``by-hand`` that compute the lesson's key quantity with plain
arithmetic from the model's header fields (:class:`v100lab.facts.spec.ModelSpec`) and the device's figures
(:class:`v100lab.facts.devices.Device`), then call :func:`agree` with the value the package computes for the
same thing — the value behind the notebook's plots. A by-hand value more than 1 % away from the package's
stops the notebook: either the lesson's formula or the package is wrong.
"""

from __future__ import annotations

import math
from dataclasses import replace

from v100lab.gguf.llama_context import has_kv_cache, type_sizef
from v100lab.facts.spec import ModelSpec, TensorInfo
from v100lab.predict.rates import rates_for
from v100lab.workbook.levers.steps import study

TOLERANCE = 0.01


def agree(what: str, by_hand: float, package: float | None, unit: str = "", tolerance: float = TOLERANCE) -> None:
    """Print ``what`` by hand, the package's value and their ratio; raise AssertionError when they differ by
    more than ``tolerance`` (1 %). A package value of None (nothing to compare with in this run, e.g. nothing
    was measured) is printed as such and not checked."""
    u = f" {unit}" if unit else ""
    if package is None:
        print(f"{what}: by hand {_num(by_hand)}{u}; no package value to compare with in this run")
        return
    ratio = by_hand / package if package else (1.0 if by_hand == package else math.inf)
    print(f"{what}: by hand {_num(by_hand)}{u} · v100lab {_num(package)}{u} · ratio {ratio:.4f}")
    if not abs(ratio - 1.0) <= tolerance:
        raise AssertionError(f"{what}: by hand {_num(by_hand)}{u} differs from v100lab's {_num(package)}{u} by "
                             f"{100 * (ratio - 1):+.2f} % (more than {100 * tolerance:g} %)")


def _num(x: float) -> str:
    x = float(x)
    if x == 0 or 1e-3 <= abs(x) < 1e15:
        return f"{x:,.6g}" if abs(x) < 1e6 else f"{x:,.0f}"
    return f"{x:.4g}"


def value_of(df, **eq) -> float | None:
    """The value of the rows of a tidy frame matching ``eq`` (column = value; the mean when several rows
    match, e.g. repetitions), None when none matches."""
    m = df
    for k, v in eq.items():
        m = m[m[k] == (str(v) if k == "value" else v)]
    return float(m["result"].mean()) if len(m) else None


def kv_layers(spec: ModelSpec) -> list[int]:
    """The layers that keep a KV cache: not recurrent (those keep a fixed-size state), with KV heads, and not an
    MTP layer (llama.cpp gives those no cache in the main context)."""
    return [il for il in range(spec.n_layer) if has_kv_cache(spec, il)]


def bytes_per_element(type_name: str) -> float:
    """Bytes per stored value of a ggml type: a block's bytes over its values (gguf.GGML_QUANT_SIZES) —
    f16 2, q8_0 34/32 (32 int8 values and one f16 scale), q4_0 18/32 (ggml_type_sizef)."""
    return type_sizef(type_name)


def not_multiplied(spec: ModelSpec) -> list[TensorInfo]:
    """The tensors a decoded token does not multiply: the input embedding table when the model has its own
    output matrix (only the token's row is looked up), and the MTP/nextn layers plain decoding skips."""
    tied = spec.tensor("output.weight") is None
    first_mtp = spec.n_layer - (spec.nextn_layers or 0)
    return [t for t in spec.tensors
            if (t.name == "token_embd.weight" and not tied) or (t.layer is not None and t.layer >= first_mtp)]


def expert_tensors(spec: ModelSpec) -> list[TensorInfo]:
    """The routed experts' tensors of a MoE model (``ffn_*_exps``, one slab per layer holding every expert): a
    token multiplies only ``expert_used_count`` of the ``expert_count`` experts in each ([] for a dense model)."""
    return [t for t in spec.tensors if "_exps" in t.name] if spec.expert_count else []


def output_bytes(spec: ModelSpec) -> int:
    """Bytes of the output matrix (the embedding table when the model ties them)."""
    t = spec.tensor("output.weight") or spec.tensor("token_embd.weight")
    return t.n_bytes if t is not None else 0


def subject(sc):
    """What a by-hand cell about this machine works on: (model header, device, label) — the model measured
    here on this machine, or, when nothing is measured, the scenario's model on its device.

    The device's ``bandwidth_gbs`` is the peak the speed model divides by (:func:`peak_bandwidth_gbs`), so a
    by-hand ceiling and the package's agree on a calibrated host too."""
    st = study(sc)
    if st.measuring:
        return st.measured_spec, with_peak_bandwidth(st.host, sc), st.measured_label
    return st.spec, with_peak_bandwidth(st.device, sc), st.label


def peak_bandwidth_gbs(device, sc) -> float:
    """GB/s no decode on ``device`` can beat, as the speed model takes it (``rates.DeviceRates.peak_bandwidth``):
    the catalog figure for a GPU; for a calibrated host the larger of its STREAM-like figure and the best
    bandwidth llama.cpp itself reached while calibrating."""
    return rates_for(device, sc.run_config()).peak_bandwidth / 1e9


def with_peak_bandwidth(device, sc):
    return replace(device, bandwidth_gbs=peak_bandwidth_gbs(device, sc))
