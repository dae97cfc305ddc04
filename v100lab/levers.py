"""One function per step of the workbook: each returns tidy rows — predicted and measured — for one lever.

The notebooks hold no formulas and no loops: every cell calls one function here (or in
:mod:`v100lab.plots`) with the validated :class:`~v100lab.scenario.Scenario`. A function here

* resolves the scenario once (:func:`study`): the model studied (a GGUF path, URL or zoo alias, or a
  skeleton ``skeleton:ARCH:QUANT`` of a model nobody downloaded), the device the predictions are for, and
  the model that can be *measured on this machine* (``stand_in_model`` when set; none when the scenario
  says ``measure: false`` or the model has no weights here) — with the reason when nothing is measured;
* predicts with :mod:`v100lab.memory` and :mod:`v100lab.speed`, measures with :mod:`v100lab.bench`,
  :mod:`v100lab.loadlog` and :mod:`v100lab.quality`, and returns one tidy frame
  (:func:`v100lab.results.tidy_frame`) in which every plotted number lives, measured rows flagged when they
  exceed the ceiling of their model and device;
* never prints (logging only); failures of a *measurement* (a configuration llama.cpp refuses) are data:
  they are kept in ``frame.attrs["failures"]`` with llama.cpp's own reason, and the summaries report them.

The ``summary_*`` functions write each notebook's closing paragraph from the numbers of the frames they are
given — nothing in them is a canned conclusion — and escape every string that came from a model or a
parameter file (:mod:`v100lab.render`).

Measured rows are always for this machine (device ``host``) and carry the measured model's label, with
"(stand-in)" when the scenario measures a stand-in for its model.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from v100lab.config import ALL_LAYERS, RunConfig
from v100lab.errors import ConfigError, V100labError
from v100lab.results import TPS, Observation, concat, tidy_frame
from v100lab.scenario import Scenario
from v100lab.skeleton import SKELETON_PREFIX, is_skeleton_name, load_spec, parse_skeleton_name
from v100lab.spec import ModelSpec

log = logging.getLogger(__name__)

HOST = "host"
GIB = 2**30
MIB = 2**20

# Memory components: MemoryPlan/DeviceMemory field → llama.cpp's buffer kind in the load log
COMPONENTS = (("weights", "weights_bytes", "model"), ("KV cache", "kv_cache_bytes", "KV"),
              ("recurrent state", "recurrent_bytes", "RS"), ("compute", "compute_bytes", "compute"),
              ("output", "output_bytes", "output"), ("runtime overhead", "overhead_bytes", None))

# The map of the workbook (00 shows it): notebook → the question it answers.
NOTEBOOKS = (
    ("00_overview", "The story, this map, and the seed's staircase: claimed vs predicted vs measured."),
    ("01_vram_triangle", "Model size × context × card memory: what fits, and the largest context."),
    ("02_bandwidth_ceiling", "tok/s ≤ bandwidth / bytes per token: the ceiling per quant and device, the roofline "
                             "with this machine's calibration, published Apple Silicon rows."),
    ("03_baseline", "A real run with llama.cpp's defaults; what the load log says; measured vs predicted."),
    ("04_quantization", "The quant ladder: speed and file size measured vs predicted; perplexity and KL divergence."),
    ("05_gpu_layers", "-ngl: predicted for the device; why spilled layers explain the seed's 18 → 44 jump."),
    ("06_context_and_kv_cache", "Context and cache types: KV memory, decode speed vs depth, quantized V needs "
                                "flash attention."),
    ("07_batch_flash_attn_parallel_mlock", "Batch sizes, flash attention, --parallel, mmap/mlock, threads."),
    ("08_final_config", "The tuned configuration, its predicted and measured speed, the llama-server command."),
)


# ================================================================================================
# resolving the scenario
# ================================================================================================

def arch_of(spec: ModelSpec) -> dict[str, Any] | None:
    """An architecture spec (:mod:`v100lab.skeleton`'s schema) for the shapes in ``spec``'s header, so the
    same model can be described at other quants without building their files; None when the skeleton
    writer has no tensor layout for the architecture (or the shapes vary per layer in a way it cannot say)."""
    from v100lab.skeleton import ARCHS

    if spec.architecture not in ARCHS or not isinstance(spec.n_ff, int) or not isinstance(spec.n_head, int):
        return None
    a: dict[str, Any] = {
        "architecture": spec.architecture, "name": spec.name or spec.architecture,
        "n_layer": spec.n_layer, "n_embd": spec.n_embd, "n_ff": spec.n_ff, "n_head": spec.n_head,
        "n_head_kv": list(spec.n_head_kv_arr) if isinstance(spec.n_head_kv_arr, tuple) else spec.n_head_kv_arr,
        "head_dim_k": spec.head_dim_k, "head_dim_v": spec.head_dim_v, "n_ctx_train": spec.n_ctx_train or 4096,
        "n_vocab": spec.n_vocab, "tied_embeddings": spec.tensor("output.weight") is None, "source_type": "F16",
    }
    if spec.rope_freq_base:
        a["rope_freq_base"] = float(spec.rope_freq_base)
    if spec.rope_dimension_count:
        a["rope_dimension_count"] = int(spec.rope_dimension_count)
    if spec.sliding_window:
        a["sliding_window"] = int(spec.sliding_window)
    if spec.full_attention_interval:
        a["full_attention_interval"] = int(spec.full_attention_interval)
    if spec.nextn_layers:
        a["nextn_layers"] = int(spec.nextn_layers)
    if spec.architecture == "qwen35":
        a["ssm"] = {"conv_kernel": spec.ssm_conv_kernel, "state_size": spec.ssm_state_size,
                    "group_count": spec.ssm_group_count, "time_step_rank": spec.ssm_time_step_rank,
                    "inner_size": spec.ssm_inner_size}
    return a


@lru_cache(maxsize=256)
def _spec_at_quant_cached(model: str, quant: str) -> ModelSpec:
    import json

    from v100lab.skeleton import skeleton_spec

    parsed = parse_skeleton_name(model)
    if parsed is not None:
        return skeleton_spec(parsed[0], quant)
    spec = load_spec(model)
    if spec.file_type.upper() == quant:
        return spec
    a = arch_of(spec)
    if a is None:
        raise ConfigError(f"model '{model}': architecture '{spec.architecture}' cannot be described at other "
                          "quants here; use its own quant only")
    return skeleton_spec(json.loads(json.dumps(a)), quant)


def spec_at_quant(model: str, quant: str) -> ModelSpec:
    """``model`` as llama-quantize would make it at ``quant`` (its own header when the quant is its own)."""
    return _spec_at_quant_cached(os.fspath(model), quant.upper())


@dataclass(frozen=True)
class Study:
    """A scenario, resolved: what is predicted, on which device, and what is measured here."""

    sc: Scenario
    spec: ModelSpec                  # the scenario's model
    label: str                       # its label in tables and plots
    device: Any                      # v100lab.devices.Device the predictions are for
    host: Any                        # this machine (measured)
    measured: str | None             # alias or path measured on this machine (None: nothing is measured)
    measured_path: Path | None
    measured_spec: ModelSpec | None
    measured_label: str              # "" when nothing is measured
    why_not_measured: str            # "" when measuring

    @property
    def measuring(self) -> bool:
        return self.measured is not None

    @property
    def same_model_here(self) -> bool:
        """The scenario predicts for this machine and measures its own model: one set of predictions."""
        return self.measuring and self.device.id == HOST and not self.sc.is_stand_in and \
            self.measured_spec == self.spec

    @property
    def skeleton(self) -> bool:
        return is_skeleton_name(self.sc.model)


def _label(spec: ModelSpec, model: str) -> str:
    """A model's label in tables and plots: its name (the quant is a column of its own)."""
    return (spec.name or Path(model).stem or model).strip()


@lru_cache(maxsize=16)
def study(sc: Scenario) -> Study:
    """Resolve ``sc`` once per kernel (cached; a Scenario is immutable)."""
    from v100lab import zoo
    from v100lab.devices import get_device

    spec = load_spec(sc.model)
    label = _label(spec, sc.model)
    device = get_device(sc.device)
    host = get_device(HOST)
    measured = sc.measured_model
    why = ""
    mpath = mspec = None
    if not sc.measure:
        why = "the scenario says measure: false"
    elif is_skeleton_name(measured):
        why = f"{sc.model} is a header-only skeleton (no weights) and the scenario names no stand_in_model"
    elif measured.lower().startswith(("http://", "https://")):
        why = "the model is a URL: only its header is read here, the weights are not downloaded"
    else:
        try:
            mpath = zoo.resolve(measured)
            mspec = load_spec(str(mpath))
        except V100labError as exc:
            why = f"the model cannot be loaded here: {exc}"
            mpath = mspec = None
        if mpath is not None and mpath.stat().st_size > 0.7 * host.capacity_bytes:
            why = (f"{mpath.name} ({mpath.stat().st_size / GIB:.1f} GiB) is too big for this machine's "
                   f"{host.memory_gib:.0f} GiB of RAM")
            mpath = mspec = None
    if mspec is None:
        return Study(sc, spec, label, device, host, None, None, None, "", why)
    mlabel = _label(mspec, measured) + (" (stand-in)" if sc.is_stand_in else "")
    return Study(sc, spec, label, device, host, measured, mpath, mspec, mlabel, "")


def gpu_backend() -> str | None:
    """The GPU(s) llama-cpp-python's build can use here, or None for a CPU-only build."""
    from v100lab.backends.inprocess import cpu_gpu_info

    gpu = cpu_gpu_info()[1]
    return gpu or None


# ================================================================================================
# shared helpers: predictions, measurements, ceilings
# ================================================================================================

def _tests(sc: Scenario, pp: bool = True, tg: bool = True) -> list[str]:
    out = []
    if pp and sc.n_prompt:
        out.append(f"pp{sc.n_prompt}")
    if tg and sc.n_gen:
        out.append(f"tg{sc.n_gen}")
    return out


def _ctx_for(cfg: RunConfig, need: int) -> RunConfig:
    """``cfg`` with a context large enough for ``need`` tokens per sequence (0 = the model's own is kept)."""
    if cfg.n_ctx and cfg.n_ctx < need * max(1, cfg.n_parallel):
        return cfg.with_(n_ctx=int(math.ceil(need * max(1, cfg.n_parallel) / 256) * 256))
    return cfg


def _fitting(spec: ModelSpec, devices: Sequence, cfg: RunConfig) -> tuple[RunConfig, str]:
    """``cfg`` as llama.cpp's --fit would run it on GPUs: the most layers that fit when all do not."""
    from v100lab import memory

    if all(d.kind == "cpu" for d in devices):
        return cfg, ""
    p = memory.plan(spec, list(devices), cfg, with_max_ctx=False)
    gpus = p.gpu_devices
    if all(m.fits for m in gpus.values()):
        return cfg, ""
    ngl = memory.max_gpu_layers(spec, list(devices), cfg)
    if ngl < min(cfg.n_gpu_layers, memory.layer_slots(spec)):
        return cfg.with_(n_gpu_layers=ngl), f"does not fit with -ngl {cfg.n_gpu_layers}: predicted with -ngl {ngl}"
    return cfg, ""


@lru_cache(maxsize=1)
def gpu_host():
    """The CPU beside a catalog GPU, for layers that do not fit: the seed's assumed server CPU
    (``seed_claims.yaml`` host: 6 channels of DDR4-2666, uncalibrated) — not this machine, whose CPU
    says nothing about a V100 server's."""
    from v100lab.calibration import load_seed_claims, seed_host_device

    return seed_host_device(load_seed_claims())


def _devices_for(device) -> list:
    """A GPU is predicted together with a host CPU (layers that do not fit run there): :func:`gpu_host`."""
    return [device] if device.kind == "cpu" else [device, gpu_host()]


def predict_rows(spec: ModelSpec, label: str, device, cfg: RunConfig, *, lever: str, value: Any,
                 depth: int = 0, n_prompt: int = 512, n_gen: int = 0, metrics: Iterable[str] = ("tg_tps", "pp_tps"),
                 fit: bool = True, note: str = "") -> list[Observation]:
    """Predicted rows for one configuration: decode (at the middle of ``n_gen`` tokens after ``depth``),
    prompt processing (``n_prompt`` tokens after ``depth``), the seed's plain ceiling and the strict one.

    ``fit``: on a GPU, a configuration that does not fit is predicted with the layers that do (and says so)."""
    from v100lab import speed

    devs = _devices_for(device)
    why = ""
    if fit:
        cfg, why = _fitting(spec, devs, cfg)
    pred_tg = speed.predict(spec, devs, cfg, depth=depth + n_gen // 2, n_prompt=max(1, n_prompt))
    pred_pp = speed.predict(spec, devs, cfg, depth=depth, n_prompt=max(1, n_prompt)) if "pp_tps" in metrics else None
    base_note = "; ".join(x for x in (note, why, f"bound: {pred_tg.bound}") if x)
    rows = []
    dev_id = device.id
    for metric in metrics:
        if metric == "tg_tps":
            val, n = pred_tg.tg_tps, base_note
        elif metric == "pp_tps":
            val, n = pred_pp.pp_tps, "; ".join(x for x in (note, why, f"bound: {pred_pp.pp_bound}") if x)
        elif metric == "ceiling_tg_tps":
            val, n = pred_tg.ceiling_tg_tps, "the seed's ceiling: bandwidth / weight bytes placed"
        elif metric == "strict_ceiling_tg_tps":
            val, n = pred_tg.strict_ceiling_tg_tps, "bytes that must be read per token at peak bandwidth"
        else:
            raise ConfigError(f"unknown predicted metric '{metric}'")
        if not math.isfinite(val):
            continue
        rows.append(Observation(model=label, quant=spec.file_type, device=dev_id, lever=lever, value=str(value),
                                metric=metric, result=float(val), unit=TPS, source="predicted",
                                above_ceiling=(bool(val > pred_tg.strict_ceiling_tg_tps * 1.0001)
                                               if metric == "tg_tps" else None), note=n))
    return rows


def _failure(row: Mapping[str, Any]) -> dict[str, str]:
    return {"lever": str(row.get("lever") or ""), "value": str(row.get("value") or ""),
            "test": str(row.get("test") or ""), "reason": str(row.get("reason") or "failed")}


def _measured(rows: Sequence[Mapping[str, Any]], label: str) -> tuple[list[Observation], list[dict[str, str]]]:
    from v100lab.bench import rows_to_observations

    return rows_to_observations(rows, label, HOST), [_failure(r) for r in rows if r.get("status") != "ok"]


def measure_sweep(st: Study, lever: str, values: Sequence[Any], cfg: RunConfig, tests: Sequence[str],
                  depths: Sequence[int] = (0,), backend: str | None = None, model: str | None = None):
    """Measured rows of a bench sweep of the measured model on this machine (one model load per value).

    Returns (observations, failures)."""
    from v100lab import bench

    if not st.measuring or not tests:
        return [], []
    rows = bench.sweep(str(model or st.measured_path), cfg, lever, list(values), tests=list(tests),
                       depths=list(depths), repetitions=st.sc.repetitions, backend=backend, results=None,
                       progress=False, monitor=False)
    return _measured(rows, st.measured_label)


def _flag(df, ceilings: Mapping[tuple, float]):
    """Mark measured and claimed decode rows (tok/s) above the strict ceiling of their model, quant and device
    — the ceiling of the same lever value when there is one, else the loosest of that model's."""
    if not len(df) or not ceilings:
        return df
    df = df.copy()
    flags = []
    for _, r in df.iterrows():
        flag = r["above_ceiling"]
        if r["source"] in ("measured", "claimed") and r["unit"] == TPS and str(r["metric"]).startswith("tg_tps"):
            c = ceilings.get((r["model"], r["quant"], r["device"], r["lever"], r["value"]),
                             ceilings.get((r["model"], r["quant"], r["device"])))
            if c is not None:
                flag = bool(r["result"] > c)
        flags.append(flag)
    df["above_ceiling"] = flags
    return df


def _ceilings_of(rows: Iterable[Observation]) -> dict[tuple, float]:
    """Strict ceilings of the predicted rows: by (model, quant, device, lever, value), and by (model, quant,
    device) the largest of them (the loosest bound, for rows measured at a value nothing predicted)."""
    out: dict[tuple, float] = {}
    for o in rows:
        if o.source == "predicted" and o.metric == "strict_ceiling_tg_tps":
            out[(o.model, o.quant, o.device, o.lever, o.value)] = o.result
            k = (o.model, o.quant, o.device)
            out[k] = max(out.get(k, 0.0), o.result)
    return out


def _frame(rows: list[Observation], failures: Sequence[Mapping[str, str]] = (), **attrs):
    df = _flag(tidy_frame(rows), _ceilings_of(rows))
    df.attrs["failures"] = list(failures)
    df.attrs.update(attrs)
    return df


# ================================================================================================
# 00 overview
# ================================================================================================

def notebook_map():
    """The notebooks of the workbook and the question each answers."""
    import pandas as pd

    return pd.DataFrame(NOTEBOOKS, columns=["notebook", "what it shows"])


def scenario_facts(sc: Scenario):
    """What this run studies: the model, the device, what is measured here (or why not), the flags."""
    import pandas as pd

    st = study(sc)
    d = st.device
    cfg = sc.run_config()
    changed = [f"{k}={getattr(cfg, k)}" for k in cfg.as_dict() if getattr(cfg, k) != getattr(RunConfig(), k)]
    rows = [
        ("scenario", sc.scenario),
        ("model studied", f"{st.label} ({st.spec.architecture}, {st.spec.weight_bytes / GIB:.2f} GiB of weights"
                          f"{', header-only skeleton' if st.skeleton else ''})"),
        ("device predicted for", f"{d.name}: {d.memory_gib:g} GiB, {d.bandwidth_gbs:g} GB/s"),
        ("measured on this machine", st.measured_label or f"nothing: {st.why_not_measured}"),
        ("this machine", f"{st.host.name}: {st.host.memory_gib:.1f} GiB, {st.host.bandwidth_gbs:g} GB/s measured; "
                         f"GPU backend: {gpu_backend() or 'none (CPU build of llama.cpp)'}"),
        ("llama.cpp flags", ", ".join(changed) or "llama.cpp's defaults"),
        ("reference claims", sc.claims),
    ]
    return pd.DataFrame(rows, columns=["", "value"])


def _stage_model(st: Study, quant: str) -> tuple[str, str]:
    """The file measured for a stage at ``quant``: the measured model's ladder rung when it has one
    (``default:Q4_0``, ``synth-1b:Q4_0``), else the measured model itself (note says so)."""
    from v100lab import zoo

    base = (st.measured or "").partition(":")[0]
    if base in zoo.aliases() and base != zoo.GEMMA_ALIAS:
        return f"{base}:{quant}", ""
    return str(st.measured_path), f"measured at the stand-in's own quant {st.measured_spec.file_type}"


def staircase(sc: Scenario):
    """The seed's staircase: each stage claimed (the seed, its device) vs predicted (that device, the seed's
    assumed model) — and, on this machine, each stage's flags measured vs predicted for the measured model.

    Lever "stage", value "N name"; claimed rows only when the scenario's ``claims`` is "seed"."""
    from v100lab import speed
    from v100lab.bench import run_tests
    from v100lab.calibration import load_seed_claims
    from v100lab.header import read_spec
    from v100lab import zoo

    st = study(sc)
    claims = load_seed_claims()
    rows = [o for o in speed.seed_staircase(device=claims["device"]) if sc.claims == "seed" or o.source != "claimed"]
    failures: list[dict[str, str]] = []
    for stage in claims["stages"]:
        label = f"{stage['id']} {stage['name']}"
        cfg_map = dict(stage.get("config") or {})
        depth = int(stage.get("depth", 0))
        cfg = _ctx_for(RunConfig.from_mapping({**cfg_map, "n_threads": sc.n_threads}), depth + sc.n_gen + 1)
        if not st.measuring:
            continue
        model, note = _stage_model(st, stage["quant"])
        try:
            mspec = read_spec(zoo.resolve(model))
        except V100labError as exc:
            failures.append({"lever": "stage", "value": label, "test": "", "reason": str(exc)})
            continue
        mlabel = st.measured_label
        rows += predict_rows(mspec, mlabel, st.host, cfg, lever="stage", value=label, depth=depth, n_gen=sc.n_gen,
                             metrics=("tg_tps", "strict_ceiling_tg_tps"), note=note)
        if sc.n_gen:
            got = run_tests(model, cfg, [f"tg{sc.n_gen}"], [depth], sc.repetitions, monitor=False,
                            lever="stage", value=label)
            obs, fails = _measured(got, mlabel)
            rows += [_renote(o, note) for o in obs]
            failures += fails
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


def _renote(o: Observation, note: str) -> Observation:
    from dataclasses import replace

    return replace(o, note="; ".join(x for x in (o.note, note) if x)) if note else o


# ================================================================================================
# 01 the VRAM triangle
# ================================================================================================

def kv_bytes_per_token(spec: ModelSpec, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
    """Bytes of K and V cache one token adds, over the layers that have a cache (the seed's
    2 × layers × KV heads × head_dim × bytes, with GQA, SWA and recurrent layers as llama.cpp has them)."""
    from v100lab.memory import kv_widths, row_size

    total = 0
    for il in range(spec.n_layer):
        if not spec.has_kv(il):
            continue
        wk, wv = kv_widths(spec, il)
        total += row_size(cache_type_k, wk) + (row_size(cache_type_v, wv) if wv else 0)
    return int(total)


def header_facts(sc: Scenario):
    """The scenario model's header, as the memory model reads it (a two-column table)."""
    import pandas as pd

    s = study(sc).spec
    kv_layers = sum(1 for il in range(s.n_layer) if s.has_kv(il))
    rows = [
        ("name", s.name), ("architecture", s.architecture), ("file type", s.file_type),
        ("parameters", f"{s.n_params / 1e9:.3f} B"), ("weights", f"{s.weight_bytes / GIB:.3f} GiB "
                                                      f"({s.bits_per_weight:.2f} bits per weight)"),
        ("file size", f"{s.file_bytes / GIB:.3f} GiB" if s.file_bytes else "no file (skeleton)"),
        ("layers", f"{s.n_layer} ({kv_layers} with a KV cache, {len(s.recurrent_layers)} recurrent, "
                   f"{len(s.swa_layers)} sliding-window)"),
        ("n_embd / n_ff", f"{s.n_embd} / {s.n_ff if isinstance(s.n_ff, int) else max(s.n_ff)}"),
        ("heads / KV heads", f"{s.n_head_at(0)} / {s.n_head_kv(next((i for i in range(s.n_layer) if s.has_kv(i)), 0))}"),
        ("head size K / V", f"{s.head_dim_k} / {s.head_dim_v}"),
        ("training context", f"{s.n_ctx_train}"), ("vocabulary", f"{s.n_vocab}"),
        ("KV cache per token (f16)", f"{kv_bytes_per_token(s) / 1024:.1f} KiB"),
        ("tensor types", ", ".join(f"{k} ×{v}" for k, v in sorted(s.tensor_types.items()))),
    ]
    return pd.DataFrame(rows, columns=["field", "value"])


def _plan_rows(spec: ModelSpec, label: str, devices: Sequence, cfg: RunConfig, group: str) -> list[Observation]:
    from v100lab import memory

    p = memory.plan(spec, list(devices), cfg, with_max_ctx=False)
    rows = []
    for dev_name, m in p.devices.items():
        for comp, attr, _ in COMPONENTS:
            rows.append(Observation(label, spec.file_type, dev_name, "component", comp, "bytes",
                                    float(getattr(m, attr)), "bytes", "predicted", note=group))
        rows.append(Observation(label, spec.file_type, dev_name, "component", "capacity", "capacity_bytes",
                                float(m.capacity_bytes), "bytes", "predicted", note=group))
    return rows


def capture_load(st: Study, cfg: RunConfig):
    """Load the measured model with ``cfg`` and return llama.cpp's load facts (None when not measuring)."""
    from v100lab.loadlog import load_and_capture

    if not st.measuring:
        return None
    facts, _ = load_and_capture(st.measured_path, cfg)
    return facts


def memory_breakdown(sc: Scenario):
    """Where the bytes go: predicted per device and component for the scenario's model on its device, and —
    when measuring — llama.cpp's own buffer sizes for the measured model here beside their prediction.

    Lever "component"; metric "bytes" (and "capacity_bytes"); ``note`` names the group shown together."""
    from v100lab.errors import RunFailed

    st = study(sc)
    cfg = sc.run_config()
    rows: list[Observation] = []
    if not st.same_model_here:
        rows += _plan_rows(st.spec, st.label, _devices_for(st.device), cfg, f"{st.label} on {st.device.id}")
    failures = []
    if st.measuring:
        mgroup = f"{st.measured_label} on this machine"
        rows += _plan_rows(st.measured_spec, st.measured_label, [st.host], cfg, mgroup)
        try:
            facts = capture_load(st, cfg)
        except RunFailed as exc:
            facts = None
            failures.append({"lever": "component", "value": "load", "test": "", "reason": str(exc)})
        if facts is not None:
            for comp, _, kind in COMPONENTS:
                if kind is None:
                    continue
                rows.append(Observation(st.measured_label, st.measured_spec.file_type, HOST, "component", comp,
                                        "bytes", float(facts.buffer_bytes(kind)), "bytes", "measured",
                                        note=mgroup))
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


def quant_specs(sc: Scenario) -> dict[str, ModelSpec]:
    """The scenario's model at every quant of ``sc.quants`` (its own quant first when it is not listed)."""
    st = study(sc)
    out = {}
    quants = [q.upper() for q in sc.quants]
    own = st.spec.file_type.upper()
    try:
        for q in quants:
            out[q] = spec_at_quant(sc.model, q)
    except ConfigError as exc:
        log.info("%s", exc)
        out = {}
    if own not in out:
        out = {own: st.spec, **out}
    return out


def fit_grid(sc: Scenario):
    """The VRAM triangle on the scenario's device: for every quant × context × cache type, the busiest
    device's total bytes and margin, whether it fits, how many layers fit, and the largest context per quant
    and cache type (memory.triangle, all predicted)."""
    from v100lab import memory

    st = study(sc)
    specs = quant_specs(sc)
    rows = memory.triangle(specs, _devices_for(st.device), sc.ctx_sizes, sc.cache_types, sc.run_config())
    return _frame(rows, device_name=st.device.name, capacity_gib=st.device.memory_gib)


def largest_context(grid):
    """The largest context that fits, per quant (rows) and cache type (columns), from :func:`fit_grid`."""
    m = grid[grid["metric"] == "max_ctx"].copy()
    m["cache type"] = m["note"].str.replace("cache_type=", "", regex=False)
    wide = m.pivot_table(index="quant", columns="cache type", values="result", aggfunc="max")
    wide = wide.astype(int).reset_index()
    wide.columns.name = None
    return wide


# ================================================================================================
# 02 the bandwidth ceiling
# ================================================================================================

def ceilings(sc: Scenario):
    """Per quant, on the scenario's device: the seed's ceiling (bandwidth / weight bytes), the strict ceiling
    and the predicted decode speed (layers that do not fit run on the CPU); plus, when the claims are the
    seed's, its own ceiling table beside the same figures for its assumed model and device (lever "quant")."""
    from v100lab.calibration import load_seed_claims
    from v100lab.skeleton import skeleton_spec

    st = study(sc)
    cfg = sc.run_config()
    rows: list[Observation] = []
    for q, spec in quant_specs(sc).items():
        rows += predict_rows(spec, st.label, st.device, cfg, lever="quant", value=q, n_gen=sc.n_gen,
                             n_prompt=sc.n_prompt, metrics=("tg_tps",))
        rows += device_ceilings(spec, st.label, st.device, cfg, lever="quant", value=q, depth=sc.n_gen // 2)
    if sc.claims == "seed":
        from v100lab.devices import get_device

        claims = load_seed_claims()
        dev = get_device(claims["device"])
        seed_label = claims["model"]["label"]
        for row in claims["ceiling_table"]:
            q = row["quant"]
            spec = skeleton_spec(claims["model"]["arch"], q)
            rows += device_ceilings(spec, seed_label, dev, RunConfig(n_ctx=2048), lever="quant", value=q)
            rows.append(Observation(seed_label, q, dev.id, "quant", q, "ceiling_tg_tps",
                                    float(row["claimed_ceiling_tps"]), TPS, "claimed",
                                    note=f"the seed's table: {row['file_gb']} GB file"))
    return _frame(rows)


def device_ceilings(spec: ModelSpec, label: str, device, cfg: RunConfig, *, lever: str, value: Any,
                    depth: int = 0) -> list[Observation]:
    """The two ceilings with *every* weight on ``device``, fit or not: the seed's (bandwidth / weight bytes)
    and the strict one (bytes a token must read — weights used, KV at ``depth``, state — at peak bandwidth)."""
    from v100lab import speed

    plain = speed.ceiling_tps(spec.weight_bytes, device.bandwidth_gbs)
    strict = speed.strict_ceiling_tps(spec, device, cfg, depth)
    return [Observation(label, spec.file_type, device.id, lever, str(value), "ceiling_tg_tps", plain, TPS,
                        "predicted", note=f"the seed's ceiling: {device.bandwidth_gbs:g} GB/s / "
                                          f"{spec.weight_bytes / 1e9:.2f} GB of weights"),
            Observation(label, spec.file_type, device.id, lever, str(value), "strict_ceiling_tg_tps", strict, TPS,
                        "predicted", note="bytes a token must read, all on the device, at peak bandwidth")]


def catalog_ceilings(sc: Scenario):
    """The scenario's model (its own quant) on every device of ``compare_devices`` (default: the catalog):
    the seed's ceiling, the predicted decode speed, and whether it fits (lever "device")."""
    from v100lab import memory
    from v100lab.devices import catalog, get_device

    st = study(sc)
    ids = list(sc.compare_devices) or list(catalog())
    if st.device.id not in ids and st.device.kind != "cpu":
        ids.insert(0, st.device.id)
    cfg = sc.run_config()
    rows: list[Observation] = []
    for dev_id in ids:
        dev = get_device(dev_id)
        devs = _devices_for(dev)
        fits = memory.plan(st.spec, devs, cfg, with_max_ctx=False).fits
        rows += predict_rows(st.spec, st.label, dev, cfg, lever="device", value=dev.id, n_gen=sc.n_gen,
                             n_prompt=sc.n_prompt, metrics=("tg_tps",), note="fits" if fits else "does not fit")
        rows += device_ceilings(st.spec, st.label, dev, cfg, lever="device", value=dev.id, depth=sc.n_gen // 2)
    return _frame(rows)


def roofline(sc: Scenario):
    """This machine's roofline for the measured model (else the scenario's model): per quant, the plain
    bandwidth ceiling and the calibrated prediction with the bound that limits it; and the measured decode
    speed of the measured model itself (lever "quant")."""
    from v100lab.bench import run_tests

    st = study(sc)
    model = st.measured if st.measuring else sc.model
    spec = st.measured_spec if st.measuring else st.spec
    label = st.measured_label if st.measuring else st.label
    cfg = sc.run_config()
    rows: list[Observation] = []
    quants = list(dict.fromkeys([spec.file_type] + [q.upper() for q in sc.quants]))
    for q in quants:
        try:
            qs = spec if q == spec.file_type else spec_at_quant(str(st.measured_path) if st.measuring else model, q)
        except ConfigError:
            continue
        rows += predict_rows(qs, label, st.host, cfg, lever="quant", value=q, n_gen=sc.n_gen,
                             n_prompt=sc.n_prompt, metrics=("tg_tps",))
        rows += device_ceilings(qs, label, st.host, cfg, lever="quant", value=q, depth=sc.n_gen // 2)
    failures = []
    if st.measuring and sc.n_gen:
        got = run_tests(str(st.measured_path), cfg, [f"tg{sc.n_gen}"], [0], sc.repetitions, monitor=False,
                        lever="quant", value=spec.file_type)
        obs, failures = _measured(got, label)
        rows += obs
    from v100lab.calibration import stored_calibration

    return _frame(rows, failures, calibrated=bool(stored_calibration()), host_bandwidth_gbs=st.host.bandwidth_gbs,
                  why_not_measured=st.why_not_measured)


def apple(sc: Scenario):
    """Published llama.cpp rows on Apple Silicon (Llama 2 7B; source "claimed": published by others) against
    the speed model's prediction for the same chip (fitted on the *other* chips: leave-one-chip-out)."""
    from v100lab.calibration import apple_rows

    df = apple_rows()
    rows = []
    for _, r in df[df["comparable"]].iterrows():
        value = f"{r['chip']} {int(r['gpu_cores'])}c"
        metric = "tg_tps" if r["test"] == "tg128" else "pp_tps"
        dev = f"apple {r['chip']}"
        rows.append(Observation("Llama 2 7B", r["quant"], dev, "chip", value, metric, float(r["published"]), TPS,
                                "claimed", above_ceiling=bool(r["above_ceiling"]), note=f"published: {r['source']}"))
        rows.append(Observation("Llama 2 7B", r["quant"], dev, "chip", value, metric, float(r["predicted"]), TPS,
                                "predicted", note=f"fit on {r['fit_on']}"))
    return _frame(rows)


# ================================================================================================
# 03 baseline
# ================================================================================================

def baseline(sc: Scenario):
    """A real run with the scenario's flags (llama.cpp's defaults unless the scenario changes them): prompt
    processing and decode measured on this machine vs predicted, and predicted for the scenario's model on
    its device (lever "config", value "baseline")."""
    st = study(sc)
    cfg = _ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    rows = []
    if not st.same_model_here:
        rows += predict_rows(st.spec, st.label, st.device, cfg, lever="config", value="baseline",
                             n_prompt=sc.n_prompt, n_gen=sc.n_gen,
                             metrics=("tg_tps", "pp_tps", "ceiling_tg_tps", "strict_ceiling_tg_tps"))
    failures = []
    if st.measuring:
        rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever="config", value="baseline",
                             n_prompt=sc.n_prompt, n_gen=sc.n_gen,
                             metrics=("tg_tps", "pp_tps", "ceiling_tg_tps", "strict_ceiling_tg_tps"))
        obs, failures = measure_sweep(st, "n_ctx", [cfg.n_ctx], cfg, _tests(sc))
        from dataclasses import replace

        rows += [replace(o, lever="config", value="baseline") for o in obs]
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


def load_diagnosis(sc: Scenario):
    """What llama.cpp's load log says for the measured model with the scenario's flags — offloaded layers,
    flash attention, context, and each buffer with its device — beside the memory plan's figure for it.
    Without a measurement: the plan for the scenario's model on its device."""
    import pandas as pd

    from v100lab import memory
    from v100lab.errors import RunFailed

    st = study(sc)
    cfg = sc.run_config()
    rows: list[tuple[str, str, str]] = []
    if not st.measuring:
        p = memory.plan(st.spec, _devices_for(st.device), cfg, with_max_ctx=False)
        rows.append(("source", "memory plan (predicted; nothing loaded)", st.why_not_measured))
        rows.append(("layers on the GPU", f"{p.offloaded_layers}/{p.n_layer_total}", "predicted"))
        for dev_name, m in p.devices.items():
            for comp, attr, _ in COMPONENTS:
                if getattr(m, attr):
                    rows.append((f"{comp} buffer", f"{getattr(m, attr) / MIB:.2f} MiB on {dev_name}", "predicted"))
        rows += [("warning", w, "predicted") for w in p.warnings]
        return pd.DataFrame(rows, columns=["fact", "value", "source"])
    try:
        facts = capture_load(st, cfg)
    except RunFailed as exc:
        return pd.DataFrame([("load failed", str(exc), "llama.cpp")], columns=["fact", "value", "source"])
    p = memory.plan(st.measured_spec, [st.host], cfg, with_max_ctx=False)
    host_plan = p.devices[HOST]
    gpu = gpu_backend()
    off = (f"{facts.offloaded_layers}/{facts.offloadable_layers}" if facts.offloaded_layers is not None
           else "no offload line: this llama.cpp build has no GPU backend, every layer runs on the CPU")
    rows.append(("layers offloaded to a GPU", off, "load log"))
    rows.append(("GPU backend", gpu or "none", "ggml devices"))
    rows.append(("flash attention", str(facts.flash_attn or facts.flash_attn_requested or "not reported"), "load log"))
    rows.append(("n_ctx (per sequence)", f"{facts.n_ctx} ({facts.n_ctx_seq})", "load log"))
    if facts.kv_caches:
        k = facts.kv_caches[0]
        rows.append(("KV cache", f"{facts.kv_cells} cells, {k.layers} layers, K {k.type_k} / V {k.type_v}, "
                                 f"{facts.kv_size_mib:.2f} MiB", "load log"))
    by_kind = {kind: comp for comp, _, kind in COMPONENTS if kind}
    attr_of = {kind: attr for _, attr, kind in COMPONENTS if kind}
    for b in facts.buffers:
        predicted = getattr(host_plan, attr_of[b.kind]) / MIB if b.kind in attr_of else float("nan")
        rows.append((f"{by_kind.get(b.kind, b.kind)} buffer {b.buffer}",
                     f"{b.mib:.2f} MiB on {b.device} (plan: {predicted:.2f} MiB for all {b.kind} buffers)",
                     "load log"))
    rows += [("warning", w, "load log") for w in facts.warnings[:5]]
    rows += [("CPU fallback", w, "load log") for w in facts.cpu_fallbacks[:5]]
    return pd.DataFrame(rows, columns=["fact", "value", "source"])


def headline(df, metric: str = "tg_tps", lever: str | None = None, value: str | None = None):
    """Publish the notebook's headline for the batch index: the measured figure of ``metric`` on this
    machine and the prediction for the same model and configuration (last matching pair). Displays it;
    returns None (so the cell shows it once)."""
    from v100lab.workbook import publish_headline

    m = df[(df["metric"] == metric) & (df["source"] == "measured")]
    if lever is not None:
        m = m[m["lever"] == lever]
    if value is not None:
        m = m[m["value"] == str(value)]
    measured = predicted = None
    model = device = ""
    for _, r in m.iloc[::-1].iterrows():
        p = df[(df["metric"] == metric) & (df["source"] == "predicted") & (df["model"] == r["model"])
               & (df["device"] == r["device"]) & (df["lever"] == r["lever"]) & (df["value"] == r["value"])]
        if len(p):
            measured, predicted = float(r["result"]), float(p["result"].iloc[0])
            model, device = r["model"], r["device"]
            break
    if measured is None:
        p = df[(df["metric"] == metric) & (df["source"] == "predicted")]
        if len(p):
            predicted, model, device = float(p["result"].iloc[-1]), p["model"].iloc[-1], p["device"].iloc[-1]
    publish_headline(measured, predicted, metric=metric.replace("_tps", ""), model=str(model), device=str(device))


# ================================================================================================
# 04 quantization
# ================================================================================================

def quant_ladder(sc: Scenario):
    """The quant ladder. When measuring: ``ladder_model``'s real ladder, built here by llama.cpp's quantizer
    and measured (decode, prompt, file size) beside the prediction from each file's own header; otherwise the scenario's
    model predicted on its device per quant (decode, prompt, file bytes). Lever "quant"."""
    from dataclasses import replace

    from v100lab import bench, zoo
    from v100lab.header import read_spec

    st = study(sc)
    cfg = _ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    rows: list[Observation] = []
    base_label = st.label
    for q, spec in (quant_specs(sc).items() if not st.measuring else ()):
        rows += predict_rows(spec, base_label, st.device, cfg, lever="quant", value=q, n_prompt=sc.n_prompt,
                             n_gen=sc.n_gen, metrics=("tg_tps", "pp_tps", "strict_ceiling_tg_tps"))
        rows.append(Observation(base_label, q, st.device.id, "quant", q, "file_bytes",
                                float(spec.weight_bytes + spec.header_bytes), "bytes", "predicted",
                                note="header + weights at llama-quantize's type mixture"))
    failures: list[dict[str, str]] = []
    if st.measuring:
        alias = sc.ladder_model
        paths = zoo.ladder(alias, tuple(q.upper() for q in sc.quants))
        label = f"{alias} (synthetic ladder)"
        f16 = read_spec(paths["F16"])
        a = arch_of(f16)
        for q in [q.upper() for q in sc.quants]:
            path = paths[q]
            spec = read_spec(path)
            rows += predict_rows(spec, label, st.host, cfg, lever="quant", value=q, n_prompt=sc.n_prompt,
                                 n_gen=sc.n_gen, metrics=("tg_tps", "pp_tps", "strict_ceiling_tg_tps"))
            rows.append(Observation(label, q, HOST, "quant", q, "file_bytes", float(path.stat().st_size), "bytes",
                                    "measured", note=path.name))
            if a is not None:
                from v100lab.skeleton import skeleton_spec

                ps = skeleton_spec(a, q)
                rows.append(Observation(label, q, HOST, "quant", q, "file_bytes",
                                        float(ps.weight_bytes + ps.header_bytes), "bytes", "predicted",
                                        note="header + weights at llama-quantize's type mixture"))
        got = bench.sweep(str(paths[sc.quants[0].upper()]), cfg, "model", [str(paths[q.upper()]) for q in sc.quants],
                          tests=_tests(sc), repetitions=sc.repetitions, progress=False, monitor=False)
        obs, failures = _measured(got, label)
        rows += [replace(o, lever="quant", value=o.quant) for o in obs]
    return _frame(rows, failures, why_not_measured=st.why_not_measured, ladder_model=sc.ladder_model)


QUALITY_LADDER = "default"


def quality_ladder(sc: Scenario):
    """Quality per quant, measured: perplexity of each rung of the default model's real ladder (SmolLM2-135M,
    its Q4_1 weights dequantized to F16 by llama.cpp as the reference) and its KL divergence from the
    reference, on Python's own ``pydoc_data.topics`` text. Empty (with the reason) when not measuring."""
    from v100lab import quality

    rows: list[Observation] = []
    if not sc.measure:
        return _frame(rows, why_not_measured="the scenario says measure: false",
                      corpus=quality.CORPUS_NAME)
    ref = f"{QUALITY_LADDER}:F16"
    results = [quality.evaluate(ref, None, n_ctx=sc.perplexity_ctx, n_chunks=sc.perplexity_chunks,
                                n_threads=sc.n_threads or None)]
    for q in sc.quants:
        results.append(quality.evaluate(f"{QUALITY_LADDER}:{q.upper()}", ref, n_ctx=sc.perplexity_ctx,
                                        n_chunks=sc.perplexity_chunks, n_threads=sc.n_threads or None))
    rows = quality.ladder_observations(results, "SmolLM2-135M (default ladder)")
    return _frame(rows, corpus=quality.CORPUS_NAME, reference=ref, why_not_measured="")


# ================================================================================================
# 05 GPU layers
# ================================================================================================

def gpu_layers_sweep(sc: Scenario):
    """-ngl from 0 to every layer (or ``gpu_layers``): predicted decode and prompt speed of the scenario's
    model on its device, with each value's fit; measured where llama.cpp here has a GPU backend."""
    from v100lab import memory

    st = study(sc)
    cfg = _ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    slots = memory.layer_slots(st.spec)
    values = list(sc.gpu_layers) or list(range(0, slots + 1))
    devs = _devices_for(st.device)
    rows: list[Observation] = []
    for ngl in values:
        c = cfg.with_(n_gpu_layers=ngl)
        fits = memory.plan(st.spec, devs, c, with_max_ctx=False).fits
        rows += predict_rows(st.spec, st.label, st.device, c, lever="n_gpu_layers", value=ngl,
                             n_prompt=sc.n_prompt, n_gen=sc.n_gen, fit=False,
                             metrics=("tg_tps", "pp_tps", "strict_ceiling_tg_tps"),
                             note="fits" if fits else "does not fit")
        rows.append(Observation(st.label, st.spec.file_type, st.device.id, "n_gpu_layers", str(ngl), "fits",
                                float(fits), "bool", "predicted"))
    gpu = gpu_backend()
    failures: list[dict[str, str]] = []
    measured_note = ""
    if st.measuring and gpu:
        step = max(1, len(values) // 6)
        obs, failures = measure_sweep(st, "n_gpu_layers", values[::step] + ([values[-1]] if values[-1] not in
                                      values[::step] else []), cfg, _tests(sc))
        rows += obs
    elif not gpu:
        measured_note = ("this llama.cpp build has no GPU backend (CPU only): -ngl changes nothing here, "
                         "so only predictions are shown")
    else:
        measured_note = st.why_not_measured
    return _frame(rows, failures, why_not_measured=measured_note, max_gpu_layers=memory.max_gpu_layers(
        st.spec, devs, cfg), layer_slots=slots, device_kind=st.device.kind)


def spill_effect(sc: Scenario):
    """The seed's 18 → 44 tok/s step explained: for each context size with -ngl 999 on the scenario's device,
    how many layer slots fit, the decode speed predicted with those (llama.cpp's --fit), the speed if every
    layer were on the GPU, and the KV cache bytes a token reads at the seed's depth (lever "n_ctx")."""
    from v100lab import memory, speed

    st = study(sc)
    devs = _devices_for(st.device)
    rows: list[Observation] = []
    depth = 128
    for n_ctx in sc.ctx_sizes:
        cfg = sc.run_config().with_(n_ctx=n_ctx, n_gpu_layers=ALL_LAYERS)
        ngl = memory.max_gpu_layers(st.spec, devs, cfg)
        slots = memory.layer_slots(st.spec)
        fitted = cfg.with_(n_gpu_layers=ngl)
        p_fit = speed.predict(st.spec, devs, fitted, depth=depth, n_prompt=max(1, sc.n_prompt))
        p_all = speed.predict(st.spec, [st.device], cfg, depth=depth, n_prompt=max(1, sc.n_prompt))
        kv_read = sum(w.kv_bytes for w in speed.decode_work(
            st.spec, speed.placement_for(st.spec, [st.device], cfg), cfg, depth).values())
        common = dict(model=st.label, quant=st.spec.file_type, device=st.device.id, lever="n_ctx",
                      value=str(n_ctx), source="predicted")
        rows += [Observation(metric="layers_on_gpu", result=float(ngl), unit="layers", **common),
                 Observation(metric="layers_spilled", result=float(slots - ngl), unit="layers", **common),
                 Observation(metric="tg_tps", result=p_fit.tg_tps, unit=TPS,
                             note=f"-ngl {ngl} (what fits); bound: {p_fit.bound}", **common),
                 Observation(metric="tg_tps_all_layers", result=p_all.tg_tps, unit=TPS,
                             note="every layer on the device, memory ignored", **common),
                 Observation(metric="kv_bytes_read_per_token", result=float(kv_read), unit="bytes",
                             note=f"at depth {depth}", **common)]
    return _frame(rows, depth=depth)


# ================================================================================================
# 06 context and KV cache
# ================================================================================================

def kv_memory(sc: Scenario):
    """KV cache (and recurrent state) bytes for every context × cache type: predicted for the scenario's
    model, and for the measured model both predicted and read from llama.cpp's load log (lever "n_ctx",
    note "cache_type=...")."""
    from v100lab import memory
    from v100lab.errors import RunFailed

    st = study(sc)
    rows: list[Observation] = []
    failures: list[dict[str, str]] = []
    models = [] if st.same_model_here else [(st.spec, st.label, st.device.id, False)]
    if st.measuring:
        models.append((st.measured_spec, st.measured_label, HOST, True))
    for spec, label, dev, measure in models:
        for ct in sc.cache_types:
            for n_ctx in sc.ctx_sizes:
                cfg = sc.run_config().with_(n_ctx=n_ctx, cache_type_k=ct, cache_type_v=ct,
                                            flash_attn="on" if ct not in ("f16", "f32", "bf16") else
                                            sc.flash_attn)
                kv = memory.kv_cache_bytes(spec, cfg) + memory.recurrent_bytes(spec, cfg)
                rows.append(Observation(label, spec.file_type, dev, "n_ctx", str(n_ctx), "kv_cache_bytes", float(kv),
                                        "bytes", "predicted", note=f"cache_type={ct}"))
                if measure:
                    try:
                        facts = capture_load(st, cfg)
                    except RunFailed as exc:
                        failures.append({"lever": "n_ctx", "value": f"{n_ctx} {ct}", "test": "load",
                                         "reason": str(exc)})
                        continue
                    mib = facts.kv_size_mib + facts.recurrent_size_mib
                    rows.append(Observation(label, spec.file_type, dev, "n_ctx", str(n_ctx), "kv_cache_bytes",
                                            float(mib * MIB), "bytes", "measured", note=f"cache_type={ct}"))
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


def depth_sweep(sc: Scenario):
    """Decode speed vs tokens already in the context (llama-bench -d): measured vs predicted on this
    machine, and predicted for the scenario's model on its device (lever "n_depth")."""
    st = study(sc)
    depths = list(sc.depths)
    cfg = _ctx_for(sc.run_config(), max(depths) + sc.n_gen + 1)
    rows: list[Observation] = []
    for d in depths:
        if not st.same_model_here:
            rows += predict_rows(st.spec, st.label, st.device, cfg, lever="n_depth", value=d, depth=d,
                                 n_gen=sc.n_gen, metrics=("tg_tps", "strict_ceiling_tg_tps"))
        if st.measuring:
            rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever="n_depth", value=d,
                                 depth=d, n_gen=sc.n_gen, metrics=("tg_tps", "strict_ceiling_tg_tps"))
    obs, failures = measure_sweep(st, "n_depth", depths, cfg, _tests(sc, pp=False))
    rows += obs
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


def quantized_v(sc: Scenario):
    """Quantized V needs flash attention: for V = f16 and V = q8_0 with flash attention off and on, what the
    memory plan predicts (KV bytes, llama.cpp's refusal) and what llama.cpp does here when it loads."""
    import pandas as pd

    from v100lab import memory
    from v100lab.errors import RunFailed

    st = study(sc)
    spec = st.measured_spec if st.measuring else st.spec
    out = []
    for fa, ctv in (("off", "f16"), ("off", "q8_0"), ("on", "q8_0")):
        cfg = sc.run_config().with_(flash_attn=fa, cache_type_k="q8_0" if ctv == "q8_0" else "f16",
                                    cache_type_v=ctv)
        p = memory.plan(spec, [st.host] if st.measuring else _devices_for(st.device), cfg, with_max_ctx=False)
        refused = [w for w in p.warnings if "refuses" in w]
        predicted = ("refused: " + refused[0].split(":")[0]) if refused else \
            f"loads; KV {memory.kv_cache_bytes(spec, cfg) / MIB:.1f} MiB"
        measured = "not measured"
        if st.measuring:
            try:
                facts = capture_load(st, cfg)
                measured = f"loaded; KV {facts.kv_size_mib:.1f} MiB, flash attention {facts.flash_attn or '?'}"
            except RunFailed as exc:
                measured = f"refused: {exc}"
        out.append({"flash attention": fa, "cache type K / V": f"{cfg.cache_type_k} / {ctv}",
                    "predicted": predicted, "llama.cpp here": measured})
    return pd.DataFrame(out)


# ================================================================================================
# 07 batch, flash attention, parallel, mmap/mlock, threads
# ================================================================================================

def _lever_rows(sc: Scenario, lever: str, values: Sequence[Any], cfg_of, tests: Sequence[str], depth: int = 0,
                backend: str | None = None, predict: bool = True):
    """Predicted rows for each value (this machine and the scenario's device) and the measured sweep."""
    st = study(sc)
    rows: list[Observation] = []
    metrics = tuple(m for m, on in (("tg_tps", any(t.startswith("tg") for t in tests)),
                                    ("pp_tps", any(t.startswith("pp") for t in tests))) if on)
    metrics = metrics or ("tg_tps", "pp_tps")
    for v in values:
        cfg = cfg_of(v)
        if predict:
            if not st.same_model_here:
                rows += predict_rows(st.spec, st.label, st.device, cfg, lever=lever, value=v, depth=depth,
                                     n_prompt=sc.n_prompt, n_gen=sc.n_gen, metrics=metrics + ("strict_ceiling_tg_tps",))
            if st.measuring:
                rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever=lever, value=v,
                                     depth=depth, n_prompt=sc.n_prompt, n_gen=sc.n_gen,
                                     metrics=metrics + ("strict_ceiling_tg_tps",))
    obs, failures = [], []
    if st.measuring and tests:
        from v100lab import bench

        got = []
        for v in values:
            got += bench.run_tests(str(st.measured_path), cfg_of(v), list(tests), [depth], sc.repetitions,
                                   backend=backend, monitor=False, lever=lever, value=v)
        obs, failures = _measured(got, st.measured_label)
    return rows + obs, failures


def batch_sweep(sc: Scenario):
    """-ub (with -b at least as large): prompt processing and decode, measured vs predicted (lever
    "n_ubatch"). The batch sizes change how many prompt tokens one graph holds, not single-stream decode."""
    st = study(sc)
    base = _ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    vals = list(sc.batch_sizes)

    def cfg_of(v):
        return base.with_(n_batch=max(v, base.n_batch), n_ubatch=v)

    rows, failures = _lever_rows(sc, "n_ubatch", vals, cfg_of, _tests(sc))
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


def flash_attn_sweep(sc: Scenario):
    """Flash attention off vs on at the deepest context of ``depths``: measured vs predicted (lever
    "flash_attn")."""
    st = study(sc)
    depth = max(sc.depths) if sc.depths else 0
    base = _ctx_for(sc.run_config(), depth + sc.n_prompt + sc.n_gen + 1)

    def cfg_of(v):
        return base.with_(flash_attn=v)

    rows, failures = _lever_rows(sc, "flash_attn", ["off", "on"], cfg_of, _tests(sc), depth=depth)
    return _frame(rows, failures, why_not_measured=st.why_not_measured, depth=depth)


def parallel_sweep(sc: Scenario):
    """--parallel through llama-server (the seed's server): total decode tok/s of all slots together and
    per stream, measured; the single-stream prediction beside them (the speed model predicts one stream;
    lever "n_parallel", metrics "tg_tps" total and "tg_tps_per_stream")."""
    from v100lab import bench
    from v100lab.backends.server import find_llama_server

    st = study(sc)
    base = _ctx_for(sc.run_config(), sc.n_gen + 1)
    vals = list(sc.parallel_slots)
    rows: list[Observation] = []
    for v in vals:
        cfg = base.with_(n_parallel=v, n_ctx=max(base.n_ctx, (sc.n_gen + 64) * v))
        if st.measuring:
            rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever="n_parallel", value=v,
                                 n_gen=sc.n_gen, metrics=("tg_tps",), note="one stream (the model predicts one)")
        else:
            rows += predict_rows(st.spec, st.label, st.device, cfg, lever="n_parallel", value=v, n_gen=sc.n_gen,
                                 metrics=("tg_tps",), note="one stream (the model predicts one)")
    failures: list[dict[str, str]] = []
    why = st.why_not_measured
    server = find_llama_server() if st.measuring and sc.n_gen else None
    if st.measuring and sc.n_gen and server is None:
        why = "no llama-server binary here (install the extra [server-bin]): --parallel not measured"
    if server is not None:
        got = []
        for v in vals:
            cfg = base.with_(n_parallel=v, n_ctx=max(base.n_ctx, (sc.n_gen + 64) * v))
            got += bench.run_tests(str(st.measured_path), cfg, [f"tg{sc.n_gen}"], [0], sc.repetitions,
                                   backend=f"server-bin:{server}", monitor=False, lever="n_parallel", value=v)
        obs, failures = _measured(got, st.measured_label)
        rows += obs
        for r in got:
            if r.get("status") != "ok":
                continue
            slot_ts = (r.get("extra") or {}).get("slot_ts") or []   # per repetition: each slot's tok/s
            flat = [x for rep in slot_ts for x in (rep if isinstance(rep, list) else [rep])]
            per = [float(x) for x in flat if x] or [float(r["avg_ts"]) / max(1, int(r.get("value") or 1))]
            rows.append(Observation(st.measured_label, r.get("model_file_type") or "", HOST, "n_parallel",
                                    str(r.get("value")), "tg_tps_per_stream", sum(per) / len(per), TPS, "measured",
                                    note=f"mean of {len(per)} slot(s); llama-server"))
    return _frame(rows, failures, why_not_measured=why)


def mmap_mlock(sc: Scenario):
    """Loading: mmap (default), --no-mmap, and --mlock — the time to load the model and create the context,
    and the time to the first token after it (pp + one decoded token), measured here (lever "load_mode").
    The speed model does not model loading, so these rows have no prediction."""
    from v100lab.backends import BenchTest
    from v100lab.backends.inprocess import InProcessBackend
    from v100lab.backends import MeasureFailed

    st = study(sc)
    rows: list[Observation] = []
    failures: list[dict[str, str]] = []
    if not st.measuring:
        return _frame(rows, why_not_measured=st.why_not_measured)
    base = _ctx_for(sc.run_config(), sc.n_prompt + 2)
    modes = (("mmap", dict(use_mmap=True, use_mlock=False)), ("no-mmap", dict(use_mmap=False, use_mlock=False)),
             ("mmap + mlock", dict(use_mmap=True, use_mlock=True)))
    n_prompt = max(1, sc.n_prompt)
    for _ in range(max(1, min(sc.repetitions, 3))):
        for name, flags in modes:
            cfg = base.with_(**flags)
            t0 = time.perf_counter()
            try:
                sess = InProcessBackend().open(st.measured_path, cfg)
            except MeasureFailed as exc:
                failures.append({"lever": "load_mode", "value": name, "test": "load", "reason": exc.reason})
                continue
            try:
                load_s = time.perf_counter() - t0
                m = sess.run(BenchTest(n_prompt, 1), 1, warmup=False)
                first = sum(m.samples_ns) / 1e9
                warn = [w for w in (sess.load or {}).get("warnings", []) if "mlock" in w.lower()]
            finally:
                sess.close()
            note = "; ".join(["measured in-process"] + warn[:1])
            for metric, val in (("load_s", load_s), ("first_token_s", first)):
                rows.append(Observation(st.measured_label, st.measured_spec.file_type, HOST, "load_mode", name,
                                        metric, float(val), "s", "measured", note=note))
    return _frame(rows, failures, why_not_measured="")


def threads_sweep(sc: Scenario):
    """-t: prompt processing and decode vs CPU threads, measured vs predicted (lever "n_threads")."""
    st = study(sc)
    base = _ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    vals = list(sc.thread_counts) or list(range(1, (os.cpu_count() or 1) + 1))

    def cfg_of(v):
        return base.with_(n_threads=v)

    rows, failures = _lever_rows(sc, "n_threads", vals, cfg_of, _tests(sc))
    return _frame(rows, failures, why_not_measured=st.why_not_measured)


# ================================================================================================
# summaries: each notebook's closing paragraph, written from this run's numbers
# ================================================================================================

def _pick(df, **eq):
    m = df
    for k, v in eq.items():
        if v is None:
            continue
        m = m[m[k].isin(v)] if isinstance(v, (list, tuple, set)) else m[m[k] == v]
    return m


def _one(df, **eq) -> float | None:
    m = _pick(df, **eq)
    return float(m["result"].mean()) if len(m) else None


def _fmt(x: float | None, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:,.{nd}f}"


def _pct(a: float | None, b: float | None) -> str:
    """a relative to b, as a signed percentage."""
    if a is None or b is None or not b:
        return "—"
    return f"{100 * (a / b - 1):+.0f} %"


def _markdown(lines: Sequence[str]):
    """Join sentences (already escaped with render.md_text) into one Markdown output."""
    from IPython.display import Markdown

    return Markdown("\n".join(f"- {line}" for line in lines if line))


def _md(template: str, **values) -> str:
    from v100lab.render import md_text

    return md_text(template, **values)


def _failures_line(*frames) -> str:
    fails = [f for df in frames for f in (df.attrs.get("failures") or [])]
    if not fails:
        return ""
    first = fails[0]
    return _md("{n} configuration(s) failed here; the first ({lever} = {value}): {reason}.", n=len(fails),
               lever=first["lever"], value=first["value"], reason=first["reason"])


def _above_line(*frames) -> str:
    """How many measured decode figures of this run exceed the strict ceiling of their model and device."""
    n = k = 0
    for df in frames:
        m = df[(df["source"] == "measured") & (df["unit"] == TPS) & df["metric"].astype(str).str.startswith("tg")] \
            if len(df) and "source" in df else df.iloc[0:0]
        n += len(m)
        k += int(m["above_ceiling"].fillna(False).astype(bool).sum()) if len(m) else 0
    if not k:
        return ""
    return _md("{k} of {n} measured decode figures are above the strict bandwidth ceiling of their model and device "
               "(marked ✕ in the plots).", k=k, n=n)


def _not_measured_line(df) -> str:
    why = df.attrs.get("why_not_measured")
    return _md("Nothing was measured for this step: {why}.", why=why) if why else ""


def _pairs(df, metric: str, lever: str | None = None):
    """(value, measured, predicted) for every measured row that has a prediction for the same model,
    device, lever and value."""
    out = []
    m = _pick(df, metric=metric, source="measured", lever=lever)
    for _, r in m.iterrows():
        p = _one(df, metric=metric, source="predicted", model=r["model"], device=r["device"], lever=r["lever"],
                 value=r["value"])
        if p:
            out.append((r["value"], float(r["result"]), p))
    return out


def _agreement(pairs) -> str:
    if not pairs:
        return "—"
    errs = sorted(abs(m / p - 1) for _, m, p in pairs)
    med = errs[len(errs) // 2] if len(errs) % 2 else (errs[len(errs) // 2 - 1] + errs[len(errs) // 2]) / 2
    return f"median |error| {100 * med:.0f} % (worst {100 * errs[-1]:.0f} %, {len(errs)} points)"


def summary_overview(sc: Scenario, stairs):
    """The staircase in sentences: which claims exceed the ceiling, how prediction and measurement compare."""
    lines = []
    seed = stairs[stairs["device"] != HOST]
    claimed = _pick(seed, source="claimed", metric="tg_tps")
    if len(claimed):
        above = claimed[claimed["above_ceiling"].fillna(False).astype(bool)]
        stages_above = list(dict.fromkeys(above["value"]))
        dev = claimed["device"].iloc[0]
        lines.append(_md("Of the seed's {n} claimed figures, {k} exceed the strict ceiling of its assumed model on "
                         "{dev}{stages}.", n=len(claimed), k=len(above), dev=dev,
                         stages=(" — stage(s) " + ", ".join(stages_above) + ": no card decodes faster than it reads "
                                 "the weights, so the measurement or the model size is wrong") if stages_above else ""))
    for stage in dict.fromkeys(_pick(seed, metric="tg_tps", source="predicted")["value"]):
        c = _pick(claimed, value=stage)["result"]
        p = _one(seed, metric="tg_tps", source="predicted", value=stage)
        s = _one(seed, metric="strict_ceiling_tg_tps", value=stage)
        lines.append(_md("Stage {stage}: claimed {c}, predicted {p} tok/s (strict ceiling {s}).", stage=stage,
                         c=(f"{c.min():g}–{c.max():g}" if len(c) else "—"), p=_fmt(p), s=_fmt(s)))
    here = stairs[stairs["device"] == HOST]
    pairs = _pairs(here, "tg_tps", "stage")
    if pairs:
        ms = [m for _, m, _ in pairs]
        lines.append(_md("On this machine {model} decoded at {lo}–{hi} tok/s across the stages' flags; "
                         "measured vs predicted: {agree}.", model=here["model"].iloc[0], lo=_fmt(min(ms)),
                         hi=_fmt(max(ms)), agree=_agreement(pairs)))
    lines += [_above_line(stairs), _failures_line(stairs), _not_measured_line(stairs)]
    return _markdown(lines)


def summary_triangle(sc: Scenario, mem, grid):
    """The triangle with numbers: what the chosen configuration needs, what fits, the largest contexts."""
    st = study(sc)
    lines = []
    first = mem["note"].iloc[0] if len(mem) else ""
    pred = _pick(mem, source="predicted", metric="bytes", note=first)
    for dev, g in pred.groupby("device", sort=False):
        total = g["result"].sum()
        cap = _one(mem, metric="capacity_bytes", device=dev, note=first)
        parts = ", ".join(f"{v} {r / GIB:.2f}" for v, r in zip(g["value"], g["result"]) if r > 0)
        lines.append(_md("{model} {quant} with -c {ctx} needs {total} GiB on {dev} ({parts} GiB) of {cap} GiB: "
                         "{verdict}.", model=st.label, quant=st.spec.file_type, ctx=sc.n_ctx or st.spec.n_ctx_train,
                         total=_fmt(total / GIB, 2), dev=dev, parts=parts, cap=_fmt((cap or 0) / GIB, 1),
                         verdict=("fits" if cap and total <= cap else
                                  f"does not fit, {_fmt((total - (cap or 0)) / MIB, 0)} MiB over")))
    meas = _pick(mem, source="measured", metric="bytes")
    if len(meas):
        p = _pick(mem, source="predicted", metric="bytes", note=meas["note"].iloc[0], device=HOST)
        p = p[p["value"].isin(meas["value"])]
        lines.append(_md("llama.cpp reported {m} MiB of buffers for {model} here; the plan predicted {p} MiB ({d}).",
                         m=_fmt(meas["result"].sum() / MIB), model=meas["model"].iloc[0],
                         p=_fmt(p["result"].sum() / MIB), d=_pct(p["result"].sum(), meas["result"].sum())))
    fits = _pick(grid, metric="fits", lever="n_ctx")
    if len(fits):
        lines.append(_md("Of {n} combinations of quant × context × cache type, {k} fit on {dev}.", n=len(fits),
                         k=int(fits["result"].sum()), dev=grid.attrs.get("device_name", st.device.id)))
    mc = _pick(grid, metric="max_ctx")
    for ct in dict.fromkeys(mc["note"]):
        g = mc[mc["note"] == ct].sort_values("result")
        if len(g):
            lo, hi = g.iloc[0], g.iloc[-1]
            lines.append(_md("Largest context with {ct}: {hi} tokens at {qh}, {lo} at {ql}.",
                             ct=ct.replace("cache_type=", "KV cache "), hi=int(hi["result"]), qh=hi["quant"],
                             lo=int(lo["result"]), ql=lo["quant"]))
    lines.append(_failures_line(mem))
    return _markdown(lines)


def summary_ceiling(sc: Scenario, ceil, cat, roof, apple_df):
    """The ceiling in sentences: per quant on the device, the seed's table, the catalog, this machine, Apple."""
    st = study(sc)
    lines = []
    mine = _pick(ceil, model=st.label, device=st.device.id)
    c = _pick(mine, metric="ceiling_tg_tps")
    if len(c):
        hi, lo = c.loc[c["result"].idxmax()], c.loc[c["result"].idxmin()]
        ratios = [(_one(mine, metric="tg_tps", value=v) or 0) / r for v, r in zip(c["value"], c["result"])]
        lines.append(_md("On {dev} the seed's ceiling for {model} runs from {lo} tok/s ({ql}) to {hi} tok/s ({qh}); "
                         "the prediction reaches {a}–{b} % of it.", dev=st.device.id, model=st.label,
                         lo=_fmt(lo["result"]), ql=lo["value"], hi=_fmt(hi["result"]), qh=hi["value"],
                         a=f"{100 * min(ratios):.0f}", b=f"{100 * max(ratios):.0f}"))
    cl = _pick(ceil, source="claimed")
    if len(cl):
        diffs = []
        for _, r in cl.iterrows():
            ours = _one(ceil, source="predicted", metric="ceiling_tg_tps", model=r["model"], value=r["value"])
            diffs.append(f"{r['value']} {r['result']:g} vs {_fmt(ours)}")
        lines.append(_md("The seed's ceiling table against bandwidth / weight bytes of its assumed model: {d}.",
                         d="; ".join(diffs)))
    p = _pick(cat, metric="tg_tps", source="predicted")
    if len(p):
        best = p.loc[p["result"].idxmax()]
        n_fit = int(p["note"].str.startswith("fits").sum())
        lines.append(_md("Across {n} devices the model fits on {k}; the fastest predicted is {dev} at {tps} tok/s.",
                         n=len(p), k=n_fit, dev=best["value"], tps=_fmt(best["result"])))
    m = _pick(roof, source="measured", metric="tg_tps")
    if len(m):
        r = m.iloc[0]
        pr = _one(roof, source="predicted", metric="tg_tps", value=r["value"], model=r["model"])
        ce = _one(roof, metric="ceiling_tg_tps", value=r["value"], model=r["model"])
        lines.append(_md("Here {model} {q} decoded at {m} tok/s: {f} of this machine's bandwidth ceiling ({c}), "
                         "predicted {p} ({e}); the host is {cal}.", model=r["model"], q=r["value"], m=_fmt(r["result"]),
                         f=f"{100 * r['result'] / ce:.0f} %" if ce else "—", c=_fmt(ce), p=_fmt(pr),
                         e=_pct(pr, r["result"]), cal="calibrated" if roof.attrs.get("calibrated") else
                         "not calibrated (run v100lab calibrate)"))
    for metric, name in (("tg_tps", "tg128"), ("pp_tps", "pp512")):
        pairs = []
        for _, r in _pick(apple_df, metric=metric, source="claimed").iterrows():
            pr = _one(apple_df, metric=metric, source="predicted", value=r["value"], quant=r["quant"])
            if pr:
                pairs.append((r["value"], r["result"], pr))
        if pairs:
            lines.append(_md("Apple Silicon {name}, predicted vs published: {agree}.", name=name,
                             agree=_agreement([(v, m, p) for v, m, p in pairs])))
    lines += [_above_line(roof), _failures_line(roof)]
    return _markdown(lines)


def summary_baseline(sc: Scenario, base, diag):
    """The baseline in sentences."""
    st = study(sc)
    lines = []
    for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt processing")):
        for v, m, p in _pairs(base, metric):
            lines.append(_md("{name}: measured {m} tok/s here, predicted {p} ({e}).", name=name.capitalize(),
                             m=_fmt(m), p=_fmt(p), e=_pct(p, m)))
    if st.device.id != HOST:
        p = _one(base, metric="tg_tps", source="predicted", device=st.device.id)
        s = _one(base, metric="strict_ceiling_tg_tps", device=st.device.id)
        n = _pick(base, metric="tg_tps", source="predicted", device=st.device.id)
        lines.append(_md("{model} on {dev} with these flags: predicted {p} tok/s of a {s} tok/s ceiling ({note}).",
                         model=st.label, dev=st.device.id, p=_fmt(p), s=_fmt(s),
                         note=n["note"].iloc[0] if len(n) else ""))
    off = diag[diag["fact"].str.startswith("layers")]
    if len(off):
        lines.append(_md("Load log: {fact} — {value}.", fact=off["fact"].iloc[0], value=off["value"].iloc[0]))
    lines += [_above_line(base), _failures_line(base), _not_measured_line(base)]
    return _markdown(lines)


def summary_quantization(sc: Scenario, ladder, qual):
    """The quant ladder and quality in sentences."""
    lines = []
    tg = _pick(ladder, metric="tg_tps", source="measured")
    if len(tg):
        fast, slow = tg.loc[tg["result"].idxmax()], tg.loc[tg["result"].idxmin()]
        lines.append(_md("Measured decode on the {ladder} ladder: fastest {qf} at {f} tok/s, slowest {qs} at {s} "
                         "tok/s.", ladder=tg["model"].iloc[0], qf=fast["value"], f=_fmt(fast["result"]),
                         qs=slow["value"], s=_fmt(slow["result"])))
        for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt")):
            pairs = _pairs(ladder, metric, "quant")
            if pairs:
                lines.append(_md("{name} measured vs predicted: {agree}.", name=name.capitalize(),
                                 agree=_agreement(pairs)))
        sizes = _pairs(ladder.assign(result=ladder["result"]), "file_bytes", "quant")
        if sizes:
            lines.append(_md("File sizes, predicted from the architecture vs written by the quantizer: {agree}.",
                             agree=_agreement(sizes)))
    p = _pick(ladder, metric="tg_tps", source="predicted", device=study(sc).device.id, model=study(sc).label)
    if len(p):
        lines.append(_md("{model} on {dev}, predicted decode: {pairs}.", model=study(sc).label, dev=study(sc).device.id,
                         pairs=", ".join(f"{v} {r:.1f}" for v, r in zip(p["value"], p["result"]))))
    ppl = _pick(qual, metric="perplexity")
    if len(ppl):
        ref = _one(ppl, value="F16")
        worst = ppl.loc[ppl["result"].idxmax()]
        kl = _pick(qual, metric="kl_divergence")
        kls = ", ".join(f"{v} {r:.4f}" for v, r in zip(kl["value"], kl["result"]))
        lines.append(_md("Perplexity of the F16 reference {r}; the worst quant, {q}, {w} ({d}). KL divergence from "
                         "F16 (nats per token): {kls}.", r=_fmt(ref, 2), q=worst["value"], w=_fmt(worst["result"], 2),
                         d=_pct(worst["result"], ref), kls=kls or "—"))
        lines.append(_md("Text scored: {corpus}.", corpus=qual.attrs.get("corpus", "")))
    lines += [_above_line(ladder), _failures_line(ladder, qual), _not_measured_line(qual)]
    return _markdown(lines)


def summary_gpu_layers(sc: Scenario, ngl, spill_df):
    """-ngl and the spill effect in sentences."""
    st = study(sc)
    lines = []
    p = _pick(ngl, metric="tg_tps", source="predicted", lever="n_gpu_layers")
    if len(p):
        vals = p.assign(v=p["value"].astype(int)).sort_values("v")
        lines.append(_md("Predicted decode for {model} on {dev}: {a} tok/s with -ngl {va}, {b} tok/s with -ngl {vb}; "
                         "at most {m} of {n} layer slots fit.", model=st.label, dev=st.device.id,
                         a=_fmt(vals["result"].iloc[0]), va=vals["value"].iloc[0], b=_fmt(vals["result"].iloc[-1]),
                         vb=vals["value"].iloc[-1], m=ngl.attrs.get("max_gpu_layers"), n=ngl.attrs.get("layer_slots")))
    if ngl.attrs.get("why_not_measured"):
        lines.append(_md("Not measured: {why}.", why=ngl.attrs["why_not_measured"]))
    sp = _pick(spill_df, metric="tg_tps")
    if len(sp) > 1:
        sp = sp.assign(v=sp["value"].astype(int)).sort_values("v")
        small, large = sp.iloc[0], sp.iloc[-1]
        s_small = _one(spill_df, metric="layers_spilled", value=small["value"])
        s_large = _one(spill_df, metric="layers_spilled", value=large["value"])
        kv_s = _one(spill_df, metric="kv_bytes_read_per_token", value=small["value"])
        kv_l = _one(spill_df, metric="kv_bytes_read_per_token", value=large["value"])
        if s_small == s_large:
            lines.append(_md("With -ngl 999 the same {n} layer slot(s) stay on the CPU at every context from {cs} to "
                             "{cl} tokens on {dev}: predicted {ts} → {tl} tok/s, no spill step here.",
                             n=int(s_small or 0), cs=small["value"], cl=large["value"], dev=study(sc).device.id,
                             ts=_fmt(small["result"]), tl=_fmt(large["result"])))
        else:
            lines.append(_md("With -ngl 999, -c {cl} leaves {sl} layer slot(s) on the CPU and predicts {tl} tok/s; "
                             "-c {cs} leaves {ss} and predicts {ts} tok/s ({ratio}×). The KV cache a token reads at "
                             "depth {d} is {kl} KiB vs {ks} KiB ({kd}) while the layers on the CPU go from {sl} to "
                             "{ss}.", cl=large["value"], sl=int(s_large or 0), tl=_fmt(large["result"]),
                             cs=small["value"], ss=int(s_small or 0), ts=_fmt(small["result"]),
                             ratio=_fmt(small["result"] / large["result"] if large["result"] else None, 2),
                             d=spill_df.attrs.get("depth"), kl=_fmt((kv_l or 0) / 1024), ks=_fmt((kv_s or 0) / 1024),
                             kd=_pct(kv_s, kv_l)))
    lines.append(_failures_line(ngl))
    return _markdown(lines)


def summary_context(sc: Scenario, kv, depth_df, qv):
    """Context, KV cache and quantized V in sentences."""
    lines = []
    pred = _pick(kv, source="predicted")
    if len(pred):
        big = str(max(int(v) for v in pred["value"]))
        per_ct = ", ".join(f"{n.replace('cache_type=', '')} {r / MIB:,.0f} MiB"
                           for n, r in _pick(pred, value=big, model=pred["model"].iloc[0])[["note", "result"]].values)
        lines.append(_md("KV cache of {model} at -c {ctx}: {per}.", model=pred["model"].iloc[0], ctx=big, per=per_ct))
    meas = _pick(kv, source="measured")
    if len(meas):
        pairs = []
        for _, r in meas.iterrows():
            p = _one(kv, source="predicted", model=r["model"], value=r["value"], note=r["note"])
            if p:
                pairs.append((r["value"], r["result"], p))
        lines.append(_md("KV bytes predicted vs llama.cpp's log: {agree}.", agree=_agreement(pairs)))
    m = _pick(depth_df, metric="tg_tps", source="measured")
    if len(m) > 1:
        m = m.assign(v=m["value"].astype(int)).sort_values("v")
        lines.append(_md("Measured decode: {a} tok/s at depth {da}, {b} at depth {db} ({d}); "
                         "measured vs predicted: {agree}.", a=_fmt(m["result"].iloc[0]), da=m["value"].iloc[0],
                         b=_fmt(m["result"].iloc[-1]), db=m["value"].iloc[-1],
                         d=_pct(m["result"].iloc[-1], m["result"].iloc[0]), agree=_agreement(_pairs(depth_df, "tg_tps"))))
    p = _pick(depth_df, metric="tg_tps", source="predicted", device=study(sc).device.id, model=study(sc).label)
    if len(p) > 1 and not study(sc).same_model_here:
        p = p.assign(v=p["value"].astype(int)).sort_values("v")
        lines.append(_md("Predicted for {model} on {dev}: {a} → {b} tok/s from depth {da} to {db}.",
                         model=study(sc).label, dev=study(sc).device.id, a=_fmt(p["result"].iloc[0]),
                         b=_fmt(p["result"].iloc[-1]), da=p["value"].iloc[0], db=p["value"].iloc[-1]))
    if len(qv):
        row = qv[(qv["flash attention"] == "off") & qv["cache type K / V"].str.endswith("q8_0")]
        if len(row):
            lines.append(_md("q8_0 V with flash attention off — predicted: {p}; llama.cpp here: {m}.",
                             p=row["predicted"].iloc[0], m=row["llama.cpp here"].iloc[0]))
    lines += [_above_line(depth_df), _failures_line(kv, depth_df), _not_measured_line(depth_df)]
    return _markdown(lines)


def _effect(df, metric: str, lever: str) -> str:
    m = _pick(df, metric=metric, source="measured", lever=lever)
    if len(m) < 2:
        return ""
    g = m.groupby("value")["result"].mean()
    return (f"{METRIC_NAMES.get(metric, metric)} {g.min():.1f}–{g.max():.1f} tok/s "
            f"(best {g.idxmax()}, {100 * (g.max() / g.min() - 1):.0f} % above the worst)")


METRIC_NAMES = {"tg_tps": "decode", "pp_tps": "prompt", "tg_tps_per_stream": "per-stream decode"}


def summary_levers(sc: Scenario, batch, fa, par, load, threads):
    """Batch, flash attention, parallel, loading and threads in sentences."""
    lines = []
    for df, lever, name in ((batch, "n_ubatch", "-ub"), (fa, "flash_attn", "-fa"), (threads, "n_threads", "-t"),
                            (par, "n_parallel", "-np (total over slots)")):
        parts = [e for e in (_effect(df, "pp_tps", lever), _effect(df, "tg_tps", lever)) if e]
        if lever == "n_parallel":
            parts.append(_effect(df, "tg_tps_per_stream", lever))
        parts = [p for p in parts if p]
        if parts:
            pairs = _pairs(df, "tg_tps", lever) + _pairs(df, "pp_tps", lever)
            lines.append(_md("{name}: {effects}; measured vs predicted: {agree}.", name=name, effects="; ".join(parts),
                             agree=_agreement(pairs) if lever != "n_parallel" else "one-stream prediction only"))
        elif df.attrs.get("why_not_measured"):
            lines.append(_md("{name}: not measured — {why}.", name=name, why=df.attrs["why_not_measured"]))
    ld = _pick(load, metric="load_s")
    if len(ld):
        g = ld.groupby("value")["result"].median()
        f = _pick(load, metric="first_token_s").groupby("value")["result"].median()
        lines.append(_md("Loading (median): {modes}.", modes="; ".join(
            f"{k} {g[k]:.2f} s to load, {f.get(k, float('nan')):.2f} s to the first token" for k in g.index)))
    lines += [_above_line(batch, fa, par, threads), _failures_line(batch, fa, par, load, threads)]
    return _markdown(lines)


# ================================================================================================
# 08 the final configuration
# ================================================================================================

@lru_cache(maxsize=8)
def final_config(sc: Scenario):
    """The tuned configuration for the scenario (:func:`v100lab.advisor.tune`): the fastest that fits the
    device with a margin at ``target_ctx`` and ``n_parallel``, over ``quants`` when the model is a skeleton
    family or a synthetic ladder; measured and chosen by measurement when the device is this machine and the
    scenario measures. Cached per scenario (the notebook's cells share it)."""
    from v100lab import advisor

    st = study(sc)
    model = sc.model
    quants = None
    # the scenario's quants of 4 bits and more (advisor.DEFAULT_QUANTS: the seed's own quality verdict on
    # Q3_K_M; notebook 04 measures what lower ones cost)
    family = tuple(q.upper() for q in sc.quants if q.upper() in advisor.DEFAULT_QUANTS) or None
    if st.skeleton:
        model = parse_skeleton_name(model)[0]
        quants = family
    elif model.partition(":")[0].startswith("synth-") and ":" not in model:
        quants = family
    measure = st.measuring and st.device.kind == "cpu" and not sc.is_stand_in
    return advisor.tune(model, st.device, min_ctx=sc.target_ctx, parallel=sc.n_parallel, quants=quants,
                        measure=measure, measure_top=2 if sc.repetitions <= 2 else 3, n_gen=max(1, sc.n_gen),
                        repetitions=sc.repetitions, host=gpu_host() if st.device.kind != "cpu" else None)


def command_reasons(sc: Scenario):
    """The tuned llama-server command, one row per flag with why it is there and what it buys."""
    import pandas as pd

    t = final_config(sc)
    rows = [{"flag": r.flag, "why": r.why,
             "buys (tok/s)": None if r.delta_tps is None else round(r.delta_tps, 2),
             "saves (MiB)": None if r.delta_bytes is None else round(r.delta_bytes / MIB, 1)} for r in t.reasons]
    return pd.DataFrame(rows)


def tuned_command(sc: Scenario) -> str:
    """The tuned llama-server command line."""
    return final_config(sc).command


def _stage_configs(sc: Scenario, tuned) -> list[tuple[str, str, RunConfig]]:
    """This scenario's own staircase: llama.cpp's defaults at the model's own quant, then the tuned
    configuration's changes one at a time (quant, layers, context, KV cache and flash attention, batch, mlock)."""
    own = study(sc).spec.file_type
    t = tuned.config
    cfg = RunConfig(n_ctx=RunConfig().n_ctx)
    stages = [("1 llama.cpp defaults", own, cfg)]
    steps = [
        ("quant", tuned.quant != own, None),
        ("-ngl", cfg.n_gpu_layers != t.n_gpu_layers and study(sc).device.kind != "cpu",
         dict(n_gpu_layers=t.n_gpu_layers)),
        ("-c", cfg.n_ctx != t.n_ctx, dict(n_ctx=t.n_ctx)),
        ("KV cache / -fa", (cfg.cache_type_k, cfg.cache_type_v, cfg.flash_attn) !=
         (t.cache_type_k, t.cache_type_v, t.flash_attn),
         dict(cache_type_k=t.cache_type_k, cache_type_v=t.cache_type_v, flash_attn=t.flash_attn)),
        ("-b/-ub", (cfg.n_batch, cfg.n_ubatch) != (t.n_batch, t.n_ubatch), dict(n_batch=t.n_batch, n_ubatch=t.n_ubatch)),
        ("--mlock", cfg.use_mlock != t.use_mlock, dict(use_mlock=t.use_mlock)),
        ("-np", cfg.n_parallel != t.n_parallel, dict(n_parallel=t.n_parallel)),
    ]
    quant = own
    for name, changed, change in steps:
        if not changed:
            continue
        if change is None:
            quant = tuned.quant
            label = f"{len(stages) + 1} {tuned.quant}"
        else:
            cfg = cfg.with_(**change)
            label = f"{len(stages) + 1} {name} " + " ".join(str(v) for v in change.values())
        stages.append((label, quant, cfg))
    return stages


def own_staircase(sc: Scenario):
    """The scenario's own staircase, from llama.cpp's defaults to the tuned configuration, one change per
    stage: predicted on the scenario's device (with what fits) and, when measuring, measured here with each
    stage's flags (lever "stage")."""
    from v100lab import bench, zoo

    st = study(sc)
    tuned = final_config(sc)
    rows: list[Observation] = []
    failures: list[dict[str, str]] = []
    for label, quant, cfg in _stage_configs(sc, tuned):
        try:
            spec = spec_at_quant(sc.model, quant)
        except ConfigError:
            spec = st.spec
        rows += predict_rows(spec, st.label, st.device, cfg, lever="stage", value=label, depth=sc.target_ctx // 2,
                             n_gen=sc.n_gen, metrics=("tg_tps", "strict_ceiling_tg_tps"))
        if st.measuring and sc.n_gen:
            model, note = _stage_model(st, quant)
            mcfg = _ctx_for(cfg.with_(n_threads=sc.n_threads, n_parallel=1), sc.n_gen + 1)
            try:
                from v100lab.header import read_spec

                mspec = read_spec(zoo.resolve(model))
            except V100labError as exc:
                failures.append({"lever": "stage", "value": label, "test": "", "reason": str(exc)})
                continue
            if not st.same_model_here:
                rows += predict_rows(mspec, st.measured_label, st.host, mcfg, lever="stage", value=label,
                                     n_gen=sc.n_gen, metrics=("tg_tps", "strict_ceiling_tg_tps"), note=note)
            got = bench.run_tests(model, mcfg, [f"tg{sc.n_gen}"], [0], sc.repetitions, monitor=False, lever="stage",
                                  value=label)
            obs, fails = _measured(got, st.measured_label)
            rows += [_renote(o, note) for o in obs]
            failures += fails
    return _frame(rows, failures, why_not_measured=st.why_not_measured, command=tuned.command)


def seed_verdict_table(sc: Scenario):
    """The seed's final command against the tuned one for the seed's device and assumed model, flag by flag
    (:func:`v100lab.advisor.seed_verdict`); empty when the scenario's claims are not the seed's."""
    import pandas as pd

    from v100lab import advisor
    from v100lab.calibration import load_seed_claims

    if sc.claims != "seed":
        return pd.DataFrame(columns=["flag", "seed", "tuned", "verdict"])
    claims = load_seed_claims()
    v = advisor.seed_verdict(device=claims["device"], arch=claims["model"]["arch"], min_ctx=2048)
    df = v.frame()
    df.attrs.update(seed_command=" ".join(v.seed_argv), tuned_command=v.tuned.command,
                    seed_predicted=v.seed_candidate.tg_tps, tuned_predicted=v.tuned.best.tg_tps,
                    claimed=v.claimed_tps, ceiling=v.seed_candidate.ceiling_tg_tps, seed_problem=v.seed_problem)
    return df


def summary_final(sc: Scenario, stairs, verdict):
    """The final configuration in sentences."""
    st = study(sc)
    t = final_config(sc)
    b = t.best
    lines = [_md("Tuned for {model} on {dev} at -c {ctx}: {q}, predicted {p} tok/s decode (ceiling {c}, "
                 "{bound}-bound) and {pp} tok/s prompt, {m} MiB left of the device.", model=st.label, dev=t.device,
                 ctx=sc.target_ctx, q=b.quant, p=_fmt(b.tg_tps), c=_fmt(b.ceiling_tg_tps), bound=b.bound,
                 pp=_fmt(b.pp_tps, 0), m=_fmt(b.margin_bytes / MIB, 0))]
    if b.measured_tg_tps is not None:
        lines.append(_md("Measured here: {m} tok/s; the prediction is {e} off it.", m=_fmt(b.measured_tg_tps),
                         e=_pct(b.tg_tps, b.measured_tg_tps)))
    fit = sum(1 for c in t.candidates if c.fits)
    lines.append(_md("{k} of {n} candidate configurations fit with the margin.", k=fit, n=len(t.candidates)))
    p = _pick(stairs, metric="tg_tps", source="predicted", device=st.device.id, model=st.label)
    if len(p) > 1:
        lines.append(_md("The scenario's staircase, predicted on {dev}: {first} → {last} tok/s over {n} stages.",
                         dev=st.device.id, first=_fmt(p["result"].iloc[0]), last=_fmt(p["result"].iloc[-1]),
                         n=len(p)))
    pairs = _pairs(stairs, "tg_tps", "stage")
    if pairs:
        lines.append(_md("Each stage's flags measured here on {model}: {lo}–{hi} tok/s; measured vs predicted: "
                         "{agree}.", model=st.measured_label, lo=_fmt(min(m for _, m, _ in pairs)),
                         hi=_fmt(max(m for _, m, _ in pairs)), agree=_agreement(pairs)))
    if len(verdict):
        a = verdict.attrs
        lines.append(_md("The seed's command, predicted on its device: {s} tok/s (claimed {lo}–{hi}, ceiling {c}){p}; "
                         "the tuned one: {t} tok/s. Flags that differ: {diff}.", s=_fmt(a.get("seed_predicted")),
                         lo=f"{a['claimed'][0]:g}", hi=f"{a['claimed'][1]:g}", c=_fmt(a.get("ceiling")),
                         p=f" — {a['seed_problem']}" if a.get("seed_problem") else "", t=_fmt(a.get("tuned_predicted")),
                         diff=", ".join(verdict[verdict["seed"] != verdict["tuned"]]["flag"]) or "none"))
    lines += [_above_line(stairs), _failures_line(stairs), _not_measured_line(stairs)]
    return _markdown(lines)
