"""Probes of the decode cost's structure on pure synthetic rungs (issue 18, ninth round; benchmarks/RESULTS.md).

    .venv/bin/python benchmarks/probe_rungs.py rows [--types Q4_0,Q4_1]   # a row's cost: rows of 1024 and 512
    .venv/bin/python benchmarks/probe_rungs.py kv-heads   # attention vs KV heads: 12 query heads, 12/4/3/1 KV heads
    .venv/bin/python benchmarks/probe_rungs.py heads      # attention vs query heads: 8, 9 and 16 heads
    .venv/bin/python benchmarks/probe_rungs.py head-dim   # attention vs head_dim: 8 / 2 heads of 64, 128 and 256
    .venv/bin/python benchmarks/probe_rungs.py head-dim-96  # head_dim 64, 96, 128 on calib-wide96's matrices
    .venv/bin/python benchmarks/probe_rungs.py pp-width   # prompt cost per weight vs n_embd: 1024, 1536, 2048
    .venv/bin/python benchmarks/probe_rungs.py pp-attn    # prompt attention vs depth and head_dim, one set of matrices
    .venv/bin/python benchmarks/probe_rungs.py pp-rows    # prompt cost per weight at rows of 512 and 1024
    .venv/bin/python benchmarks/probe_rungs.py pp-twin    # the default model's prompt against its pure synthetic twin
    .venv/bin/python benchmarks/probe_rungs.py tg-width [--types Q8_0,Q6_K]  # decode per weight: synth-750m's layer vs calib-wide's
    .venv/bin/python benchmarks/probe_rungs.py kv-reuse   # decode attention vs depth: a KV head's cells in L2 or not
    .venv/bin/python benchmarks/probe_rungs.py tg-twin    # decode: the default model vs pure twins of its shape
    .venv/bin/python benchmarks/probe_rungs.py tg-size [--types Q8_0,Q4_0]  # decode per weight: a rung with 1x, 2x, 4x its layers
    .venv/bin/python benchmarks/probe_rungs.py tg-750m [--types Q8_0,Q6_K]  # decode per weight: synth-750m's mix vs pure twins

Each prints one JSON line per measurement (``calibration.measure``: warmup, then the median of 5 repetitions of
tg16; pp-width: 3 repetitions of pp512). The models are interleaved in each round, and a model's two depths
measured back to back, so that a phase of a shared VM falls on both sides of a contrast. Run on a quiet machine
(nothing else measuring).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

from v100lab.base import buildflags
from v100lab.measure import calibration
from v100lab.predict import rates, speed
from v100lab.models import zoo
from v100lab.measure.calibration import CALIB_WIDE, CALIB_WIDE512, measure, wide_spec
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.gguf.header import read_spec
from v100lab.predict.work import layer_matrices


def _emit(**row) -> None:
    print(json.dumps(row), flush=True)


def rows(rounds: int, types=("Q4_0", "Q4_1")) -> None:
    """Pure rungs that stream ~200 MB a token, rows of 1024 against 512, in ``types`` (default Q4_0, repacked on
    x86, and Q4_1, not; ``--types`` for others: Q4_K and Q2_K are repacked too on AVX-512, Q8_0 and Q6_K are not)."""
    paths = {}
    for ty in types:
        for name, base in (("w1024", CALIB_WIDE), ("w512", CALIB_WIDE512)):
            paths[(ty, name)] = calibration.pure_quantized_synthetic(wide_spec(ty, base), ty)
            w = calibration._single_device_work(read_spec(paths[(ty, name)]), RunConfig(), 8).weights[ty]
            _emit(rows_model=f"{ty}:{name}", weights=w.n_weights, rows=w.n_rows, bytes=w.n_bytes)
    for rnd in range(rounds):
        for th in (1, 2):
            for (ty, name), p in paths.items():
                m = measure(p, th, depth=0, n_gen=16, repetitions=5)
                _emit(round=rnd, type=ty, model=name, threads=th, ms=1e3 * m["tg"].s_per_token,
                      cv=round(m["tg"].cv, 3))


def _depth_pairs(paths: dict, depth: int, rounds: int) -> dict:
    """Each model at depth 0 and ``depth``, back to back, per round and thread count; returns
    {(model, threads): [ms at ``depth`` − ms at 0, one per round]}."""
    extra: dict = {}
    for rnd in range(rounds):
        for th in (2, 1):
            for name, path in paths.items():
                ms = {}
                for d in (0, depth):
                    m = measure(path, th, depth=d, n_gen=16, repetitions=5)
                    ms[d] = 1e3 * m["tg"].s_per_token
                    _emit(round=rnd, model=name, threads=th, depth=d, ms=ms[d], cv=round(m["tg"].cv, 3))
                extra.setdefault((name, th), []).append(ms[depth] - ms[0])
    return extra


def kv_heads(rounds: int) -> None:
    """Four models alike but for their KV heads (30 layers, n_embd 768, 12 query heads of 64, Q4_0), depth 0 and 3072."""
    specs = {f"kv{k}": zoo.SynthSpec(n_layer=30, n_embd=768, n_ff=1536, n_head=12, n_head_kv=k, n_ctx_train=8192,
                                     seed=7) for k in (12, 4, 3, 1)}
    _depth_pairs({k: calibration.pure_quantized_synthetic(s, "Q4_0") for k, s in specs.items()}, 3072, rounds)


def heads(rounds: int) -> None:
    """8, 9 and 16 query heads of 64 (calib-wide512, the default model, calib-wide's Q4_0 rung), depth 0 and 2048."""
    _depth_pairs({"w1024-16h-28L": calibration.pure_quantized_synthetic(wide_spec("Q4_0"), "Q4_0"),
                  "w512-8h-118L": calibration.pure_quantized_synthetic(wide_spec("Q4_0", CALIB_WIDE512), "Q4_0"),
                  "default-9h-30L": zoo.model_path("default")}, 2048, rounds)


def head_dim(rounds: int) -> None:
    """8 query / 2 KV heads of 64, 128 and 256 (n_embd 512, 1024, 2048; n_ff 2.75x), each deep enough to stream
    (:func:`calibration.wide_spec`), Q4_0, depth 0 and 2048: whether attention costs per multiply-add (a cost per
    cell × head × layer that doubles with head_dim) or per cell × head × layer (softmax and loop bookkeeping,
    the same whatever head_dim) — until the eleventh round calibration measured head_dims 64 and 96 only (now also
    128: calib-wide128), gemma3 has 256."""
    paths, ops = {}, {}
    for hd in (64, 128, 256):
        e = 8 * hd
        base = dataclasses.replace(CALIB_WIDE, n_embd=e, n_ff=e * 11 // 4, n_head=8, n_head_kv=2)
        spec = wide_spec("Q4_0", base)
        paths[f"hd{hd}-{spec.n_layer}L"] = calibration.pure_quantized_synthetic(spec, "Q4_0")
        w = calibration._single_device_work(read_spec(paths[f"hd{hd}-{spec.n_layer}L"]), RunConfig(n_ctx=4096), 2048)
        ops[f"hd{hd}-{spec.n_layer}L"] = (w.attn_ops, w.attn_head_cells, hd)
        _emit(head_dim_model=f"hd{hd}-{spec.n_layer}L", layers=spec.n_layer, attn_ops_d2048=w.attn_ops,
              head_cells_d2048=w.attn_head_cells, kv_bytes_d2048=w.kv_bytes)
    extra = _depth_pairs(paths, 2048, rounds)
    # attention's time from depth 0 to 2048 (the rounds' mean) per multiply-add and per head × cell × layer
    # (ops counted at depth 2048; tg16 decodes at 2048-2063)
    for (name, th), d_ms in extra.items():
        n_ops, n_cells, hd = ops[name]
        mean_s = sum(d_ms) / len(d_ms) / 1e3
        _emit(summary=name, threads=th, head_dim=hd, rounds=len(d_ms), ns_per_op=round(1e9 * mean_s / n_ops, 4),
              ns_per_head_cell=round(1e9 * mean_s / n_cells, 2))


def head_dim_96(rounds: int) -> None:
    """calib-wide96's matrices (n_embd 1536, Q4_0, deep enough to stream) with 24 / 6 heads of 64, 16 / 4 of 96
    (calib-wide96 itself) and 12 / 3 of 128, depth 0 and 2048: the same weights, the same KV cache (768 bytes a cell
    per layer) and the same multiply-adds a cell, only the query head × cells differ (24 : 16 : 12). On the AVX2
    build calibration's fit missed calib-wide96 at depth 2048 by 17-23 % at 1 thread while it fitted head_dims 64
    and 128 on n_embd 1024 (benchmarks/RESULTS.md, issue 18, eleventh and twelfth rounds): whether head_dim 96 costs
    more per head × cell (a kernel's tail: on AVX2 the F16 step is 32, so 96 has none) or attention on these wider
    matrices costs more whatever the head_dim (their KV cells are 768 bytes apart, not 512)."""
    paths, ops = {}, {}
    for n_head, hd in ((24, 64), (16, 96), (12, 128)):
        base = dataclasses.replace(calibration.CALIB_WIDE96, n_head=n_head, n_head_kv=n_head // 4)
        spec = wide_spec("Q4_0", base)
        name = f"w1536-hd{hd}-{spec.n_layer}L"
        paths[name] = calibration.pure_quantized_synthetic(spec, "Q4_0")
        w = calibration._single_device_work(read_spec(paths[name]), RunConfig(n_ctx=4096), 2048)
        ops[name] = (w.attn_ops, w.attn_head_cells, hd)
        _emit(head_dim_model=name, layers=spec.n_layer, attn_ops_d2048=w.attn_ops,
              head_cells_d2048=w.attn_head_cells, kv_bytes_d2048=w.kv_bytes)
    extra = _depth_pairs(paths, 2048, rounds)
    for (name, th), d_ms in extra.items():
        n_ops, n_cells, hd = ops[name]
        mean_s = sum(d_ms) / len(d_ms) / 1e3
        _emit(summary=name, threads=th, head_dim=hd, rounds=len(d_ms), ms_d0_to_d2048=round(1e3 * mean_s, 3),
              ns_per_op=round(1e9 * mean_s / n_ops, 4), ns_per_head_cell=round(1e9 * mean_s / n_cells, 2))


def _pp_per_weight_rounds(paths: dict, n_w: dict, rounds: int) -> None:
    """pp512 at depth 0 (3 repetitions) of each ``(type, n_embd)`` model in ``paths``, interleaved per round and thread
    count; prints tok/s and ps per layer weight (``n_w``) a prompt token."""
    for rnd in range(rounds):
        for th in (1, 2):
            for (ty, e), path in paths.items():
                m = measure(path, th, depth=0, n_gen=0, n_prompt=512, repetitions=3)
                _emit(round=rnd, type=ty, n_embd=e, threads=th, pp_tok_s=round(1 / m["pp"].s_per_token, 2),
                      ps_per_weight=round(1e12 * m["pp"].s_per_token / n_w[(ty, e)], 4), cv=round(m["pp"].cv, 3))


def pp_width(rounds: int) -> None:
    """Prompt processing (pp512, depth 0) per weight of CALIB_WIDE's 8 layers at n_embd 1024 (calibration's prompt
    rung, calib-wide-pp), 1536 (synth-750m's width) and 2048 (n_ff 2.75x, 16 query / 4 KV heads), pure Q4_K, Q6_K and
    Q4_0: whether the prompt's cost per weight depends on the matrices' width — calibration measures the prompt at
    n_embd 1024 only (and 256/384 in Q4_0), and the validation's synth-750m prompts came out 20-40 % slower than
    predicted in K-quants (benchmarks/RESULTS.md, issue 18, tenth round). ggml-cpu's mul_mat streams the whole
    quantized activation (512 tokens × a row, Q8_K for k-quants: ~0.6 MB at 1024, 0.9 at 1536, 1.1 at 2048)
    once per block of weight rows, so where it outgrows a core's L2 the weights' cost should rise."""
    paths, n_w = {}, {}
    for ty in ("Q4_K", "Q6_K", "Q4_0"):
        for e in (1024, 1536, 2048):
            spec = dataclasses.replace(CALIB_WIDE, n_embd=e, n_ff=e * 11 // 4)
            paths[(ty, e)] = (calibration.pure_quantized_path(zoo.synthetic_path(CALIB_WIDE), ty) if spec == CALIB_WIDE
                              else calibration.pure_quantized_synthetic(spec, ty))   # calib-wide-pp's own file
            n_w[(ty, e)] = sum(t.n_elements for t in layer_matrices(read_spec(paths[(ty, e)]), range(spec.n_layer)))
            _emit(pp_model=f"{ty}:w{e}", layer_weights=n_w[(ty, e)])
    _pp_per_weight_rounds(paths, n_w, rounds)


PP_ATTN_SHAPES = {64: CALIB_WIDE, 128: calibration.CALIB_WIDE128, 256: calibration.CALIB_WIDE256}


def pp_attn(rounds: int) -> None:
    """Prompt processing (pp512) of CALIB_WIDE's 8 layers in Q4_0 at depths 0, 1024 and 2048 with 16 query heads of
    64, 8 of 128 and 4 of 256 — one set of matrices (the query, key and value projections keep their sizes), so a
    contrast between two of them is attention alone: at one depth, the same multiply-adds on 1/2 or 1/4 of the
    query head × KV cells; at one head_dim, the causal triangle's cells grow with the depth. ggml-cpu's prompt
    attention is the tiled flash attention (ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_tiled:
    64 queries × 64 KV cells a tile, each tile's K and V converted to F32 once per query tile, softmax per query
    and cell), not decode's one query at a time; calibration's prompt fit pinned its attention on narrow models
    only (benchmarks/RESULTS.md, issue 18, twelfth round)."""
    paths = {}
    for hd, spec in PP_ATTN_SHAPES.items():
        paths[hd] = (calibration.pure_quantized_path(zoo.synthetic_path(CALIB_WIDE), "Q4_0") if spec == CALIB_WIDE
                     else calibration.pure_quantized_synthetic(spec, "Q4_0"))
        _emit(pp_model=f"hd{hd}", n_head=spec.n_head, n_head_kv=spec.n_head_kv)
    for rnd in range(rounds):
        for th in (1, 2):
            for hd, path in paths.items():
                for d in (0, 1024, 2048):
                    m = measure(path, th, depth=d, n_gen=0, n_prompt=512, repetitions=3)
                    _emit(round=rnd, head_dim=hd, threads=th, depth=d, pp_tok_s=round(1 / m["pp"].s_per_token, 2),
                          ms_per_token=round(1e3 * m["pp"].s_per_token, 4), cv=round(m["pp"].cv, 3))


def pp_rows(rounds: int) -> None:
    """Prompt processing (pp512, depth 0) per weight of CALIB_WIDE's 8 layers at n_embd 1024 (calib-wide-pp) and of
    CALIB_WIDE512's (n_embd 512, n_ff 1408, 8 heads of 64), pure Q4_0 (repacked on x86), Q4_1 and Q5_0 (not): after
    prompt attention was pinned on the wide matrices, the narrow validation models (n_embd 576 and 640) came out
    16-34 % too fast at 2 threads and within 2-16 % at 1 — whether a prompt's matmuls cost per row (per token) as
    well as per weight, and more so at 2 threads."""
    paths, n_w = {}, {}
    for ty in ("Q4_0", "Q4_1", "Q5_0"):
        for e, spec in ((1024, CALIB_WIDE), (512, dataclasses.replace(CALIB_WIDE512, n_layer=CALIB_WIDE.n_layer))):
            paths[(ty, e)] = (calibration.pure_quantized_path(zoo.synthetic_path(CALIB_WIDE), ty) if spec == CALIB_WIDE
                              else calibration.pure_quantized_synthetic(spec, ty))
            mats = list(layer_matrices(read_spec(paths[(ty, e)]), range(spec.n_layer)))
            n_w[(ty, e)] = sum(t.n_elements for t in mats)
            _emit(pp_model=f"{ty}:w{e}", layer_weights=n_w[(ty, e)], rows=sum(t.shape[1] for t in mats))
    _pp_per_weight_rounds(paths, n_w, rounds)


def pp_twin(rounds: int) -> None:
    """Prompt processing (pp512, depth 0) of the default model (SmolLM2-135M: 30 layers of n_embd 576, Q4_1) against
    a pure Q4_1 synthetic model of its shape (the same tokenizer's vocabulary) and against CALIB_WIDE's 8 layers
    in Q4_1 and a 30-layer version of them: whether what the prompt fit misses on the default model at 2 threads
    (benchmarks/RESULTS.md, issue 18, twelfth round) belongs to its shape, its layer count, or the real file."""
    twin = zoo.SynthSpec(n_layer=30, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3, n_ctx_train=4096, seed=5)
    deep = dataclasses.replace(CALIB_WIDE, n_layer=30)
    paths = {"default": zoo.model_path("default"), "twin": calibration.pure_quantized_synthetic(twin, "Q4_1"),
             "wide8": calibration.pure_quantized_path(zoo.synthetic_path(CALIB_WIDE), "Q4_1"),
             "wide30": calibration.pure_quantized_synthetic(deep, "Q4_1")}
    n_w = {}
    for name, path in paths.items():
        spec = read_spec(path)
        n_w[name] = sum(t.n_elements for t in layer_matrices(spec, range(spec.n_layer)))
        _emit(pp_model=name, layer_weights=n_w[name], n_layer=spec.n_layer)
    for rnd in range(rounds):
        for th in (1, 2):
            for name, path in paths.items():
                m = measure(path, th, depth=0, n_gen=0, n_prompt=512, repetitions=3)
                _emit(round=rnd, model=name, threads=th, pp_tok_s=round(1 / m["pp"].s_per_token, 2),
                      ps_per_weight=round(1e12 * m["pp"].s_per_token / n_w[name], 4), cv=round(m["pp"].cv, 3))


def tg_twin(rounds: int) -> None:
    """Decode (tg16, depth 0) of the default model (SmolLM2-135M: 30 layers of n_embd 576 in Q4_1, its tied output
    in Q8_0, ~105 MB a token) against a pure Q4_1 synthetic model of its shape (an output matrix of its own), the
    same with twice the layers (~200 MB a token, as calibration's rungs read) and CALIB_WIDE's rung in Q4_1, each
    beside the stored calibration's prediction: whether what the model misses on the default model (at 2 threads on
    a Zen 5, issue 18, seventeenth round) belongs to the real file, to its shape, or to the bytes a token reads."""
    twin = zoo.SynthSpec(n_layer=30, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3, n_ctx_train=4096, seed=5)
    paths = {"default": zoo.model_path("default"), "twin30": calibration.pure_quantized_synthetic(twin, "Q4_1"),
             "twin60": calibration.pure_quantized_synthetic(dataclasses.replace(twin, n_layer=60), "Q4_1"),
             "wide": calibration.pure_quantized_synthetic(wide_spec("Q4_1"), "Q4_1")}
    host = get_device("host")
    specs = {name: read_spec(p) for name, p in paths.items()}
    for name, spec in specs.items():
        w = calibration._single_device_work(spec, RunConfig(), 8)
        _emit(twin_model=name, n_layer=spec.n_layer, mb_a_token=round(sum(t.n_bytes for t in w.weights.values()) / 1e6, 1),
              rows=sum(t.n_rows for t in w.weights.values()), weights=sum(t.n_weights for t in w.weights.values()))
    for rnd in range(rounds):
        for th in (1, 2):
            for name, path in paths.items():
                m = measure(path, th, depth=0, n_gen=16, repetitions=5)
                pred = speed.predict(specs[name], [host], RunConfig(n_ctx=512, n_threads=th, n_gpu_layers=0),
                                     depth=8).tg_tps
                tps = 1 / m["tg"].s_per_token
                _emit(round=rnd, model=name, threads=th, tg_tok_s=round(tps, 2), predicted=round(pred, 2),
                      error=round(pred / tps - 1, 4), cv=round(m["tg"].cv, 3))


def _tg_per_weight_rounds(paths: dict, n_w: dict, rounds: int) -> dict:
    """Decode (tg16, depth 0, median of 5) of every model in each round, at 2 then 1 thread, back to back; returns
    {(type, threads, model): [ps per weight, one per round]} for ``paths`` {(type, model): path}."""
    per_weight: dict = {}
    for rnd in range(rounds):
        for th in (2, 1):
            for (ty, name), path in paths.items():
                m = measure(path, th, depth=0, n_gen=16, repetitions=5)
                ps = 1e12 * m["tg"].s_per_token / n_w[(ty, name)]
                per_weight.setdefault((ty, th, name), []).append(ps)
                _emit(round=rnd, type=ty, model=name, threads=th, tg_tok_s=round(1 / m["tg"].s_per_token, 2),
                      ps_per_weight=round(ps, 3), cv=round(m["tg"].cv, 3))
    return per_weight


#: synth-750m's layer (n_embd 1536, n_ff 4096, 16 query / 4 KV heads): the validation rows decode-weights miss most
TG_WIDTH_W1536 = dataclasses.replace(CALIB_WIDE, n_embd=1536, n_ff=4096)
TG_WIDTH_TYPES = ("Q4_0", "Q3_K", "Q4_K")


def _emit_per_weight_summary(per_weight: dict, types, reference: str, extra=None) -> None:
    """Per type and thread count, each model's ps per weight (the median of the rounds of
    :func:`_tg_per_weight_rounds`), its ratio to the ``reference`` model's, and ``extra(type, threads, medians)``'s
    keys where given."""
    for ty in types:
        for th in (1, 2):
            med = {name: statistics.median(v) for (t, h, name), v in per_weight.items() if t == ty and h == th}
            _emit(summary=ty, threads=th, ps_per_weight={k: round(v, 3) for k, v in med.items()},
                  **{f"vs_{reference}": {k: round(v / med[reference], 3) for k, v in med.items()}},
                  **(extra(ty, th, med) if extra else {}))


def tg_width(rounds: int, types=TG_WIDTH_TYPES) -> None:
    """Decode (tg16, depth 0) per weight of pure rungs in Q4_0 (repacked on x86), Q3_K and Q4_K (``--types`` for
    others: Q8_0 and Q6_K, which no x86 build repacks, are the AVX-512 build's misses on synth-750m): calibration's own
    rung (CALIB_WIDE's layer, deep enough to stream: :func:`calibration.wide_spec`), the same layer with twice the
    layers (the bytes a token of synth-750m, ~400 MB, on calib-wide's rows) and synth-750m's layer
    (:data:`TG_WIDTH_W1536`, rows of 1536 and 4096) deep enough to stream. synth-750m's Q3_K_M and Q4_0 decoded
    24-31 % slower at 2 threads than calibration's rates on calib-wide's rows predict, within 4 % at 1 thread
    (benchmarks/RESULTS.md, issue 18, fourteenth round): whether the weights of wider rows cost more per weight, or
    a token that reads twice the bytes does — each a contrast measured back to back in a round. On a Zen 3 neither
    did (fifteenth round): the rungs' speed moved more between the VM's phases than it differs here."""
    paths, n_w = {}, {}
    for ty in types:
        rung = wide_spec(ty)
        for name, spec in (("w1024", rung), ("w1024x2", dataclasses.replace(rung, n_layer=2 * rung.n_layer)),
                           ("w1536", wide_spec(ty, TG_WIDTH_W1536))):
            paths[(ty, name)] = calibration.pure_quantized_synthetic(spec, ty)
            w = calibration._single_device_work(read_spec(paths[(ty, name)]), RunConfig(), 8)
            n_w[(ty, name)] = w.n_weights
            _emit(width_model=f"{ty}:{name}", layers=spec.n_layer, weights=w.n_weights, rows=w.n_rows,
                  bytes=sum(tw.n_bytes for tw in w.weights.values()))
    # per type and thread count: each model's ps per weight (median of the rounds) against the calibration rung's,
    # and the stored calibration's prediction for each (w1024 is calibration's own rung: in-sample)
    host, calibrated = get_device("host"), rates.stored_calibration()

    def predicted_error(ty: str, th: int, med: dict) -> dict:
        if calibrated is None:  # an uncalibrated host's roofline is no prediction to judge
            return {"predicted_error": {name: "no calibration stored on this host" for name in med}}
        cfg = RunConfig(n_threads=th, n_gpu_layers=0)
        return {"predicted_error": {
            name: round(speed.predict(read_spec(paths[(ty, name)]), [host], cfg, depth=8).tg_tps
                        * 1e-12 * ps * n_w[(ty, name)] - 1, 3)
            for name, ps in med.items()}}

    _emit_per_weight_summary(_tg_per_weight_rounds(paths, n_w, rounds), types, "w1024", predicted_error)


TG_750M_TYPES = ("Q8_0", "Q6_K")


def tg_750m(rounds: int, types=TG_750M_TYPES) -> None:
    """Decode (tg16, depth 0) per weight of synth-750m as the validation decodes it (``synth-750m:TYPE``, llama.cpp's
    mix of that type) against a pure ``TYPE`` model of the same spec (``pure24``: every matrix, output included, in
    ``TYPE``) and synth-750m's layer as a rung (``w1536``: :data:`TG_WIDTH_W1536`, 8 layers, as tg-width has it).
    On the AVX-512 build synth-750m's depth-0 rows in Q8_0 and Q6_K were predicted 16-19 % too fast while its
    layer as a rung costs less a weight than calibration's (benchmarks/RESULTS.md, issue 18, twenty-second round):
    whether the file (its mix, its output and embedding) or its depth makes the difference, back to back in a round."""
    spec = zoo.SYNTH_PRESETS["synth-750m"]
    paths, n_w = {}, {}
    for ty in types:
        for name, path in (("mix", zoo.model_path(f"synth-750m:{ty}")),
                           ("pure24", calibration.pure_quantized_synthetic(spec, ty)),
                           ("w1536", calibration.pure_quantized_synthetic(wide_spec(ty, TG_WIDTH_W1536), ty))):
            paths[(ty, name)] = path
            w = calibration._single_device_work(read_spec(path), RunConfig(), 8)
            n_w[(ty, name)] = w.n_weights
            _emit(model_750m=f"{ty}:{name}", weights=w.n_weights, rows=w.n_rows,
                  bytes=sum(tw.n_bytes for tw in w.weights.values()),
                  weights_by_type={t: tw.n_weights for t, tw in w.weights.items()})
    _emit_per_weight_summary(_tg_per_weight_rounds(paths, n_w, rounds), types, "w1536")


TG_SIZE_TYPES = ("Q8_0", "Q4_0")
TG_SIZE_FACTORS = (1, 2, 4)


def tg_size(rounds: int, types=TG_SIZE_TYPES) -> None:
    """Decode (tg16, depth 0) per weight of calibration's own rung (:func:`calibration.wide_spec`, ~205 MB a token)
    against the same layer with 2x and 4x the layers (Q8_0: 365 and 676 MB; Q4_0: 383 and 738 MB): the same rows,
    the same kernels, only the bytes a token grow, past the last-level cache (480 MiB on the issue's Sapphire Rapids
    VM, shared with its neighbours). Whether a rung runs partly from that cache and so prices a model that streams
    from DRAM too cheaply: synth-750m (670 M weights, 712 MB a token in Q8_0) decoded 16-19 % slower than predicted
    there at both thread counts (benchmarks/RESULTS.md, issue 18, twentieth round). It did not (twenty-first round:
    the larger models cost 0-14 % less per weight). Back to back in each round."""
    _emit(llc_bytes=buildflags.last_level_cache_bytes())
    paths, n_w = {}, {}
    for ty in types:
        rung = wide_spec(ty)
        for k in TG_SIZE_FACTORS:
            spec = dataclasses.replace(rung, n_layer=k * rung.n_layer)
            paths[(ty, f"x{k}")] = calibration.pure_quantized_synthetic(spec, ty)
            w = calibration._single_device_work(read_spec(paths[(ty, f"x{k}")]), RunConfig(), 8)
            n_w[(ty, f"x{k}")] = w.n_weights
            _emit(size_model=f"{ty}:x{k}", layers=spec.n_layer, weights=w.n_weights,
                  bytes=sum(tw.n_bytes for tw in w.weights.values()))
    _emit_per_weight_summary(_tg_per_weight_rounds(paths, n_w, rounds), types, "x1")


KV_REUSE_DEPTHS = (0, 1024, 2048, 3072, 4096)


def kv_reuse(rounds: int) -> None:
    """Decode attention's cost per cell against depth, 0-4096, on calibration's three attention rungs (28 layers in
    :data:`calibration.DEPTH_TYPE`, every matrix calib-wide's, the same multiply-adds a cell): 16 query / 4 KV
    heads of 64 (calib-wide), 8 / 2 of 128 (calib-wide128) and 4 / 1 of 256 (CALIB_WIDE256's heads). ggml-cpu's
    decode flash attention (ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk) takes the query heads in
    order, so the GQA group's query heads read one KV head's K and V rows one after the other: the group re-reads
    depth × (d_k + d_v) × 2 bytes, from a core's L2 while they fit in it and from L3 or DRAM once they do not. At
    1 thread on a Zen 3 (L2 1 MiB) the Q4_0 rung's attention cost twice as much a cell past depth 2048 as below it
    (benchmarks/RESULTS.md, issue 18, fifteenth round): that working set is 0.5 MiB at 2048 and 1 MiB at 4096 for
    heads of 64, twice that for 128 and four times for 256. If the L2 is what changes, the three rungs' costs a
    cell step up at depths in the ratio 4 : 2 : 1. Each model's depths are measured back to back in a round, the
    filled contexts kept for the next round and thread count (calibration's depth_states). On that Zen 3 neither the
    heads of 128 nor of 256 stepped up where theirs overflow L2 (sixteenth round): not the reason."""
    dt = calibration.DEPTH_TYPE
    bases = {"hd64": CALIB_WIDE, "hd128": calibration.CALIB_WIDE128, "hd256": calibration.CALIB_WIDE256}
    paths = {}
    for name, base in bases.items():
        spec = wide_spec(dt, base)
        paths[name] = calibration.pure_quantized_synthetic(spec, dt)
        hd = spec.n_embd // spec.n_head
        _emit(kv_reuse_model=name, layers=spec.n_layer, n_head=spec.n_head, n_head_kv=spec.n_head_kv, head_dim=hd,
              group_bytes_per_cell=2 * hd * 2)
    ms: dict = {}
    with calibration.kept_fills() as states:
        for rnd in range(rounds):
            for th in (2, 1):            # the first round's fills at 2 threads, kept for 1: half the time
                for name, path in paths.items():
                    for d in KV_REUSE_DEPTHS:
                        m = measure(path, th, depth=d, n_gen=16, repetitions=3, depth_states=states)
                        ms.setdefault((name, th, d), []).append(1e3 * m["tg"].s_per_token)
                        _emit(round=rnd, model=name, threads=th, depth=d, ms=round(1e3 * m["tg"].s_per_token, 2),
                              cv=round(m["tg"].cv, 3))
    # per model and thread count: ms a token per 1024 cells between successive depths (the rounds' medians), and
    # the GQA group's K and V bytes at the deeper end
    for name, path in paths.items():
        hd = wide_spec(dt, bases[name]).n_embd // bases[name].n_head
        for th in (1, 2):
            med = [statistics.median(ms[(name, th, d)]) for d in KV_REUSE_DEPTHS]
            steps = {f"{a}-{b}": round((mb - ma) * 1024 / (b - a), 2)
                     for a, b, ma, mb in zip(KV_REUSE_DEPTHS, KV_REUSE_DEPTHS[1:], med, med[1:])}
            _emit(summary=name, threads=th, ms=[round(x, 2) for x in med], ms_per_1024_cells=steps,
                  group_kib_at={b: 4 * hd * b // 1024 for b in KV_REUSE_DEPTHS[1:]})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("probe", choices=("rows", "kv-heads", "heads", "head-dim", "head-dim-96", "pp-width", "pp-attn",
                                      "pp-rows", "pp-twin", "tg-width", "kv-reuse", "tg-twin", "tg-size", "tg-750m"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--types", default="", help="rows, tg-width, tg-size, tg-750m: comma-separated weight types "
                                               "(default Q4_0,Q4_1; Q4_0,Q3_K,Q4_K; Q8_0,Q4_0; Q8_0,Q6_K)")
    args = ap.parse_args(argv)
    typed = {"rows": rows, "tg-width": tg_width, "tg-size": tg_size, "tg-750m": tg_750m}  # the probes --types sets
    types = tuple(t.strip() for t in args.types.split(",") if t.strip())
    if args.probe in typed and types:
        typed[args.probe](args.rounds, types)
        return 0
    {"rows": rows, "kv-heads": kv_heads, "heads": heads, "head-dim": head_dim, "head-dim-96": head_dim_96,
     "pp-width": pp_width, "pp-attn": pp_attn, "pp-rows": pp_rows, "pp-twin": pp_twin,
     "tg-width": tg_width, "kv-reuse": kv_reuse, "tg-twin": tg_twin, "tg-size": tg_size,
     "tg-750m": tg_750m}[args.probe](args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
