"""``v100lab inspect MODEL [--json]``: what a GGUF header says, and what llama.cpp derives from it.

MODEL is a path, an http(s) URL (only the header is fetched, with Range requests) or a zoo alias.
The JSON keys are a contract (scripts rely on them); see :func:`spec_as_dict`. A file whose tensor data
runs past its end is refused (exit 2). Every string from the file is printed through
:func:`v100lab.workbook.render.term_text` (control characters escaped), and a URL without its secrets.
"""

from __future__ import annotations

import json
import math
import sys

from v100lab.base.errors import ConfigError
from v100lab.gguf.header import DEFAULT_MAX_HEADER_BYTES, MAX_TIMEOUT_S
from v100lab.models.resolve import resolve
from v100lab.workbook.render import term_text
from v100lab.base.safeio import redact_url
from v100lab.facts.spec import ModelSpec

MAX_HEADER_MIB = 4096.0   # the cap itself is capped: a header beyond 4 GiB is not a model

NAME = "inspect"
HELP = "parse a GGUF header (path, URL or alias) and show layers, heads, SWA/recurrent layers, sizes"


def add_arguments(p):
    p.add_argument("model", metavar="MODEL", help="path, http(s) URL or alias (default, gemma3-270m, synth-tiny:Q4_0, ...)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--max-header-mib", type=float, default=DEFAULT_MAX_HEADER_BYTES / 2**20,
                   help="refuse headers larger than this (default %(default)s MiB)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds for the whole HTTP fetch of the header (default %(default)s)")
    p.add_argument("--tensors", action="store_true", help="also list every tensor (name, type, shape, bytes)")


def spec_as_dict(spec: ModelSpec, tensors: bool = False) -> dict:
    """The stable JSON form of a ModelSpec (snake_case keys; the field names are a stable interface for scripts)."""
    def per_layer(v):
        return list(v) if isinstance(v, tuple) else v

    out = {
        "architecture": spec.architecture,
        "name": spec.name,
        "file_type": spec.file_type,
        "n_layer": spec.n_layer,
        "n_embd": spec.n_embd,
        "n_ff": per_layer(spec.n_ff),
        "n_head": per_layer(spec.n_head),
        "n_head_kv": per_layer(spec.n_head_kv_arr),
        "head_dim_k": spec.head_dim_k,
        "head_dim_v": spec.head_dim_v,
        "n_ctx_train": spec.n_ctx_train,
        "n_vocab": spec.n_vocab,
        "rope_freq_base": _finite(spec.rope_freq_base),
        "rope_dimension_count": spec.rope_dimension_count,
        "sliding_window": spec.sliding_window,
        "swa_layers": list(spec.swa_layers),
        "recurrent_layers": list(spec.recurrent_layers),
        "full_attention_interval": spec.full_attention_interval,
        "nextn_layers": spec.nextn_layers,
        "kv_lora_rank": spec.kv_lora_rank,
        "key_length_mla": spec.key_length_mla,
        "value_length_mla": spec.value_length_mla,
        "expert_count": spec.expert_count,
        "expert_used_count": spec.expert_used_count,
        "ssm_conv_kernel": spec.ssm_conv_kernel,
        "ssm_state_size": spec.ssm_state_size,
        "ssm_group_count": spec.ssm_group_count,
        "ssm_time_step_rank": spec.ssm_time_step_rank,
        "ssm_inner_size": spec.ssm_inner_size,
        "n_params": spec.n_params,
        "weight_bytes": spec.weight_bytes,
        "nonlayer_bytes": spec.nonlayer_bytes,
        "bits_per_weight": round(spec.bits_per_weight, 4),
        "header_bytes": spec.header_bytes,
        "alignment": spec.alignment,
        "data_offset": spec.data_offset,
        "file_bytes": spec.file_bytes,
        "data_complete": _data_complete(spec),
        "tensor_types": dict(sorted(spec.tensor_types.items())),
        "layer_bytes": list(spec.layer_bytes),
    }
    if tensors:
        out["tensors"] = [{"name": t.name, "type": t.type_name, "shape": list(t.shape), "n_bytes": t.n_bytes,
                           "offset": t.offset, "layer": t.layer} for t in spec.tensors]
    return out


def _finite(x: float | None) -> float | None:
    """A metadata float for JSON: NaN and infinities (a file can hold them) become null."""
    return x if x is None or math.isfinite(x) else None


def _data_complete(spec: ModelSpec) -> bool | None:
    """Whether the file holds all tensor data (None when its size is unknown)."""
    if spec.file_bytes is None:
        return None
    end = max((t.offset + t.n_bytes for t in spec.tensors), default=0)
    return spec.file_bytes >= spec.data_offset + end


def _data_line(spec: ModelSpec) -> str:
    complete = _data_complete(spec)
    if complete is None:
        return "tensor data: not checked (size unknown)"
    if complete:
        return "tensor data: complete"
    return "tensor data: none (a header-only description; llama.cpp cannot load it)"


def _ranges(idx) -> str:
    """[0,1,2,4,5] → "0-2, 4-5"."""
    idx = list(idx)
    if not idx:
        return "none"
    parts, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _summary(spec: ModelSpec, source: str) -> str:
    d = spec_as_dict(spec)
    lines = [
        f"{term_text(source)}",
        f"  {term_text(spec.architecture)} '{term_text(spec.name, limit=200)}', {spec.file_type}, "
        f"{spec.n_params / 1e6:.1f} M params, "
        f"{_fmt_bytes(spec.weight_bytes)} of weights ({spec.bits_per_weight:.2f} bits/weight)",
        f"  layers {spec.n_layer}, n_embd {spec.n_embd}, n_ff {d['n_ff']}, heads {d['n_head']} "
        f"(KV {d['n_head_kv']}), head_dim k/v {spec.head_dim_k}/{spec.head_dim_v}",
        f"  context (train) {spec.n_ctx_train}, vocab {spec.n_vocab}, rope base {spec.rope_freq_base}",
    ]
    if spec.sliding_window:
        lines.append(f"  sliding window {spec.sliding_window} on layers {_ranges(spec.swa_layers)}")
    if spec.recurrent_layers:
        lines.append(f"  recurrent layers {_ranges(spec.recurrent_layers)} "
                     f"({len(spec.recurrent_layers)} of {spec.n_layer})")
    if spec.expert_count:
        lines.append(f"  MoE: {spec.expert_used_count} of {spec.expert_count} experts per token")
    if spec.kv_lora_rank:
        lines.append(f"  MLA: kv_lora_rank {spec.kv_lora_rank}, key_length_mla {spec.key_length_mla}")
    types = ", ".join(f"{k} ×{v}" for k, v in sorted(spec.tensor_types.items()))
    lines += [
        f"  tensors {len(spec.tensors)}: {types}",
        f"  per layer {_fmt_bytes(max(spec.layer_bytes, default=0))} (max), outside layers "
        f"{_fmt_bytes(spec.nonlayer_bytes)}",
        f"  header {_fmt_bytes(spec.header_bytes)} (alignment {spec.alignment}), file {_fmt_bytes(spec.file_bytes)}",
        f"  {_data_line(spec)}",
    ]
    return "\n".join(lines)


def _check_args(args) -> None:
    mib = args.max_header_mib
    if not math.isfinite(mib) or not 0 < mib <= MAX_HEADER_MIB:
        raise ConfigError(f"--max-header-mib must be in (0, {MAX_HEADER_MIB:g}], got {mib:g}")
    if not math.isfinite(args.timeout) or not 0 < args.timeout <= MAX_TIMEOUT_S:
        raise ConfigError(f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {args.timeout:g}")


def run(args) -> int:
    _check_args(args)
    spec = resolve(args.model, build=True, max_header_bytes=max(1, int(args.max_header_mib * 2**20)),
                   timeout=args.timeout).spec
    if args.json:
        json.dump(spec_as_dict(spec, tensors=args.tensors), sys.stdout, indent=2, allow_nan=False)
        print()
        return 0
    print(_summary(spec, redact_url(args.model) if "://" in args.model else args.model))
    if args.tensors:
        for t in spec.tensors:
            print(f"  {term_text(t.name):<40} {t.type_name:<6} {str(list(t.shape)):<22} {t.n_bytes:>12}")
    return 0
