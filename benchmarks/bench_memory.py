"""Memory model against llama.cpp's own buffers, and the seed's claims in numbers.

Part 1 loads every configuration below in llama.cpp (llama-cpp-python's CPU build, low-level API so
n_seq_max / kv_unified / flash-attn auto are real), reads the buffer sizes llama.cpp prints (model, KV,
compute, output) through its log callback, and compares them with ``v100lab.predict.memory.plan`` for the host.
Targets: weights and KV within 0.1 %, compute within 5 %, total within 2 % (allowing the log's
two-decimal MiB rounding).

Part 2 (item 7): the qwen35 27B and Gemma-3-27B skeletons on a Tesla V100 16 GB — which quants fit at
2048/4096/8192 with f16 and q8_0 KV, how many layer slots spill to the CPU, and the largest context.

Part 3: the other architectures, for real — synthetic qwen35 (hybrid: gated delta net +
full attention), qwen35moe, qwen3moe (experts), gemma3 (SWA) and deepseek2 (MLA) models of the zoo (v100lab.models.synth), tiny and
~0.5 B, F16 and quantized by llama.cpp; the recurrent state (RS buffer) is checked on its own. Then "stress"
models (not in the zoo) sized so that each compute phase the default vocabulary's logits would hide dominates:
the gated-delta-net layer, dense and MoE FFNs. Last, every built rung of the ~0.5 B ladders against its skeleton,
tensor by tensor (llama-quantize's mixture, v100lab.facts.quantmix).

Run:  flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_memory.py [--only-archs]
(memory figures do not depend on timing; the lock only keeps the load off other helpers' measurements).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from v100lab.models import synth, zoo
from v100lab.facts.config import RunConfig
from v100lab.base.errors import RunFailed

TARGETS = {"weights": 0.001, "kv_cache": 0.001, "recurrent": 0.001, "compute": 0.05, "total": 0.02}

# (model alias, run-config fields): 40 configurations across the default model, gemma3-270m (SWA) and
# synthetic llama models; n_ctx 256…32768, n_ubatch 32…2048, f16/q8_0/q4_0 caches, flash attention
# on/off/auto, n_parallel 1/2/4 with and without kv_unified, swa_full on/off.
CONFIGS: list[tuple[str, dict]] = [
    ("default", dict(n_ctx=256)),
    ("default", dict(n_ctx=2048)),
    ("default", dict(n_ctx=4096)),
    ("default", dict(n_ctx=8192, n_ubatch=2048)),
    ("default", dict(n_ctx=32768, flash_attn="off")),
    ("default", dict(n_ctx=32768, flash_attn="off", n_ubatch=32)),
    ("default", dict(n_ctx=32768, flash_attn="on", n_ubatch=2048)),
    ("default", dict(n_ctx=4096, flash_attn="off", n_ubatch=128)),
    ("default", dict(n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("default", dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0", flash_attn="on")),
    ("default", dict(n_ctx=4096, cache_type_k="q8_0", flash_attn="off")),
    ("default", dict(n_ctx=4096, n_parallel=2)),
    ("default", dict(n_ctx=4096, n_parallel=4)),
    ("default", dict(n_ctx=4096, n_parallel=4, kv_unified=True)),
    ("default", dict(n_ctx=3000, n_parallel=3, n_ubatch=256)),
    ("default", dict(n_ctx=16384, n_parallel=4, flash_attn="off", n_ubatch=1024)),
    ("default", dict(n_ctx=8192, n_gpu_layers=0, use_mmap=False)),
    ("gemma3-270m", dict(n_ctx=256)),
    ("gemma3-270m", dict(n_ctx=4096)),
    ("gemma3-270m", dict(n_ctx=4096, swa_full=True)),
    ("gemma3-270m", dict(n_ctx=32768)),
    ("gemma3-270m", dict(n_ctx=32768, swa_full=True, n_ubatch=2048)),
    ("gemma3-270m", dict(n_ctx=32768, flash_attn="off", n_ubatch=2048)),
    ("gemma3-270m", dict(n_ctx=8192, n_ubatch=100)),
    ("gemma3-270m", dict(n_ctx=8192, n_ubatch=32, flash_attn="off")),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=2)),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=4)),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=4, kv_unified=True)),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=2, kv_unified=True, swa_full=True)),
    ("gemma3-270m", dict(n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("gemma3-270m", dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0", flash_attn="on")),
    ("synth-tiny", dict(n_ctx=4096)),
    ("synth-tiny", dict(n_ctx=16384, flash_attn="off", n_ubatch=1024)),
    ("synth-tiny", dict(n_ctx=32768, n_ubatch=2048, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("synth-tiny:Q4_0", dict(n_ctx=4096)),
    ("synth-tiny:Q4_0", dict(n_ctx=8192, n_parallel=2, flash_attn="off")),
    ("synth-tiny:Q4_K_M", dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0")),
    ("synth-tiny:Q4_K_M", dict(n_ctx=2048, n_ubatch=64, flash_attn="off")),
    ("synth-small", dict(n_ctx=8192)),
    ("synth-small", dict(n_ctx=32768, flash_attn="off", n_ubatch=512)),
    ("synth-small", dict(n_ctx=4096, n_parallel=4, cache_type_k="q8_0", cache_type_v="q8_0")),
]
# the other architectures (zoo aliases of v100lab.models.synth), tiny and ~0.5 B, F16 and llama.cpp quants
ARCH_CONFIGS: list[tuple[str, dict]] = [
    ("synth-qwen35-tiny", dict(n_ctx=4096)),
    ("synth-qwen35-tiny", dict(n_ctx=32768, flash_attn="off", n_ubatch=1024)),
    ("synth-qwen35-500m", dict(n_ctx=4096)),
    ("synth-qwen35-500m", dict(n_ctx=32768, flash_attn="off", n_ubatch=1024)),
    ("synth-qwen35-500m", dict(n_ctx=16384, n_ubatch=2048)),
    ("synth-qwen35-500m", dict(n_ctx=32768, n_ubatch=512)),
    ("synth-qwen35-500m", dict(n_ctx=8192, n_parallel=4, n_ubatch=128)),
    ("synth-qwen35-500m", dict(n_ctx=8192, n_parallel=4, kv_unified=True)),
    ("synth-qwen35-500m", dict(n_ctx=8192, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("synth-qwen35-500m:Q4_K_M", dict(n_ctx=8192, n_parallel=2)),
    ("synth-qwen35-500m:Q4_K_M", dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0", n_ubatch=256)),
    ("synth-qwen35-500m:Q4_0", dict(n_ctx=16384, flash_attn="off", n_ubatch=512)),
    ("synth-qwen35-500m:Q4_0", dict(n_ctx=8192, use_mmap=False)),
    ("synth-qwen35moe-tiny", dict(n_ctx=8192)),
    ("synth-qwen35moe-tiny:Q4_0", dict(n_ctx=16384, n_parallel=4, n_ubatch=256)),
    ("synth-qwen3moe-tiny", dict(n_ctx=4096, flash_attn="off", n_ubatch=64)),
    ("synth-qwen3moe-500m", dict(n_ctx=8192)),
    ("synth-qwen3moe-500m", dict(n_ctx=16384, flash_attn="off", n_ubatch=256)),
    ("synth-qwen3moe-500m", dict(n_ctx=32768, n_parallel=2, n_ubatch=1024)),
    ("synth-qwen3moe-500m:Q4_K_M", dict(n_ctx=8192, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("synth-qwen3moe-500m:Q4_0", dict(n_ctx=4096, n_parallel=4, kv_unified=True)),
    ("synth-qwen3moe-500m:Q4_0", dict(n_ctx=4096, use_mmap=False, n_ubatch=128)),
    ("synth-gemma3-tiny", dict(n_ctx=8192, n_parallel=2)),
    ("synth-gemma3-500m", dict(n_ctx=8192)),
    ("synth-gemma3-500m", dict(n_ctx=32768, flash_attn="off", n_ubatch=1024)),
    ("synth-gemma3-500m", dict(n_ctx=32768, swa_full=True)),
    ("synth-gemma3-500m", dict(n_ctx=16384, n_parallel=4, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("synth-gemma3-500m:Q4_K_M", dict(n_ctx=8192, n_parallel=4, kv_unified=True)),
    ("synth-gemma3-500m:Q4_K_M", dict(n_ctx=4096, flash_attn="off", n_ubatch=128)),
]
# deepseek2 (MLA: a K-only cache of the kv_lora_rank latent + the rotated key part; leading dense layer, routed and
# shared experts): its own section of RESULTS.md
MLA_CONFIGS: list[tuple[str, dict]] = [
    ("synth-deepseek2-tiny", dict(n_ctx=4096)),
    ("synth-deepseek2-tiny", dict(n_ctx=16384, flash_attn="off")),
    ("synth-deepseek2-tiny", dict(n_ctx=32768, flash_attn="off", n_ubatch=1024)),
    ("synth-deepseek2-tiny", dict(n_ctx=8192, n_ubatch=2048)),
    ("synth-deepseek2-tiny", dict(n_ctx=8192, n_parallel=4)),
    ("synth-deepseek2-tiny", dict(n_ctx=8192, n_parallel=4, kv_unified=True, flash_attn="off", n_ubatch=256)),
    ("synth-deepseek2-tiny", dict(n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("synth-deepseek2-tiny:Q4_K_M", dict(n_ctx=8192, cache_type_k="q4_0", cache_type_v="q4_0", n_ubatch=256)),
    ("synth-deepseek2-tiny:Q4_0", dict(n_ctx=16384, n_parallel=2, use_mmap=False)),
    ("synth-deepseek2-500m", dict(n_ctx=4096)),
    ("synth-deepseek2-500m", dict(n_ctx=32768)),
    ("synth-deepseek2-500m", dict(n_ctx=16384, flash_attn="off", n_ubatch=512)),
    ("synth-deepseek2-500m", dict(n_ctx=32768, flash_attn="off", n_ubatch=1024)),
    ("synth-deepseek2-500m", dict(n_ctx=8192, n_parallel=4, n_ubatch=128)),
    ("synth-deepseek2-500m", dict(n_ctx=16384, cache_type_k="q8_0", cache_type_v="q8_0", n_ubatch=1024)),
    ("synth-deepseek2-500m:Q4_K_M", dict(n_ctx=8192, n_parallel=2, kv_unified=True)),
    ("synth-deepseek2-500m:Q4_0", dict(n_ctx=8192, use_mmap=False, cache_type_k="q4_0", cache_type_v="q4_0")),
    ("stress-mla", dict(n_ctx=4096)),
    ("stress-mla", dict(n_ctx=8192, n_ubatch=256)),
    ("stress-mla", dict(n_ctx=16384, flash_attn="off")),
    ("stress-mla", dict(n_ctx=4096, n_parallel=2, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("stress-mla-lite", dict(n_ctx=4096)),
    ("stress-mla-lite", dict(n_ctx=4096, flash_attn="off")),
    ("stress-ds-moe", dict(n_ctx=4096)),
    ("stress-ds-moe", dict(n_ctx=16384, flash_attn="off")),
    ("stress-ds-dense", dict(n_ctx=4096)),
    ("stress-ds-dense", dict(n_ctx=16384, flash_attn="off", n_ubatch=256)),
]
# llama.cpp refuses an MLA context whose K and V cache types differ (llama_init_from_model)
MLA_REFUSED: list[tuple[str, dict]] = [
    ("synth-deepseek2-tiny", dict(n_ctx=2048, cache_type_k="q8_0", cache_type_v="f16")),
]

# Stress models: sized so that a compute phase other than the logits (which the default tokenizer's 49152-token
# vocabulary makes dominant in every zoo model) is the peak. Not zoo aliases; written on demand by v100lab.models.synth.
STRESS: dict[str, synth.ArchSynth] = {
    # gated delta net: 128 value heads of 128 (d_inner 16384), 16 key heads: conv channels 20480
    "stress-gdn": synth.ArchSynth("qwen35", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                                  rope_dim=16, ssm_state=128, ssm_groups=16, ssm_heads=128),
    # the same with twice the key heads
    "stress-gdn-k": synth.ArchSynth("qwen35", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                                    rope_dim=16, ssm_state=128, ssm_groups=32, ssm_heads=128),
    # dense FFN of 24576 (hybrid and SWA models)
    "stress-ffn-qwen35": synth.ArchSynth("qwen35", n_layer=4, n_embd=256, n_ff=24576, n_head=4, n_head_kv=2,
                                         head_dim=64, rope_dim=16, ssm_state=64, ssm_groups=2, ssm_heads=4),
    "stress-ffn-gemma3": synth.ArchSynth("gemma3", n_layer=6, n_embd=256, n_ff=24576, n_head=4, n_head_kv=1,
                                         head_dim=64, sliding_window=128, tied_embeddings=True),
    # routed experts: top-8 of 16 experts of 4096 (the SwiGLU of the selected experts dominates)
    "stress-moe": synth.ArchSynth("qwen3moe", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                                  n_expert=16, n_expert_used=8, n_ff_exp=4096),
    "stress-moe-e512": synth.ArchSynth("qwen3moe", n_layer=2, n_embd=512, n_ff=512, n_head=4, n_head_kv=2,
                                       head_dim=64, n_expert=16, n_expert_used=8, n_ff_exp=4096),
    "stress-moe-hybrid": synth.ArchSynth("qwen35moe", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                                         head_dim=64, rope_dim=16, ssm_state=64, ssm_groups=2, ssm_heads=4,
                                         n_expert=16, n_expert_used=8, n_ff_exp=4096, n_ff_shexp=8192),
    # MLA with DeepSeek-V3's attention (128 heads, kv_lora_rank 512, rope 64, nope 128, v 128; q through a
    # bottleneck): the per-head query tensors dominate; -lite: 64 heads and one attn_q (V2-Lite's form)
    "stress-mla": synth.ArchSynth("deepseek2", n_layer=2, n_embd=256, n_ff=512, n_head=128, n_head_kv=1,
                                  head_dim=192, rope_dim=64, v_head_dim=128, kv_lora_rank=512, q_lora_rank=64,
                                  n_dense_lead=1, n_expert=4, n_expert_used=2, n_ff_exp=128, n_expert_shared=1),
    "stress-mla-lite": synth.ArchSynth("deepseek2", n_layer=2, n_embd=256, n_ff=512, n_head=64, n_head_kv=1,
                                       head_dim=192, rope_dim=64, v_head_dim=128, kv_lora_rank=512, q_lora_rank=0,
                                       n_dense_lead=1, n_expert=4, n_expert_used=2, n_ff_exp=128, n_expert_shared=1,
                                       gating="softmax"),
    # deepseek2's FFNs: routed experts top-8 of 16 of 4096 with 2 shared, and a leading dense FFN of 24576
    "stress-ds-moe": synth.ArchSynth("deepseek2", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=1,
                                     head_dim=96, rope_dim=32, v_head_dim=64, kv_lora_rank=128, q_lora_rank=96,
                                     n_dense_lead=1, n_expert=16, n_expert_used=8, n_ff_exp=4096, n_expert_shared=2),
    "stress-ds-dense": synth.ArchSynth("deepseek2", n_layer=2, n_embd=256, n_ff=24576, n_head=4, n_head_kv=1,
                                       head_dim=96, rope_dim=32, v_head_dim=64, kv_lora_rank=128, q_lora_rank=96,
                                       n_dense_lead=1, n_expert=4, n_expert_used=2, n_ff_exp=128, n_expert_shared=1),
}
STRESS_CONFIGS: list[tuple[str, dict]] = [
    ("stress-gdn", dict(n_ctx=4096)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=256)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=128)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=64)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=32)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=64, n_parallel=2)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=256, n_parallel=2)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=128, n_parallel=4)),
    ("stress-gdn", dict(n_ctx=4096, n_ubatch=512, n_parallel=4)),
    ("stress-gdn", dict(n_ctx=16384, n_ubatch=256, flash_attn="off")),
    ("stress-gdn", dict(n_ctx=8192, n_ubatch=1024, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("stress-gdn-k", dict(n_ctx=4096, n_ubatch=128)),
    ("stress-gdn-k", dict(n_ctx=4096, n_ubatch=512)),
    ("stress-gdn-k", dict(n_ctx=8192, n_ubatch=256, n_parallel=3)),
    ("stress-ffn-qwen35", dict(n_ctx=4096)),
    ("stress-ffn-qwen35", dict(n_ctx=16384, n_ubatch=1024, flash_attn="off")),
    ("stress-ffn-gemma3", dict(n_ctx=4096)),
    ("stress-ffn-gemma3", dict(n_ctx=8192, n_parallel=2, n_ubatch=256)),
    ("stress-moe", dict(n_ctx=4096)),
    ("stress-moe", dict(n_ctx=8192, n_ubatch=256)),
    ("stress-moe", dict(n_ctx=4096, n_ubatch=1024, flash_attn="off")),
    ("stress-moe-e512", dict(n_ctx=4096)),
    ("stress-moe-hybrid", dict(n_ctx=4096)),
    ("stress-moe-hybrid", dict(n_ctx=8192, n_ubatch=128, n_parallel=2)),
]
LADDER_500M = ("synth-qwen35-500m", "synth-qwen3moe-500m", "synth-gemma3-500m")
LADDER_MLA = ("synth-deepseek2-500m",)


def model_path(name: str):
    """A zoo alias, or one of the stress models above (written into the cache on first use)."""
    if name in STRESS:
        return synth.arch_synthetic_path(STRESS[name])
    return zoo.model_path(name)


# llama.cpp must refuse these, and the plan must warn (quantized V without flash attention)
REFUSED: list[tuple[str, dict]] = [
    ("default", dict(n_ctx=2048, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="off")),
    ("gemma3-270m", dict(n_ctx=2048, cache_type_v="q4_0", flash_attn="off")),
]


def _label(kw: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in kw.items())


def run_validation(configs=CONFIGS, refused=REFUSED):
    from v100lab.gguf.header import read_spec
    from v100lab.measure.memory_check import check_against_llama
    from v100lab.predict.memory import plan

    rows, refusals = [], []
    for alias, kw in configs:
        path = model_path(alias)
        spec = read_spec(path)
        cfg = RunConfig(**kw)
        checks, facts, p = check_against_llama(path, cfg, spec)
        rows.append((alias, kw, checks, facts))
    for alias, kw in refused:
        path = model_path(alias)
        cfg = RunConfig(**kw)
        warned = any("refuses" in w for w in plan(read_spec(path), [], cfg, with_max_ctx=False).warnings)
        try:
            check_against_llama(path, cfg)
            outcome = "loaded (NOT refused)"
        except RunFailed as exc:
            outcome = f"refused: {str(exc).split(': ', 1)[-1]}"
        refusals.append((alias, kw, warned, outcome))
    return rows, refusals


def validation_markdown(rows, refusals, recurrent: bool = False) -> str:
    mib = 2**20
    rs_head, rs_sep = (" RS MiB |", "---|") if recurrent else ("", "")
    out = [f"| # | model | config | weights MiB pred/llama | KV MiB |{rs_head} compute MiB | output MiB | total err | FA |",
           f"|---|---|---|---|---|{rs_sep}---|---|---|---|"]
    worst = {k: 0.0 for k in TARGETS}
    ok = {k: 0 for k in TARGETS}
    for i, (alias, kw, c, facts) in enumerate(rows, 1):
        for k in TARGETS:
            worst[k] = max(worst[k], abs(c[k].error))
            ok[k] += c[k].within(TARGETS[k])

        def cell(k):
            return f"{c[k].predicted_bytes / mib:.2f} / {c[k].measured_bytes / mib:.2f} ({100 * c[k].error:+.2f}%)"
        rs = f" {cell('recurrent')} |" if recurrent else ""
        out.append(f"| {i} | {alias} | {_label(kw)} | {cell('weights')} | {cell('kv_cache')} |{rs} {cell('compute')} | "
                   f"{c['output'].predicted_bytes / mib:.3f} / {c['output'].measured_bytes / mib:.2f} | "
                   f"{100 * c['total'].error:+.2f}% | {facts.flash_attn or '-'} |")
    n = len(rows)
    rs_ok = f"recurrent state {ok['recurrent']}/{n} (≤ 0.1 %), " if recurrent else ""
    rs_worst = f"recurrent state {100 * worst['recurrent']:.3f} %, " if recurrent else ""
    out += ["", f"Within target (log rounding of ±0.005 MiB per printed buffer allowed): weights {ok['weights']}/{n} "
            f"(≤ 0.1 %), KV {ok['kv_cache']}/{n} (≤ 0.1 %), {rs_ok}compute {ok['compute']}/{n} (≤ 5 %), "
            f"total {ok['total']}/{n} (≤ 2 %). "
            f"Largest |error|: weights {100 * worst['weights']:.3f} %, KV {100 * worst['kv_cache']:.3f} %, {rs_worst}"
            f"compute {100 * worst['compute']:.2f} %, total {100 * worst['total']:.2f} %."]
    if refusals:
        out += ["", ("Configurations llama.cpp must refuse (quantized V cache without flash attention; MLA with "
                     "different K and V cache types):"), ""]
        for alias, kw, warned, outcome in refusals:
            out.append(f"- {alias} {_label(kw)}: plan warns: {'yes' if warned else 'NO'}; llama.cpp: {outcome}")
    return "\n".join(out)


def seed_claims_markdown(device_id: str = "v100-16gb") -> str:
    """Item 7: the qwen35 27B and Gemma-3-27B skeletons on a V100 16 GB."""
    from v100lab.facts.devices import get_device
    from v100lab.predict.memory import max_ctx, max_gpu_layers, plan
    from v100lab.gguf.skeleton import skeleton_spec

    dev = get_device(device_id)
    quants = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
    out = []
    for arch in ("qwen35-27b", "gemma3-27b"):
        out += [f"**{arch}** on {dev.name} ({dev.memory_gib:g} GiB, {dev.runtime_overhead_mib:g} MiB runtime overhead "
                "assumed), -ngl all, n_ubatch 512, flash attention on, 1 sequence. Cells: GPU GiB needed with all "
                "layers on the GPU (✓ fits / ✗ does not), and when it does not, the layer slots that spill at the "
                "largest -ngl that fits.", "",
                "| quant | file GiB | KV | 2048 | 4096 | 8192 | largest n_ctx (all layers on GPU) |",
                "|---|---|---|---|---|---|---|"]
        for q in quants:
            spec = skeleton_spec(arch, q)
            for ct in ("f16", "q8_0"):
                cells = []
                for n_ctx in (2048, 4096, 8192):
                    cfg = RunConfig(n_ctx=n_ctx, cache_type_k=ct, cache_type_v=ct)
                    p = plan(spec, dev, cfg, with_max_ctx=False)
                    g = p.devices[dev.id]
                    if p.fits:
                        cells.append(f"✓ {g.total_bytes / 2**30:.2f}")
                    else:
                        ngl = max_gpu_layers(spec, dev, cfg)
                        cells.append(f"✗ {g.total_bytes / 2**30:.2f}, spill {p.n_layer_total - ngl}/{p.n_layer_total}")
                mc = max_ctx(spec, dev, RunConfig(cache_type_k=ct, cache_type_v=ct))
                out.append(f"| {q} | {spec.weight_bytes / 2**30:.2f} | {ct} | " + " | ".join(cells) + f" | {mc} |")
        out.append("")
    return "\n".join(out)


def ladder_markdown(aliases=LADDER_500M) -> str:
    """Every built rung of the ~0.5 B ladders (llama.cpp's quantizer) against its skeleton, tensor by tensor."""
    from v100lab.gguf.header import read_spec
    from v100lab.gguf.skeleton import skeleton_spec

    out = ["| model | rung | tensors | same name, shape, type, bytes | file weights MiB | skeleton MiB |",
           "|---|---|---|---|---|---|"]
    for alias in aliases:
        arch = synth.arch_spec_of(synth.ARCH_PRESETS[alias])
        for q in zoo.LADDER:
            try:
                path = zoo.model_path(f"{alias}:{q}", build=False)
            except Exception:
                continue
            real, skel = read_spec(path), skeleton_spec(arch, q)
            same = sum((r.name, r.shape, r.type_name, r.n_bytes) == (k.name, k.shape, k.type_name, k.n_bytes)
                       for r, k in zip(real.tensors, skel.tensors))
            out.append(f"| {alias} | {q} | {len(real.tensors)} | {same}/{len(real.tensors)}"
                       f"{'' if len(skel.tensors) == len(real.tensors) else ' (count differs!)'} | "
                       f"{real.weight_bytes / 2**20:.2f} | {skel.weight_bytes / 2**20:.2f} |")
    return "\n".join(out)


def cpu_and_build() -> str:
    """This machine's CPU model and core count (the llama.cpp build is llama-cpp-python's, printed beside it)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    return f"CPU {cpu} ({os.cpu_count()} logical cores)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-validation", action="store_true")
    ap.add_argument("--skip-claims", action="store_true")
    ap.add_argument("--skip-archs", action="store_true", help="leave out part 3 (the other architectures)")
    ap.add_argument("--only-archs", action="store_true", help="part 3 only")
    ap.add_argument("--only-mla", action="store_true", help="the deepseek2 (MLA) rows of part 3 only")
    args = ap.parse_args(argv)
    import llama_cpp

    t0 = time.time()
    print(f"machine: {platform.machine()}, {platform.system()}; llama-cpp-python {llama_cpp.__version__}; "
          f"date {time.strftime('%Y-%m-%d')}; {cpu_and_build()}")
    if args.only_archs or args.only_mla:
        args.skip_validation = args.skip_claims = True
    if not args.skip_archs:
        rows, refusals = run_validation(MLA_CONFIGS, refused=MLA_REFUSED)
        print(f"\n### MLA (deepseek2): {len(rows)} configurations (zoo and stress models)\n")
        print(validation_markdown(rows, refusals))
        print("\n### The deepseek2 ~0.5 B ladder against its skeleton\n")
        print(ladder_markdown(LADDER_MLA))
    if not args.skip_archs and not args.only_mla:
        rows, _ = run_validation(ARCH_CONFIGS, refused=[])
        print(f"\n### Other architectures: {len(rows)} configurations (zoo models)\n")
        print(validation_markdown(rows, [], recurrent=True))
        rows, _ = run_validation(STRESS_CONFIGS, refused=[])
        print(f"\n### Stress models: {len(rows)} configurations (a non-logits compute phase dominates)\n")
        print(validation_markdown(rows, [], recurrent=True))
        print("\n### The ~0.5 B ladders against their skeletons\n")
        print(ladder_markdown())
    if not args.skip_validation:
        rows, refusals = run_validation()
        print(f"\n### Validation: {len(rows)} configurations\n")
        print(validation_markdown(rows, refusals))
    if not args.skip_claims:
        print("\n### The seed's claims in numbers (skeletons, predicted)\n")
        print(seed_claims_markdown())
    print(f"\n(took {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
