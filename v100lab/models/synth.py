"""Synthetic models of other architectures: the seed's hybrid, MoE and sliding-window models, for real.

The zoo's ``synth-*`` llama models (:mod:`v100lab.models.zoo`) show a plain transformer. This module writes
small GGUF files of the architectures the seed's scenario is about, with random weights and the default
model's tokenizer, that this llama.cpp build loads and generates with:

* ``qwen35`` — the hybrid of the seed's 27B: gated-delta-net (linear attention, a fixed F32 state per
  sequence) on three of every four layers, gated full attention (KV cache) on every fourth;
* ``qwen35moe`` — the same hybrid with routed experts and one shared expert per layer;
* ``qwen3moe`` — full attention, routed experts (top-k of n_expert per token);
* ``gemma3`` — sliding-window attention on five of every six layers, tied embeddings;
* ``deepseek2`` — multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): a compressed KV latent of
  ``kv_lora_rank`` plus a shared rotated key part is all the cache holds (K only), queries through a
  ``q_lora_rank`` bottleneck, the absorbed ``attn_k_b`` / ``attn_v_b`` of newer conversions; leading dense
  layers, then routed experts (sigmoid gating with a selection bias, as DeepSeek-V3) and a shared expert.

One layout serves skeletons and synthetic files: an :class:`ArchSynth` becomes an architecture spec
(:func:`v100lab.gguf.skeleton.validate_arch`'s schema), and the file's tensors and metadata are exactly
:func:`v100lab.gguf.skeleton.tensor_layout` and :func:`v100lab.gguf.skeleton.arch_metadata` of that spec — the shapes
of llama.cpp's ``load_arch_tensors`` (src/models/<arch>.cpp). So the skeleton of a synthetic model, quantized
by :mod:`v100lab.facts.quantmix`, can be compared tensor by tensor with what llama.cpp's quantizer wrote
(``tests/test_synth_archs.py``).

Aliases (found or built by :func:`v100lab.models.zoo.model_path`; their ModelSpec through :func:`v100lab.models.resolve.resolve`): ``synth-<arch>-tiny`` (a few MB, for
tests) and ``synth-<arch>-500m`` (about half a billion parameters, for measurements), each with
``:QUANT`` rungs made by llama.cpp's quantizer, e.g. ``synth-qwen35-500m:Q4_K_M``.

Nothing here loads llama.cpp in the calling process: :func:`generate` runs in a worker
(:func:`v100lab.models.worker.call_isolated`).
"""

from __future__ import annotations

import ctypes
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from v100lab.base.errors import RunFailed, V100labError
from v100lab.facts.loadlog import capture_llama_log
from v100lab.models.modelcache import DEFAULT_DIST, build_atomically, cache_dir, tokenizer_fields, tokenizer_vocab_size
from v100lab.gguf.skeleton import arch_metadata, tensor_layout, validate_arch
from v100lab.models.worker import call_isolated

# Bump when the way these files are written changes: every cached file of this module is rebuilt.
ARCH_WRITER_VERSION = 1

SYNTH_ARCHS = ("qwen35", "qwen35moe", "qwen3moe", "gemma3", "deepseek2")


@dataclass(frozen=True)
class ArchSynth:
    """Dimensions of a synthetic model of one architecture (the fields an architecture uses; others stay 0).

    ``head_dim`` is the attention head size (``attention.key_length`` = ``value_length``); ``rope_dim`` the
    rotated part of it (0: all of it). Hybrids: ``ssm_state`` (head size of the linear attention, = d_state),
    ``ssm_groups`` (key heads), ``ssm_heads`` (value heads, = time_step_rank); d_inner = ssm_state × ssm_heads.
    MoE: ``n_expert`` routed experts of width ``n_ff_exp``, ``n_expert_used`` per token; ``n_ff_shexp`` the
    shared expert's width (qwen35moe). ``sliding_window``: gemma3's window (0: no SWA).

    deepseek2 (MLA): ``head_dim`` is the per-head query/key size after decompression (qk_nope + qk_rope,
    ``key_length_mla``), ``rope_dim`` its rotated part (qk_rope_head_dim), ``v_head_dim`` the value head
    (``value_length_mla``); ``kv_lora_rank`` the cached latent, ``q_lora_rank`` the query bottleneck (0: one
    attn_q); ``n_head_kv`` must be 1 (MLA is stored as MQA). ``n_dense_lead`` leading dense layers (width
    ``n_ff``), then ``n_expert`` routed experts of ``n_ff_exp`` and ``n_expert_shared`` shared ones; ``gating``
    "sigmoid" (with an exp_probs_b selection bias, DeepSeek-V3) or "softmax" (V2)."""

    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int = 0
    n_ctx_train: int = 8192
    tied_embeddings: bool = False
    sliding_window: int = 0
    full_attention_interval: int = 4
    ssm_state: int = 0
    ssm_groups: int = 0
    ssm_heads: int = 0
    ssm_conv: int = 4
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    v_head_dim: int = 0
    n_dense_lead: int = 0
    n_expert_shared: int = 0
    gating: str = "sigmoid"
    seed: int = 0

    def __post_init__(self):
        if self.architecture not in SYNTH_ARCHS:
            raise V100labError(f"synthetic model: architecture '{self.architecture}' is not one this module "
                               f"writes ({', '.join(SYNTH_ARCHS)})")
        for name in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_ctx_train"):
            if getattr(self, name) <= 0:
                raise V100labError(f"synthetic model: {name} must be positive, got {getattr(self, name)}")
        if self.n_head % self.n_head_kv:
            raise V100labError(f"synthetic model: n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if self.rope_dim < 0 or self.rope_dim > self.head_dim or self.rope_dim % 2:
            raise V100labError(f"synthetic model: rope_dim {self.rope_dim} must be even and at most head_dim")
        if self.hybrid:
            if min(self.ssm_state, self.ssm_groups, self.ssm_heads, self.ssm_conv) <= 0:
                raise V100labError("synthetic model: a hybrid needs positive ssm_state, ssm_groups, ssm_heads, ssm_conv")
            if self.ssm_heads % self.ssm_groups:
                # llama.cpp qwen35.cpp build_layer_attn_linear: GGML_ASSERT(num_v_heads % num_k_heads == 0)
                raise V100labError(f"synthetic model: ssm_heads {self.ssm_heads} is not a multiple of "
                                   f"ssm_groups {self.ssm_groups}")
            if self.n_layer < self.full_attention_interval:
                raise V100labError(f"synthetic model: {self.n_layer} layers hold no full-attention layer "
                                   f"(every {self.full_attention_interval}th)")
        if self.moe:
            if self.n_expert <= 0 or not 0 < self.n_expert_used <= self.n_expert or self.n_ff_exp <= 0:
                raise V100labError("synthetic model: MoE needs n_expert > 0, 0 < n_expert_used <= n_expert, n_ff_exp > 0")
        if self.mla:
            if self.n_head_kv != 1:
                raise V100labError("synthetic model: deepseek2 (MLA) is stored as MQA, n_head_kv must be 1")
            if min(self.kv_lora_rank, self.v_head_dim, self.rope_dim) <= 0 or self.rope_dim >= self.head_dim:
                raise V100labError("synthetic model: deepseek2 needs positive kv_lora_rank, v_head_dim and rope_dim, "
                                   "and rope_dim below head_dim (qk_nope = head_dim - rope_dim >= 1)")
            if self.q_lora_rank < 0 or not 0 <= self.n_dense_lead < self.n_layer:
                raise V100labError("synthetic model: deepseek2 needs q_lora_rank >= 0 and 0 <= n_dense_lead < n_layer")
            if self.gating not in ("sigmoid", "softmax"):
                raise V100labError(f"synthetic model: gating '{self.gating}' is not sigmoid or softmax")
        if self.architecture == "gemma3" and self.sliding_window < 0:
            raise V100labError("synthetic model: sliding_window must be >= 0")

    @property
    def hybrid(self) -> bool:
        return self.architecture in ("qwen35", "qwen35moe")

    @property
    def moe(self) -> bool:
        return self.architecture in ("qwen3moe", "qwen35moe", "deepseek2")

    @property
    def mla(self) -> bool:
        return self.architecture == "deepseek2"

    @property
    def stem(self) -> str:
        s = (f"synth-{self.architecture}-L{self.n_layer}-E{self.n_embd}-F{self.n_ff}-H{self.n_head}"
             f"-KV{self.n_head_kv}-D{self.head_dim}")
        if self.rope_dim and self.rope_dim != self.head_dim:
            s += f"-R{self.rope_dim}"
        if self.hybrid:
            s += f"-S{self.ssm_state}g{self.ssm_groups}h{self.ssm_heads}c{self.ssm_conv}i{self.full_attention_interval}"
        if self.mla:
            s += f"-M{self.kv_lora_rank}q{self.q_lora_rank}v{self.v_head_dim}d{self.n_dense_lead}{self.gating[:3]}"
        if self.moe:
            s += f"-X{self.n_expert}u{self.n_expert_used}f{self.n_ff_exp}"
            if self.n_ff_shexp:
                s += f"s{self.n_ff_shexp}"
            if self.n_expert_shared:
                s += f"S{self.n_expert_shared}"
        if self.sliding_window:
            s += f"-W{self.sliding_window}"
        if self.tied_embeddings:
            s += "-tied"
        return s + f"-s{self.seed}"

    @property
    def description(self) -> str:
        bits = [f"{self.n_layer} layers, n_embd {self.n_embd}, {self.n_head}/{self.n_head_kv} heads of {self.head_dim}"]
        if self.hybrid:
            n_full = sum(1 for il in range(self.n_layer) if (il + 1) % self.full_attention_interval == 0)
            bits.append(f"{self.n_layer - n_full} gated-delta-net + {n_full} full-attention layers")
        if self.mla:
            bits.append(f"MLA: kv_lora_rank {self.kv_lora_rank}, rope {self.rope_dim}, v_head {self.v_head_dim}, "
                        f"q_lora_rank {self.q_lora_rank}; {self.n_dense_lead} dense layer(s) of {self.n_ff}")
        if self.moe:
            bits.append(f"{self.n_expert} experts of {self.n_ff_exp}, top-{self.n_expert_used}"
                        + (f", shared expert {self.n_ff_shexp}" if self.n_ff_shexp else "")
                        + (f", {self.n_expert_shared} shared expert(s)" if self.n_expert_shared else "")
                        + (f", {self.gating} gating" if self.mla else ""))
        else:
            bits.append(f"n_ff {self.n_ff}")
        if self.sliding_window:
            bits.append(f"SWA window {self.sliding_window} on 5 of 6 layers")
        return f"synthetic {self.architecture} F16: " + ", ".join(bits)

    def arch_spec(self, n_vocab: int) -> dict:
        """The architecture spec (:mod:`v100lab.gguf.skeleton` schema) of this model with ``n_vocab`` tokens."""
        a: dict = {"architecture": self.architecture, "name": self.stem, "n_layer": self.n_layer,
                   "n_embd": self.n_embd, "n_ff": self.n_ff, "n_head": self.n_head, "n_head_kv": self.n_head_kv,
                   "head_dim_k": self.head_dim, "head_dim_v": self.head_dim, "n_ctx_train": self.n_ctx_train,
                   "n_vocab": n_vocab, "rope_freq_base": 10000.0, "rms_eps": 1e-6,
                   "tied_embeddings": self.tied_embeddings, "source_type": "F16"}
        rope = self.rope_dim or self.head_dim
        a["rope_dimension_count"] = rope
        if self.hybrid:
            a["full_attention_interval"] = self.full_attention_interval
            a["ssm"] = {"conv_kernel": self.ssm_conv, "state_size": self.ssm_state, "group_count": self.ssm_groups,
                        "time_step_rank": self.ssm_heads, "inner_size": self.ssm_state * self.ssm_heads}
            a["rope_sections"] = rope_sections(rope)
        if self.moe:
            a["expert_count"] = self.n_expert
            a["expert_used_count"] = self.n_expert_used
            a["expert_ff"] = self.n_ff_exp
            if self.n_ff_shexp:
                a["expert_shared_ff"] = self.n_ff_shexp
        if self.sliding_window:
            a["sliding_window"] = self.sliding_window
        if self.mla:
            # the converter's MQA form (conversion/deepseek.py DeepseekV2Model.set_gguf_parameters)
            a.update(n_head_kv=1, head_dim_k=self.kv_lora_rank + rope, head_dim_v=self.kv_lora_rank,
                     head_dim_k_mla=self.head_dim, head_dim_v_mla=self.v_head_dim, kv_lora_rank=self.kv_lora_rank,
                     q_lora_rank=self.q_lora_rank, leading_dense_blocks=self.n_dense_lead,
                     expert_shared_count=self.n_expert_shared, expert_gating=self.gating,
                     expert_weights_norm=True, expert_weights_scale=2.5 if self.gating == "sigmoid" else 1.0,
                     expert_probs_bias=self.gating == "sigmoid")
        return a


def rope_sections(n_rot: int) -> list[int]:
    """Multimodal-RoPE sections for a text-only qwen35 model rotating ``n_rot`` dims: the real models'
    proportions (Qwen3.5: n_rot 64 → [11, 11, 10, 0], summing to n_rot / 2), scaled."""
    half = n_rot // 2
    t = round(half * 11 / 32)
    h = round(half * 11 / 32)
    return [t, h, half - t - h, 0]


# Named presets. "tiny" ones are a few MB (tests); "500m" ones about half a billion parameters with the
# default model's 49152-token vocabulary (measurements): the shapes of the small real models of each family
# (Qwen3.5-0.8B: 24 layers of 1024, 8 heads of 256, 16 delta-net heads of 128; Gemma-3-1B: 4 heads of 256,
# 1 KV head, window 512) with fewer layers where the vocabulary would not make up the difference.
ARCH_PRESETS: dict[str, ArchSynth] = {
    "synth-qwen35-tiny": ArchSynth("qwen35", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                                   rope_dim=16, ssm_state=64, ssm_groups=2, ssm_heads=4),
    "synth-qwen35-500m": ArchSynth("qwen35", n_layer=24, n_embd=1024, n_ff=3584, n_head=8, n_head_kv=2,
                                   head_dim=256, rope_dim=64, ssm_state=128, ssm_groups=16, ssm_heads=16,
                                   tied_embeddings=True),
    "synth-qwen35moe-tiny": ArchSynth("qwen35moe", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                                      head_dim=64, rope_dim=16, ssm_state=64, ssm_groups=2, ssm_heads=4,
                                      n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff_shexp=256),
    "synth-qwen3moe-tiny": ArchSynth("qwen3moe", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                                     head_dim=64, n_expert=8, n_expert_used=2, n_ff_exp=256),
    "synth-qwen3moe-500m": ArchSynth("qwen3moe", n_layer=8, n_embd=1024, n_ff=3072, n_head=16, n_head_kv=4,
                                     head_dim=64, n_expert=32, n_expert_used=4, n_ff_exp=512),
    "synth-gemma3-tiny": ArchSynth("gemma3", n_layer=6, n_embd=256, n_ff=512, n_head=4, n_head_kv=1, head_dim=64,
                                   sliding_window=128, tied_embeddings=True),
    "synth-gemma3-500m": ArchSynth("gemma3", n_layer=18, n_embd=1024, n_ff=6912, n_head=4, n_head_kv=1,
                                   head_dim=256, sliding_window=512, tied_embeddings=True),
    # DeepSeek-V3's shape in miniature: 1 dense layer then MoE layers, q and kv through low-rank bottlenecks
    # (kv_lora_rank + rope = 160, a multiple of 32 so q8_0 / q4_0 caches apply, as V3's 512 + 64)
    "synth-deepseek2-tiny": ArchSynth("deepseek2", n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=1,
                                      head_dim=96, rope_dim=32, v_head_dim=64, kv_lora_rank=128, q_lora_rank=96,
                                      n_dense_lead=1, n_expert=8, n_expert_used=2, n_ff_exp=128, n_expert_shared=1),
    # DeepSeek-V2-Lite's attention (16 heads, kv_lora_rank 512, rope 64, nope 128, v 128, one attn_q) and MoE
    # layout (1 dense layer, then routed experts top-k with softmax gating and 2 shared experts), at half a billion
    "synth-deepseek2-500m": ArchSynth("deepseek2", n_layer=7, n_embd=1024, n_ff=2816, n_head=16, n_head_kv=1,
                                      head_dim=192, rope_dim=64, v_head_dim=128, kv_lora_rank=512, q_lora_rank=0,
                                      n_dense_lead=1, n_expert=32, n_expert_used=4, n_ff_exp=512, n_expert_shared=2,
                                      gating="softmax"),
}


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------

def _add_field(w, key: str, value, vtype) -> None:
    """One metadata field in the writer, with its exact GGUF type ((ARRAY, element type) for arrays)."""
    if isinstance(vtype, (tuple, list)):
        sub = vtype[-1] if len(vtype) > 1 else gguf.GGUFValueType.STRING
        vals = [str(x) for x in value] if sub == gguf.GGUFValueType.STRING else list(value)
        w.add_key_value(key, vals, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType(sub))
    elif vtype == gguf.GGUFValueType.BOOL:
        w.add_key_value(key, bool(value), vtype)
    else:
        w.add_key_value(key, value, gguf.GGUFValueType(vtype))


def _tensor_data(rng, name: str, shape_ne: tuple[int, ...], role: str):
    """Random data for one tensor (numpy shape = GGUF shape reversed). Matrices F16 with std 1/sqrt(ne0), so
    activations stay O(1) through the residual stream; norms 1; the delta net's decay ``ssm_a`` negative
    (a decay factor exp(a·softplus(·)) below 1) and its ``ssm_dt`` bias 0; routers and the conv kernel F32."""
    shape = tuple(reversed(shape_ne))
    if role == "matrix":
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape_ne[0])).astype(np.float16)
    if name.endswith(".ssm_a"):
        return -np.exp(rng.uniform(-1.0, 0.0, size=shape)).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return np.zeros(shape, dtype=np.float32)
    if name.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")):
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape_ne[0])).astype(np.float32)
    return np.ones(shape, dtype=np.float32)


def write_arch_synthetic(spec: ArchSynth, path: Path, progress: Callable[[int, int], None] | None = None) -> None:
    """Write ``spec`` as a GGUF with random F16 matrices (F32 norms, routers, conv kernels) and the default
    model's tokenizer. Tensors and metadata: :func:`v100lab.gguf.skeleton.tensor_layout` and ``arch_metadata``."""
    tok = tokenizer_fields()
    n_vocab = next(len(v) for k, v, _ in tok if k == "tokenizer.ggml.tokens")
    a = validate_arch(spec.arch_spec(n_vocab), spec.stem)
    layout = tensor_layout(a)
    rng = np.random.default_rng(spec.seed)
    w = gguf.GGUFWriter(str(path), spec.architecture)
    desc = f"v100lab synthetic model: random weights ({spec.description}); tokenizer of SmolLM2-135M"
    for key, value, vtype in arch_metadata(a, "F16", description=desc):
        if key != "general.architecture":          # the writer adds it
            _add_field(w, key, value, vtype)
    for key, value, vtype in tok:
        _add_field(w, key, value, vtype)
    for name, shape_ne, role in layout:
        n = 1
        for d in shape_ne:
            n *= d
        dtype = np.float16 if role == "matrix" else np.float32
        w.add_tensor_info(name, tuple(reversed(shape_ne)), np.dtype(dtype), n * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for done, (name, shape_ne, role) in enumerate(layout, 1):
        w.write_tensor_data(_tensor_data(rng, name, shape_ne, role))
        if progress:
            progress(done, len(layout))
    w.close()


def arch_synthetic_path(spec: ArchSynth, progress: Callable[[int, int], None] | None = None) -> Path:
    """The cached F16 file of ``spec``, built when absent or stale (same cache rules as the zoo's)."""
    path = cache_dir() / f"{spec.stem}-F16.gguf"
    recipe = {"kind": "synthetic-arch", "writer": ARCH_WRITER_VERSION, "spec": asdict(spec),
              "tokenizer_from": DEFAULT_DIST}
    return build_atomically(path, recipe, lambda tmp: write_arch_synthetic(spec, tmp, progress))


def arch_spec_of(spec: ArchSynth) -> dict:
    """The architecture spec of ``spec`` with the default model's vocabulary (for skeletons)."""
    return spec.arch_spec(tokenizer_vocab_size())


# --------------------------------------------------------------------------------------------
# does it run? (in a worker)
# --------------------------------------------------------------------------------------------

def generate(path, prompt: str = "The capital of France is", n_tokens: int = 8, n_ctx: int = 256,
             n_threads: int = 2) -> dict:
    """Load ``path`` in a llama.cpp worker, decode ``prompt`` and greedily generate ``n_tokens``.

    Returns {"n_prompt", "n_generated", "tokens", "text", "finite"}: ``finite`` is whether every logit of
    every step was a finite number (random weights must not overflow)."""
    return call_isolated(_generate_here, str(path), prompt, n_tokens, n_ctx, n_threads,
                         what=f"generating with {Path(path).name}")


def _generate_here(path: str, prompt: str, n_tokens: int, n_ctx: int, n_threads: int) -> dict:
    """The worker's side of :func:`generate` (llama.cpp's low-level API: batch decode, greedy argmax)."""
    import llama_cpp  # heavy: loaded only in the worker process

    model = ctx = batch = None
    with capture_llama_log():
        try:
            mparams = llama_cpp.llama_model_default_params()
            model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
            if not model:
                raise RunFailed(f"llama.cpp could not load {path}")
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = n_ctx
            cparams.n_batch = n_ctx
            cparams.n_threads = cparams.n_threads_batch = n_threads
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise RunFailed(f"llama.cpp refused a context for {path}")
            vocab = llama_cpp.llama_model_get_vocab(model)
            n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
            text = prompt.encode()
            buf = (llama_cpp.llama_token * (len(text) + 8))()
            n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
            if n <= 0:
                raise RunFailed(f"tokenizing the prompt failed ({n})")
            tokens = list(buf[:n])
            batch = llama_cpp.llama_batch_init(max(n, 1), 0, 1)
            finite = True
            out: list[int] = []
            pos = 0
            step = tokens
            for _ in range(n_tokens + 1):
                batch.n_tokens = len(step)
                for i, t in enumerate(step):
                    batch.token[i] = t
                    batch.pos[i] = pos + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = i == len(step) - 1
                rc = llama_cpp.llama_decode(ctx, batch)
                if rc != 0:
                    raise RunFailed(f"llama_decode returned {rc}")
                pos += len(step)
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
                finite = finite and bool(np.isfinite(logits).all())
                if len(out) == n_tokens:
                    break
                nxt = int(np.argmax(logits))
                out.append(nxt)
                step = [nxt]
            pieces = []
            for t in out:
                piece = ctypes.create_string_buffer(64)
                k = llama_cpp.llama_token_to_piece(vocab, t, piece, 64, 0, False)
                pieces.append(piece.raw[:max(k, 0)].decode("utf-8", "replace"))
        finally:
            if batch is not None:
                llama_cpp.llama_batch_free(batch)
            if ctx:
                llama_cpp.llama_free(ctx)
            if model:
                llama_cpp.llama_model_free(model)
    return {"n_prompt": len(tokens), "n_generated": len(out), "tokens": out, "text": "".join(pieces),
            "finite": finite}
