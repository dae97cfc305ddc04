"""Notebook 14, the build: what the llama.cpp build changes. On this CPU: the SIMD level the library was compiled
for against the one the CPU has, the weight types the CPU backend repacks on that build, and the cost of
de-quantizing each weight type in decode against the time its bytes take at the bandwidth (why a CPU decode
here is compute-bound); the decode speed of the measured model's quant ladder (the rungs notebook 04 builds),
measured beside the prediction. On a GPU: the CUDA architecture and toolkit :func:`v100lab.base.cudabuild.plan_build`
picks for the scenario's card, and the decode speed a CUDA build gives against a CPU-only one — measured where
this machine has a CUDA build, predicted otherwise, with the reason.

Nothing here compiles: a build that is not installed is described from its flags and predicted, never made.
"""

from __future__ import annotations

import re
from dataclasses import replace

from v100lab.base import buildflags, cudabuild
from v100lab.base.errors import ConfigError
from v100lab.facts.results import Observation, compare
from v100lab.gguf.llama_context import type_sizef
from v100lab.measure import harness
from v100lab.measure.harness import environment
from v100lab.models.resolve import resolve
from v100lab.predict import rates
from v100lab.predict.memory import REPACK_TYPES
from v100lab.workbook.levers.captions import _caption
from v100lab.workbook.levers.steps import (HOST, conditions, ctx_for, gpu_backend, gpu_host, gpu_subject, lever_frame,
                                           loading_study, measured_rows, parameters, predict_rows, spec_at_quant,
                                           stage_model, study, threads_text)
from v100lab.workbook.levers.summaries import _failures_line
from v100lab.workbook.levers.text import fmt, markdown, md, pct
from v100lab.workbook.scenario import Scenario

PARAMETERS = parameters("compare_gpu", "n_threads", "quants", "n_gen", "repetitions")

#: the weight types shown when the host has no calibration (bandwidth only), highest bits per weight first
SHOWN_TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q4_1", "Q4_K", "Q4_0", "Q3_K", "Q2_K")
#: SIMD levels of an x86 build, highest first: the CMake option that turns each on and the cpuinfo flag it needs
SIMD_LEVELS = (("AVX-512", "GGML_AVX512", "avx512f"), ("AVX2", "GGML_AVX2", "avx2"), ("AVX", "GGML_AVX", "avx"),
               ("SSE4.2", "GGML_SSE42", "sse4_2"))
#: the driver branches a card is described with when no nvidia-smi answers for it: CUDA 13.0 (580) and 12.2 (535)
ASSUMED_DRIVERS = ("580.95.05", "535.274.02")
#: a CUDA 12 toolkit a machine may have (NVIDIA's cuda-toolkit-12-9), for the plans that ask what one would change
MACHINE_CUDA12 = cudabuild.Toolkit((12, 9), "/usr/local/cuda-12.9/bin/nvcc", "/usr/local/cuda-12.9", "machine")
PS = 1e12
LEVER_BUILD = "build"
#: rungs of the ladder decoded here (the rest predicted): the model's own and one for the repacked contrast
MEASURED_RUNGS = 2


# ----------------------------------------------------------------------------------------------- this CPU's build
def simd_level(cpu_flags) -> str:
    """The highest x86 SIMD level ``cpu_flags`` (cpuinfo flags) allow: AVX-512, AVX2, AVX, SSE4.2 or none."""
    flags = set(cpu_flags)
    return next((name for name, _, flag in SIMD_LEVELS if flag in flags), "none")


def compiled_level(cmake_args: str | None, cpu_flags=()) -> str:
    """The SIMD level a build's flags compile for: the highest option named ON (a native build: the CPU's)."""
    args = cmake_args or ""
    if buildflags.option_on(args, "GGML_NATIVE") is not False:
        return simd_level(cpu_flags) + " (native: the CPU's own)"
    return next((name for name, option, _ in SIMD_LEVELS if buildflags.option_on(args, option)), "none")


def _left_off(cmake_args: str | None, cpu_flags) -> list[str]:
    """x86 options whose features the CPU has but the build names OFF (AMX aside: off on purpose)."""
    flags = set(cpu_flags)
    return [opt for opt, needs in buildflags.X86_OPTIONS
            if all(f in flags for f in needs) and buildflags.option_on(cmake_args or "", opt) is False]


def build_facts(sc: Scenario):
    """This machine's CPU and the llama.cpp build in use, as a table: the CPU's SIMD features and level, the
    recorded build flags and the level they compile for, what the build leaves off, llama.cpp's system-info line,
    the weight types repacked, the GPU backend, and whether the host calibration was made with this build."""
    import pandas as pd  # heavy third-party dependency

    cpu = buildflags.host_cpu()
    rec = buildflags.read_record()
    args = rec.get("cmake_args")
    env = environment(sc.run_config())
    off = _left_off(args, cpu.flags)
    cal = rates.stored_calibration() or {}
    made = (cal.get("build") or {})
    now = rates.current_build_facts()["build"]
    same = made.get("ggml_cpu_sha256") == now.get("ggml_cpu_sha256") if made else None
    rows = [("CPU", cpu.model, f"{env.get('cpu_count') or '?'} cores"),
            ("its SIMD features", " ".join(cpu.relevant_flags) or "?", "/proc/cpuinfo"),
            ("its highest SIMD level", simd_level(cpu.flags), ""),
            ("build flags", args or "not recorded (llama-cpp-python installed by hand?)",
             {"safe": "the safe flags for this CPU (AMX off)", "user": "your CMAKE_ARGS", "cuda": "a CUDA build",
              "native": "llama.cpp's -march=native"}.get(rec.get("source") or "", "")),
            ("SIMD level compiled", compiled_level(args, cpu.flags), "GGML_AVX512 / GGML_AVX2 / …"),
            ("features the CPU has, left off", ", ".join(off) or "none", "AMX is always off (llama.cpp #20824)"),
            ("llama.cpp system info", env.get("system_info") or "?", "llama_print_system_info()"),
            ("f16 SIMD step (elements)", str(buildflags.f16_simd_step(args, cpu.flags)), "simd-mappings.h"),
            ("weight types repacked", ", ".join(sorted(REPACK_TYPES)) or "none",
             "repack.cpp, ggml_repack_get_optimal_repack_type"),
            ("GPU backend", gpu_backend() or "none (a CPU-only build)", rec.get("gpu") or "ggml devices"),
            ("host calibration made with", "this build" if same else "another build: remake it (v100lab calibrate)"
             if same is False else "no calibration here", made.get("system_info") or "")]
    return pd.DataFrame(rows, columns=["fact", "value", "note"])


def _variant(args: str, **options: bool) -> str:
    """``args`` with each named option set ON/OFF (added when absent)."""
    out = args.split()
    for opt, on in options.items():
        flag = f"-D{opt}={'ON' if on else 'OFF'}"
        out = [a for a in out if not a.startswith(f"-D{opt}=")] + [flag]
    return " ".join(out)


def simd_builds(sc: Scenario):
    """The safe build against an AVX2-only and an AVX-512 one, from their flags: whether each runs on this CPU,
    its SIMD level, f16 step and repacked weight types, and whether its speed is measured here (only the build
    installed is; nothing is compiled) — with the reason when it is not."""
    import pandas as pd  # heavy third-party dependency

    cpu = buildflags.host_cpu()
    rec = buildflags.read_record()
    safe = " ".join(buildflags.host_cmake_args())
    in_use = rec.get("cmake_args") or safe
    avx512_parts = ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")
    variants = (("safe (this CPU's features)", safe),
                ("AVX2-only (-DGGML_AVX512=OFF)", _variant(safe, **{o: False for o in avx512_parts})),
                ("AVX-512 (-DGGML_AVX512=ON)", _variant(safe, GGML_AVX2=True, GGML_AVX512=True)))
    rows = []
    for name, args in variants:
        missing = [f for opt, needs in buildflags.X86_OPTIONS if buildflags.option_on(args, opt) for f in needs
                   if f not in cpu.flags]
        runs = "yes" if not missing else f"no: the CPU lacks {' '.join(sorted(set(missing)))}"
        types = buildflags.repack_types(args, cpu.flags, "x86_64")
        if _same_flags(args, in_use):
            speed = "measured: the build in use" + ("" if args == safe else " (the same flags as the safe build here)")
        elif missing:
            speed = "cannot run here"
        else:
            speed = ("not installed here, so not measured; its per-type costs would need their own calibration "
                     f"(CMAKE_ARGS=\"{_diff(args, in_use)}\" scripts/setup.sh makes it)")
        rows.append((name, runs, compiled_level(args, cpu.flags), str(buildflags.f16_simd_step(args, cpu.flags,
                                                                                                 "x86_64")),
                     ", ".join(sorted(types)) or "none", speed))
    return pd.DataFrame(rows, columns=["build", "runs on this CPU", "SIMD", "f16 step", "repacked types",
                                       "speed here"])


def _flags(args: str) -> dict[str, bool]:
    return {m.split("=")[0][2:]: buildflags.option_on(args, m.split("=")[0][2:]) for m in args.split()
            if m.startswith("-D") and "=" in m}


def _same_flags(a: str, b: str) -> bool:
    return _flags(a) == _flags(b)


def _diff(args: str, base: str) -> str:
    """The options of ``args`` that ``base`` sets otherwise, as flags."""
    fa, fb = _flags(args), _flags(base)
    return " ".join(f"-D{k}={'ON' if v else 'OFF'}" for k, v in fa.items() if fb.get(k) != v)


# ----------------------------------------------------------------------------------- de-quantization per type
def host_rates(sc: Scenario):
    """The host's decode rates at the scenario's threads (its calibration, or stated assumptions)."""
    return rates.rates_for(study(sc).host, sc.run_config())


def decode_bandwidth_gbs(sc: Scenario) -> float:
    """GB/s the speed model lets decode read weights at on this machine (what a weight's bytes cost in time)."""
    return host_rates(sc).effective_bandwidth / 1e9


def dequant_costs(sc: Scenario):
    """Per weight type, on this machine at the scenario's threads: the decode cost per weight from the host
    calibration (de-quantizing and multiplying; ``compute_ps_per_weight``) beside the time the weight's bytes take
    at the bandwidth decode reads at (``memory_ps_per_weight``), in picoseconds; the ``bound`` column says which is
    larger, the note whether this build repacks the type. Lever "weight_type". Without a calibration only the
    bandwidth rows, and ``why_not_calibrated`` says why."""
    st = study(sc)
    r = host_rates(sc)
    calibrated = dict(r.tg_s_per_weight)
    types = sorted(calibrated or SHOWN_TYPES, key=type_sizef, reverse=True)
    bw = r.effective_bandwidth
    rows = []
    for t in types:
        mem = type_sizef(t) / bw * PS
        comp = calibrated.get(t)
        repacked = "repacked on this build" if t in REPACK_TYPES else "not repacked on this build"
        bound = "" if comp is None else ("compute" if comp * PS > mem else "memory")
        label = "per weight, this machine"
        rows.append(Observation(label, t, HOST, "weight_type", t, "memory_ps_per_weight", mem, "ps", "predicted",
                                note=f"{8 * type_sizef(t):.2f} bits at {bw / 1e9:.1f} GB/s; {repacked}", bound=bound))
        if comp is not None:
            rows.append(Observation(label, t, HOST, "weight_type", t, "compute_ps_per_weight", comp * PS, "ps",
                                    "predicted", note=f"calibrated ({r.source}); {repacked}", bound=bound))
    why = "" if calibrated else (f"this machine has no calibration ({r.source}): only the bandwidth side is "
                                 "known; `v100lab calibrate` measures the cost per type")
    spec = st.measured_spec or st.spec
    used = sorted({t.type_name.upper() for t in spec.tensors if len(t.shape) >= 2 and t.layer is not None}
                  & set(types))
    return lever_frame(rows, why_not_calibrated=why, bandwidth_gbs=bw / 1e9, threads=r.threads,
                       model_types=used, model_label=st.measured_label or st.label,
                       conditions=f"decode on this machine · {threads_text(sc.n_threads)} "
                                  f"({r.threads} in the rates) · {r.source}")


def cost_ratio(costs, type_name: str) -> float | None:
    """Compute ÷ memory time per weight of ``type_name`` in a :func:`dequant_costs` frame (None: not calibrated)."""
    c = compare(costs, ("value", "metric"))
    comp = c[(c["value"] == type_name) & (c["metric"] == "compute_ps_per_weight")]["predicted"]
    mem = c[(c["value"] == type_name) & (c["metric"] == "memory_ps_per_weight")]["predicted"]
    return float(comp.iloc[0] / mem.iloc[0]) if len(comp) and len(mem) else None


def caption_dequant(sc: Scenario, costs):
    """Under the per-type costs: which types are compute-bound, by how much, and the repacked ones."""
    if costs.attrs.get("why_not_calibrated"):
        return _caption(md("{why}.", why=costs.attrs["why_not_calibrated"]))
    ratios = {t: cost_ratio(costs, t) for t in dict.fromkeys(costs["value"])}
    comp = [t for t, x in ratios.items() if x and x > 1]
    worst = max(ratios, key=lambda t: ratios[t] or 0)
    rep = [t for t in ratios if t in REPACK_TYPES]
    out = [md("{n} of {m} types cost more time de-quantizing than reading ({types}); the most, {w}, "
              "{x}× its bandwidth time.", n=len(comp), m=len(ratios), types=", ".join(comp) or "none", w=worst,
              x=f"{ratios[worst]:.1f}")]
    if rep:
        out.append(md("Repacked on this build: {r} — {rr}.", r=", ".join(rep),
                      rr=", ".join(f"{t} {ratios[t]:.2f}×" for t in rep if ratios[t])))
    for t in costs.attrs.get("model_types") or []:
        if ratios.get(t):
            out.append(md("The measured model's {t} weights: {x}× ({b}-bound).", t=t, x=f"{ratios[t]:.2f}",
                          b="compute" if ratios[t] > 1 else "memory"))
    return _caption(*out)


# ------------------------------------------------------------------------------------- decode per quant, measured
def _ladder(sc: Scenario) -> list[str]:
    st = study(sc)
    own = (st.measured_spec or st.spec).file_type.upper()
    return list(dict.fromkeys([own] + [q.upper() for q in sc.quants]))


def base_type(quant: str) -> str:
    """The weight type a llama-quantize mix is named after: Q4_K_M → Q4_K, Q4_0 → Q4_0."""
    return re.sub(r"_[SMLX]+$", "", quant.upper())


def measured_rungs(sc: Scenario) -> list[str]:
    """The rungs decoded here, at most :data:`MEASURED_RUNGS`: the model's own quant, then the contrast the lesson
    is about, kept short — a quant of ``quants`` whose type this build repacks when the own one is not (a single
    type first), else the first that is not repacked."""
    ladder = _ladder(sc)
    own, rest = ladder[0], ladder[1:]
    own_repacked = base_type(own) in REPACK_TYPES
    # a single type (Q4_0) before a mix named after one (Q4_K_M keeps some tensors in Q6_K)
    other = next((q for q in sorted(rest, key=lambda q: base_type(q) != q)
                  if (base_type(q) in REPACK_TYPES) != own_repacked), None)
    return [q for q in dict.fromkeys([own, other] + rest) if q][:MEASURED_RUNGS]


def decode_ladder(sc: Scenario):
    """Decode (tg``n_gen``) of the measured model at its own quant and at each quant of ``quants`` (the rungs
    notebook 04's quality ladder builds: ``default:Q8_0``, …) predicted with the host calibration beside the
    bandwidth ceiling — the ``bound`` of each prediction says what limits it — and :func:`measured_rungs` of them
    measured here. A model without a ladder is measured at its own quant. Without measurement: predictions for the
    scenario's model on this machine."""
    st = loading_study(sc)
    cfg = ctx_for(sc.run_config(), sc.n_gen + 1)
    rows: list[Observation] = []
    failures: list = []
    label = st.measured_label or st.label
    models: dict[str, str] = {}
    measured = measured_rungs(sc) if st.measuring else []
    for q in _ladder(sc):
        name, note = stage_model(st, q) if st.measuring else (sc.model, "")
        if note and q != st.measured_spec.file_type.upper():
            continue                         # no ladder: the measured model at its own quant only
        try:
            if q in measured:
                models[q] = name
                spec = resolve(name, build=True).spec       # the file measured: its own header
            else:
                spec = spec_at_quant(st.measured if st.measuring else sc.model, q)
        except ConfigError:                  # an architecture that cannot be described at another quant
            continue
        rows += predict_rows(spec, label, st.host, cfg, lever="quant", value=q, n_gen=sc.n_gen, n_prompt=1,
                             metrics=("tg_tps", "weights_ceiling_tg_tps", "physical_ceiling_tg_tps"))
    if st.measuring and sc.n_gen:
        paths = {q: str(resolve(m, build=True).path) for q, m in models.items()}
        got = harness.sweep(paths[next(iter(paths))], cfg, "model", list(paths.values()), tests=[f"tg{sc.n_gen}"],
                            repetitions=sc.repetitions, progress=False, monitor=False)
        obs, failures = measured_rows(got, label)
        rows += [replace(o, lever="quant", value=o.quant) for o in obs]
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, calibrated=bool(rates.stored_calibration()),
                       host_bandwidth_gbs=st.host.bandwidth_gbs, depth=sc.n_gen // 2,
                       conditions=conditions(cfg, label, depth=f"0 (tg{sc.n_gen} × {sc.repetitions})"))


def caption_decode(sc: Scenario, ladder):
    """Under the measured ladder: each rung's measured speed as a share of its bandwidth ceiling, and the
    prediction's error."""
    c = compare(ladder, ("value", "metric"))
    tg = c[c["metric"] == "tg_tps"].set_index("value")
    ceil = c[c["metric"] == "weights_ceiling_tg_tps"].set_index("value")["predicted"]
    out = []
    for q, r in tg.iterrows():
        x = r["measured"] if r["measured"] == r["measured"] else None
        bound = ladder[(ladder["value"] == q) & (ladder["metric"] == "tg_tps") & (ladder["source"] == "predicted")]
        b = bound["bound"].iloc[0] if len(bound) else ""
        if x:
            out.append(md("{q}: {x} tok/s measured, {s} of its bandwidth ceiling {c}; predicted {p} (the whole "
                          "token {b}-bound, error {e}).", q=q, x=fmt(x), s=f"{x / ceil[q]:.0%}" if q in ceil else "—",
                          c=fmt(ceil.get(q)), p=fmt(r["predicted"]), b=b, e=pct(r["predicted"], x)))
        else:
            out.append(md("{q}: predicted {p} tok/s (the whole token {b}-bound), bandwidth ceiling {c}.", q=q, p=fmt(r["predicted"]),
                          b=b, c=fmt(ceil.get(q))))
    if ladder.attrs.get("why_not_measured"):
        out.append(md("Not measured: {why}.", why=ladder.attrs["why_not_measured"]))
    return _caption(*out)


# ---------------------------------------------------------------------------------------------- the GPU build
def card_gpu(device, driver: str = ASSUMED_DRIVERS[0]) -> cudabuild.Gpu:
    """A catalog card as nvidia-smi would list it (its compute capability from the device catalog) on ``driver``."""
    if not device.compute_capability:
        raise ValueError(f"{device.name}: the catalog gives no CUDA compute capability")
    mib = int(device.memory_gib * 1024) if device.memory_gib else None
    return cudabuild.Gpu(device.name, str(device.compute_capability), mib, driver)


def card_plan(device, driver: str = ASSUMED_DRIVERS[0], machine_cuda12: bool = False) -> cudabuild.CudaPlan:
    """:func:`v100lab.base.cudabuild.plan_build` for a catalog card on ``driver``, with the registry's CUDA 13
    toolkit and (``machine_cuda12``) a CUDA 12.9 toolkit on the machine; the safe CPU flags of this machine."""
    return cudabuild.plan_build((card_gpu(device, driver),), (MACHINE_CUDA12,) if machine_cuda12 else (),
                                buildflags.host_cmake_args(), registry=cudabuild.registry_toolkit())


def _plan_row(where: str, plan: cudabuild.CudaPlan) -> tuple[str, str, str, str, str]:
    arch = next((a.split("=", 1)[1] for a in plan.cmake_args if a.startswith("-DCMAKE_CUDA_ARCHITECTURES=")), "—")
    return (where, "yes" if plan.cuda else "no", arch, plan.toolkit.label if plan.toolkit else "—", plan.reason)


def gpu_card(sc: Scenario):
    """The card the GPU build is about: the scenario's device when it is a GPU, else ``compare_gpu``'s (None when
    neither is an NVIDIA card with a compute capability)."""
    dev = gpu_subject(sc).device
    return dev if dev.kind == "gpu" and dev.compute_capability else None


def cuda_plans(sc: Scenario):
    """The CUDA build decided for this machine (nvidia-smi's answer here) and for the scenario's card under the
    toolkits it could have — the registry's CUDA 13 alone, with a machine's CUDA 12.9, on a CUDA 13 driver (580)
    and a CUDA 12 one (535): whether there is a CUDA build, its ``-DCMAKE_CUDA_ARCHITECTURES``, the toolkit and
    the one-line reason (:func:`v100lab.base.cudabuild.plan_build`)."""
    import pandas as pd  # heavy third-party dependency

    here = cudabuild.host_plan()
    rows = [_plan_row("this machine (nvidia-smi here)", here)]
    card = gpu_card(sc)
    if card is not None:
        for driver in ASSUMED_DRIVERS:
            for cu12 in (False, True):
                have = "registry's CUDA 13" + (" + a CUDA 12.9 toolkit" if cu12 else "")
                rows.append(_plan_row(f"{card.name} (cc {card.compute_capability}), driver {driver.split('.')[0]}, "
                                      f"{have}", card_plan(card, driver, cu12)))
    df = pd.DataFrame(rows, columns=["where", "CUDA build", "architectures", "toolkit", "reason"])
    df.attrs["card"] = card.name if card is not None else ""
    return df


def cuda_arch(sc: Scenario) -> int | None:
    """The architecture (70 for compute capability 7.0) the plan for the scenario's card compiles for."""
    card = gpu_card(sc)
    if card is None:
        return None
    archs = card_plan(card, machine_cuda12=True).archs
    return archs[0] if archs else None


def cuda_build_here() -> bool:
    """Whether the llama.cpp in use was built with CUDA (the recorded flags name GGML_CUDA ON) and sees a GPU."""
    args = buildflags.read_record().get("cmake_args") or ""
    return bool(buildflags.option_on(args, "GGML_CUDA")) and gpu_backend() is not None


def why_no_gpu_measurement() -> str:
    """Why this machine measures no GPU build ("" when it does): no CUDA build, or one that sees no card."""
    rec = buildflags.read_record()
    if not buildflags.option_on(rec.get("cmake_args") or "", "GGML_CUDA"):
        return "this llama.cpp is a CPU-only build" + (f" ({rec['gpu']})" if rec.get("gpu") else "")
    return "" if gpu_backend() is not None else "the CUDA build sees no GPU here (no driver, or no libcuda.so.1)"


def gpu_build_speed(sc: Scenario):
    """Decode and prompt speed with a CUDA build against a CPU-only build (lever "build"), predicted for the GPU
    lessons' model on the scenario's card (every layer that fits on the card; the CPU-only build runs everything
    on the card's host CPU, the seed's server) — and, where this machine has a CUDA build, the measured model
    measured with every layer on its card and with none."""
    tgt = gpu_subject(sc)
    card = gpu_card(sc)
    cfg = sc.run_config()
    rows: list[Observation] = []
    if card is not None:
        arch = card_plan(card, machine_cuda12=True)
        cuda_name = f"CUDA build (sm_{arch.archs[0]})" if arch.archs else "CUDA build"
        rows += predict_rows(tgt.spec, tgt.label, card, cfg.with_(n_gpu_layers=999), lever=LEVER_BUILD,
                             value=cuda_name, n_gen=sc.n_gen, metrics=("tg_tps",))
        host = gpu_host()
        rows += [replace(o, device=card.id, note=f"on {host.name}; " + o.note)
                 for o in predict_rows(tgt.spec, tgt.label, host, cfg.with_(n_gpu_layers=0), lever=LEVER_BUILD,
                                       value="CPU-only build", n_gen=sc.n_gen, metrics=("tg_tps",))]
    why = why_no_gpu_measurement()
    failures: list = []
    st = loading_study(sc)
    if not why and st.measuring:
        got = harness.sweep(str(st.measured_path), cfg, "n_gpu_layers", [999, 0], tests=[f"tg{sc.n_gen}"],
                            repetitions=sc.repetitions, progress=False, monitor=False)
        obs, failures = measured_rows(got, st.measured_label)
        rows += [replace(o, lever=LEVER_BUILD, value="CUDA build, -ngl 999" if o.value == "999" else
                         "CUDA build, -ngl 0") for o in obs]
    elif not why:
        why = st.why_not_measured
    return lever_frame(rows, failures, why_not_measured=why, card=card.name if card is not None else "",
                       conditions=conditions(cfg, tgt.label, depth=f"0 (tg{sc.n_gen})", threads=False))


def caption_gpu_build(sc: Scenario, gpu):
    """Under the GPU build: how much faster decode and prompt are predicted with the CUDA build."""
    if not len(gpu):
        return _caption(md("No NVIDIA card in this scenario (compare_gpu is none, or the device has no compute "
                           "capability): nothing to build for."))
    out = []
    pred = gpu[gpu["source"] == "predicted"]
    for metric, name in (("tg_tps", "Decode"),):
        m = pred[pred["metric"] == metric]
        cpu = m[m["value"] == "CPU-only build"]["result"]
        cu = m[m["value"].str.startswith("CUDA")]["result"]
        if len(cpu) and len(cu):
            out.append(md("{name}: {a} tok/s with a CPU-only build, {b} with the CUDA build ({x}×).", name=name,
                          a=fmt(cpu.iloc[0]), b=fmt(cu.iloc[0]), x=f"{cu.iloc[0] / cpu.iloc[0]:,.1f}"))
    meas = gpu[gpu["source"] == "measured"]
    if len(meas):
        out += [md("Measured here, {v}: {x} tok/s.", v=v, x=fmt(g["result"].mean())) for v, g in meas.groupby("value")]
    elif gpu.attrs.get("why_not_measured"):
        out.append(md("Nothing measured on a GPU: {why}.", why=gpu.attrs["why_not_measured"]))
    return _caption(*out)


# --------------------------------------------------------------------------------------------------- summary
def summary_build(sc: Scenario, costs, ladder, plans, gpu):
    """The build, in sentences from this run's numbers: the SIMD level compiled against the CPU's, the compute
    share per type, the measured ladder against its ceilings, and the CUDA build for the scenario's card."""
    cpu = buildflags.host_cpu()
    args = buildflags.read_record().get("cmake_args")
    lines = [md("This CPU's highest SIMD level is {c}; the build in use compiles for {b} and repacks {r}.",
                c=simd_level(cpu.flags), b=compiled_level(args, cpu.flags), r=", ".join(sorted(REPACK_TYPES)) or
                "nothing")]
    ratios = {t: cost_ratio(costs, t) for t in dict.fromkeys(costs["value"])}
    known = {t: x for t, x in ratios.items() if x}
    if known:
        comp = [t for t, x in known.items() if x > 1]
        lines.append(md("Decode per weight costs more de-quantizing than reading for {n} of {m} types ({t}); "
                        "compute ÷ bandwidth time: {pairs}.", n=len(comp), m=len(known),
                        t=", ".join(comp) or "none",
                        pairs=", ".join(f"{t} {known[t]:.2f}×" for t in ("Q4_1", "Q4_0") if t in known) or "—"))
    elif costs.attrs.get("why_not_calibrated"):
        lines.append(md("{why}.", why=costs.attrs["why_not_calibrated"]))
    c = compare(ladder, ("value", "metric"))
    tg = c[(c["metric"] == "tg_tps") & c["measured"].notna()]
    if len(tg):
        err = (tg["predicted"] / tg["measured"] - 1).abs().median()
        fast = tg.loc[tg["measured"].idxmax()]
        lines.append(md("Measured decode over {n} quant(s): fastest {q} at {x} tok/s; the prediction's median "
                        "|error| {e}.", n=len(tg), q=fast["value"], x=fmt(fast["measured"]), e=f"{100 * err:.0f} %"))
    elif ladder.attrs.get("why_not_measured"):
        lines.append(md("Decode not measured: {why}.", why=ladder.attrs["why_not_measured"]))
    if plans.attrs.get("card"):
        row = plans[plans["where"].str.contains("driver 580, registry's CUDA 13$", regex=True)]
        row12 = plans[plans["where"].str.contains("driver 580, registry's CUDA 13 \\+", regex=True)]
        if len(row) and len(row12):
            lines.append(md("{card}: with the registry's CUDA 13 alone, {a}; with a CUDA 12.9 toolkit, {b}.",
                            card=plans.attrs["card"], a=row["reason"].iloc[0] if row["CUDA build"].iloc[0] == "no"
                            else f"architectures {row['architectures'].iloc[0]} with {row['toolkit'].iloc[0]}",
                            b=f"architectures {row12['architectures'].iloc[0]} with {row12['toolkit'].iloc[0]}"
                            if row12["CUDA build"].iloc[0] == "yes" else row12["reason"].iloc[0]))
    here = plans[plans["where"].str.startswith("this machine")]
    if len(here):
        lines.append(md("This machine: {r}.", r=here["reason"].iloc[0]))
    pred = gpu[(gpu["source"] == "predicted") & (gpu["metric"] == "tg_tps")] if len(gpu) else gpu
    if len(pred) == 2:
        cpu_tg = pred[pred["value"] == "CPU-only build"]["result"]
        cu_tg = pred[pred["value"] != "CPU-only build"]["result"]
        if len(cpu_tg) and len(cu_tg):
            lines.append(md("Predicted decode on {card}: {b} tok/s with the CUDA build against {a} with a CPU-only "
                            "build.", card=gpu.attrs.get("card"), a=fmt(cpu_tg.iloc[0]), b=fmt(cu_tg.iloc[0])))
    lines.append(_failures_line(ladder, gpu))
    return markdown(lines)
