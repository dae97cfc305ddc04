"""Batched decode and serving predictions (v100lab.predict.serving): structure and the model's own logic; no speed
asserted as a fact about any machine."""

from __future__ import annotations

import json

import pytest

from v100lab.predict import serving, speed
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError
from v100lab.gguf.skeleton import skeleton_spec


@pytest.fixture(scope="module")
def qwen27():
    return skeleton_spec("qwen35-27b", "Q4_K_M")


@pytest.fixture(scope="module")
def llama7b():
    return skeleton_spec("llama2-7b", "Q4_0")


def test_batch_of_one_is_the_single_stream_prediction(llama7b):
    for dev in ("v100-16gb", "rtx-4090"):
        cfg = RunConfig(n_ctx=4096)
        one = serving.predict_batch(llama7b, dev, cfg, 1, depth=300)
        assert one.t_step_s == pytest.approx(1.0 / speed.predict(llama7b, dev, cfg, depth=300).tg_tps, rel=1e-9)
        assert one.aggregate_tps == one.per_sequence_tps == pytest.approx(one.single_tg_tps)


def test_weights_once_kv_per_sequence(llama7b):
    cfg = RunConfig(n_ctx=8192, n_parallel=16)
    preds = [serving.predict_batch(llama7b, "v100-16gb", cfg, b, depth=1000) for b in (1, 2, 4, 8, 16, 64)]
    for a, b in zip(preds, preds[1:]):
        assert b.t_step_s >= a.t_step_s and b.aggregate_tps > a.aggregate_tps
        assert b.per_sequence_tps <= a.per_sequence_tps
        assert b.t_kv_s / b.batch == pytest.approx(a.t_kv_s / a.batch)     # each sequence its own KV
    assert preds[1].t_weights_s == pytest.approx(preds[0].t_weights_s)     # memory-bound: read once
    # below the compute-bound batch the weights cost the same; above it they grow with B
    cb = preds[0].compute_bound_batch
    assert cb and 2 < cb < 64
    assert preds[0].bound in ("memory", "overhead")
    # 64 KV caches of 1000 tokens, with a slot per sequence (64 slots of 1024 cells), outweigh the weights' compute
    # (with cfg's 16 slots of 512 cells the KV read is capped and, under the CUDA class fitted on published rows,
    # rates.fit_cuda_rows, costs about as much as the weights' compute at B = 64)
    slots64 = RunConfig(n_ctx=65536, n_parallel=64)
    assert serving.predict_batch(llama7b, "v100-16gb", slots64, 64, depth=1000).bound == "memory"
    short = serving.predict_batch(llama7b, "v100-16gb", cfg, 64, depth=0)
    assert short.bound == "compute"
    assert preds[-1].t_weights_s > preds[0].t_weights_s
    json.dumps(preds[-1].as_dict(), allow_nan=False)


def test_serving_closed_loop_and_queueing(qwen27):
    cfg = RunConfig(n_ctx=16384, n_parallel=4, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on")
    p1 = serving.predict_serving(qwen27, "v100-16gb", cfg, 1, 512, 128)
    p4 = serving.predict_serving(qwen27, "v100-16gb", cfg, 4, 512, 128)
    p8 = serving.predict_serving(qwen27, "v100-16gb", cfg, 8, 512, 128)
    assert p1.batch.batch == 1 and p4.batch.batch == 4 and p8.batch.batch == 4   # at most n_parallel decode
    assert p4.output_throughput > p1.output_throughput
    assert p8.output_throughput == pytest.approx(p4.output_throughput)
    assert p1.queue_ms == p4.queue_ms == 0 and p8.queue_ms > 0 and p8.ttft_ms > p4.ttft_ms
    assert p4.tpot_ms > p1.tpot_ms                  # others' prompts stall this stream, and a bigger step
    assert p1.e2el_ms == pytest.approx(p1.ttft_ms + 127 * p1.tpot_ms)
    # one stream: output tok/s is G over the request's whole life (TTFT included)
    assert p1.output_throughput == pytest.approx(128 / (p1.e2el_ms / 1e3), rel=1e-6)
    json.dumps(p8.as_dict(), allow_nan=False)


def test_lockstep_closed_loop(llama7b):
    """Equal requests started at once: B prompts in one batch, then B sequences decode uninterrupted."""
    cfg = RunConfig(n_ctx=8192, n_parallel=4)
    t = serving.predict_serving(llama7b, "v100-16gb", cfg, 4, 256, 64, phases="together")
    s = serving.predict_serving(llama7b, "v100-16gb", cfg, 4, 256, 64, phases="staggered")
    assert t.tpot_ms == pytest.approx(t.batch.t_step_s * 1e3) and t.ttft_ms == pytest.approx(4 * t.t_pp_s * 1e3)
    assert t.output_throughput == pytest.approx(s.output_throughput)     # same work per cycle
    assert s.tpot_ms > t.tpot_ms and s.ttft_ms < t.ttft_ms
    with pytest.raises(ConfigError):
        serving.predict_serving(llama7b, "v100-16gb", cfg, 4, 256, 64, phases="random")


def test_compare_levels_and_errors(llama7b):
    cfg = RunConfig(n_ctx=4096, n_parallel=2)
    pred = serving.predict_serving(llama7b, "v100-16gb", cfg, 2, 64, 16, phases="together")
    levels = [{"level": "c2", "concurrency": 2, "output_throughput": pred.output_throughput / 1.1,
               "tpot_ms_median": pred.tpot_ms, "ttft_ms_median": None},
              {"level": "rate:1/s", "concurrency": None}]
    rows = serving.compare_levels(llama7b, "v100-16gb", cfg, levels, 64, 16)
    assert len(rows) == 1 and rows[0]["output_tps_error"] == pytest.approx(0.1)
    assert rows[0]["tpot_ms_error"] == pytest.approx(0.0) and rows[0]["ttft_ms_error"] is None
    assert serving.median_abs_error(rows, "output_tps") == pytest.approx(0.1)
    assert "median |error|" in serving.format_comparison(rows)


@pytest.mark.parametrize("kw", [{"batch": 0}, {"batch": 1.5}, {"batch": True}])
def test_bad_batch(llama7b, kw):
    with pytest.raises(ConfigError):
        serving.predict_batch(llama7b, "v100-16gb", RunConfig(), **kw)


def test_bad_serving_input(llama7b):
    with pytest.raises(ConfigError):
        serving.predict_serving(llama7b, "v100-16gb", RunConfig(), concurrency=0)


# ---- batched decode measured on a CPU (calibrate_batching) ------------------------------------------

def _cpu():
    from v100lab.facts.devices import Device

    return Device(id="testcpu", name="test CPU", kind="cpu", memory_gib=64, bandwidth_gbs=20)


CURVES = {"version": 1, "threads": {"2": {"curves": {"Q4_0": {"1": 1.0, "2": 1.8, "4": 3.2, "8": 5.0},
                                                     "F16": {"1": 1.0, "2": 1.2, "4": 1.5, "8": 2.0}}}}}


def test_curve_interpolation_and_nearest_type():
    curves = serving.batching_curves(CURVES, threads=3)          # the nearest thread count: 2
    assert curves["Q4_0"][2] == 1.8
    assert serving.curve_ratio(curves, "Q4_0", 1) == 1.0
    assert serving.curve_ratio(curves, "Q4_0", 4) == pytest.approx(3.2)
    assert 1.8 < serving.curve_ratio(curves, "Q4_0", 3) < 3.2
    assert serving.curve_ratio(curves, "Q4_0", 16) == pytest.approx(5.0 + 8 * (5.0 - 3.2) / 4)   # linear past 8
    assert serving.curve_ratio(curves, "Q4_1", 4) == pytest.approx(3.2)    # nearest bits per weight: Q4_0
    assert serving.batching_curves({}, 2) is None and serving.batching_curves({"threads": {"2": "x"}}, 2) is None


def test_cpu_batch_uses_the_measured_curve(llama7b):
    cfg = RunConfig(n_ctx=4096, n_parallel=8, n_threads=2)
    one = serving.predict_batch(llama7b, _cpu(), cfg, 1, depth=0, batching=CURVES)
    assert one.t_step_s == pytest.approx(1.0 / speed.predict(llama7b, _cpu(), cfg, depth=0).tg_tps, rel=1e-9)
    four = serving.predict_batch(llama7b, _cpu(), cfg, 4, depth=0, batching=CURVES)
    assert four.t_weights_s > 2.5 * one.t_weights_s and not four.notes
    roof = serving.predict_batch(llama7b, _cpu(), cfg, 4, depth=0, batching={})
    assert roof.notes and "roofline" in roof.notes[0]


def test_calibrate_batching_reads_llama_batched_bench(tmp_path, monkeypatch):
    """The calibration run and its parsing, with a stand-in for llama-batched-bench (the real one is slow)."""
    from v100lab.measure import calibration

    fake = tmp_path / "llama-batched-bench"
    fake.write_text("#!/bin/sh\nfor pl in 1 2 4; do\n"
                    "  echo \"{\\\"pl\\\": $pl, \\\"tg\\\": 10, \\\"t_tg\\\": $(( pl + 1 )).0}\"\ndone\n"
                    "echo 'not json'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(calibration, "calibration_model_paths",
                        lambda progress=None, retired=True, **kw: {("calib-wide", "Q4_0"): tmp_path / "m.gguf",
                                               ("calib-deep", "F16"): tmp_path / "d.gguf"})
    monkeypatch.setenv("V100LAB_CACHE", str(tmp_path / "cache"))
    res = calibration.calibrate_batching(threads=[2], batches=(1, 2, 4), n_gen=10, repetitions=1, binary=fake)
    assert res["threads"]["2"]["curves"] == {"Q4_0": {"1": 1.0, "2": 1.5, "4": 2.5}}
    assert res["threads"]["2"]["step_ms"]["Q4_0"]["1"] == pytest.approx(200.0)
    assert serving.stored_batching()["threads"]["2"]["curves"]["Q4_0"]["4"] == 2.5
    bad = tmp_path / "crash"
    bad.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    bad.chmod(0o755)
    from v100lab.base.errors import RunFailed

    with pytest.raises(RunFailed, match="no weight type"):
        calibration.calibrate_batching(threads=[2], batches=(1, 2), n_gen=4, repetitions=1, binary=bad, store=False)
