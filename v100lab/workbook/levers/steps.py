"""The core every notebook step shares: a scenario resolved once (:func:`study` → :class:`Study`: the model
studied, the device predicted for, the model measured on this machine or why none is), and the helpers that
turn predictions and measurements into tidy rows (:func:`predict_rows`, :func:`measure_sweep`,
:func:`capture_load`, :func:`measured_rows`) and rows into a frame whose measured decode figures are flagged
against their physical ceiling (:func:`lever_frame`, with :func:`v100lab.facts.results.flag_above_ceiling`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from v100lab.measure import harness, reference
from v100lab.predict import drift_scaling
from v100lab.predict import speed
from v100lab.models import zoo
from v100lab.measure.backends.inprocess import cpu_gpu_info
from v100lab.measure.backends.server import served_model
from v100lab.measure.calibration import measured_host
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError, RunFailed, V100labError
from v100lab.gguf.llama_context import CTX_PAD, pad
from v100lab.facts.loadlog import load_and_capture
from v100lab.predict.memory import fit_gpu_layers
from v100lab.models.resolve import resolve
from v100lab.facts.results import TPS, Observation, flag_above_ceiling, tidy_frame
from v100lab.workbook.scenario import NO_GPU, Scenario, keys
from v100lab.advise.seed import load_seed_claims, seed_host_device
from v100lab.gguf.skeleton import SKELETON_PREFIX, arch_spec_of, is_skeleton_name, parse_skeleton_name, skeleton_spec
from v100lab.facts.spec import ModelSpec
from v100lab.models.worker import call_isolated

log = logging.getLogger(__name__)

HOST = "host"
GIB = 2**30
MIB = 2**20

# The scenario keys :func:`study` reads (what is studied, for which device, what is measured here): every
# notebook reads them, so every notebook's parameters cell holds them.
STUDY_PARAMETERS = ("model", "stand_in_model", "device", "measure", "server_url")


def parameters(*names: str) -> tuple[str, ...]:
    """A notebook's parameters: :data:`STUDY_PARAMETERS` and ``names``, in the schema's order — what the
    notebook's parameters cell holds (``v100lab.workbook.scenario.parameters_cell_source(keys)`` writes it).
    An unknown name is a ConfigError (so a renamed key cannot leave a notebook behind)."""
    known = keys()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"notebook parameters: unknown scenario key '{unknown[0]}'")
    wanted = set(STUDY_PARAMETERS) | set(names)
    return tuple(k for k in known if k in wanted)


# Memory components: MemoryPlan/DeviceMemory field → llama.cpp's buffer kind in the load log
COMPONENTS = (("weights", "weights_bytes", "model"), ("KV cache", "kv_cache_bytes", "KV"),
              ("recurrent state", "recurrent_bytes", "RS"), ("compute", "compute_bytes", "compute"),
              ("output", "output_bytes", "output"), ("runtime overhead", "overhead_bytes", None))


@lru_cache(maxsize=256)
def _spec_at_quant_cached(model: str, quant: str) -> ModelSpec:
    parsed = parse_skeleton_name(model)
    if parsed is not None:
        return skeleton_spec(parsed[0], quant)
    spec = resolve(model, build=True).spec
    if spec.file_type.upper() == quant:
        return spec
    a = arch_spec_of(spec)
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
    device: Any                      # v100lab.facts.devices.Device the predictions are for
    host: Any                        # this machine (measured)
    measured: str | None             # alias or path measured on this machine (None: nothing is measured)
    measured_path: Path | None
    measured_spec: ModelSpec | None
    measured_label: str              # "" when nothing is measured
    why_not_measured: str            # "" when measuring
    server_url: str | None = None    # measuring through an already running llama-server (sc.server_url)

    @property
    def measuring(self) -> bool:
        return self.measured is not None

    @property
    def remote(self) -> bool:
        """Measurements go to the scenario's running llama-server, not to llama.cpp on this machine."""
        return self.measuring and self.server_url is not None

    @property
    def backend(self) -> str | None:
        """The harness backend every measurement of this study uses (None: the harness's default, here)."""
        return f"server:{self.server_url}" if self.remote else None

    def why_not_restarted(self) -> str:
        """Why a measurement that needs llama.cpp loaded with other load-time flags (another -c, -ctk/-ctv,
        -fa, -ngl, -b/-ub, -t, load mode, -np, another model) is not made: "" when measuring here."""
        if not self.remote:
            return ""
        return (f"the remote llama-server at {self.server_url} was started with its own flags; this sweep needs a "
                "restart per value, which v100lab does not do to a server it did not start")

    def why_no_load_log(self) -> str:
        """Why llama.cpp's load log cannot be read: "" when measuring here."""
        if not self.remote:
            return ""
        return (f"the remote llama-server at {self.server_url} loaded its model with its own flags; llama.cpp's "
                "load log is read here only for a model loaded here, and v100lab does not restart a server it "
                "did not start")

    @property
    def same_model_here(self) -> bool:
        """The scenario predicts for this machine and measures its own model: one set of predictions."""
        return self.measuring and not self.remote and self.device.id == HOST and not self.sc.is_stand_in and \
            self.measured_spec == self.spec

    @property
    def skeleton(self) -> bool:
        return is_skeleton_name(self.sc.model)


_QUANT_SUFFIX = re.compile(r"[.\-_](?:I?Q\d\w*|[BF]16|F32|BF16)$", re.I)


def _label(spec: ModelSpec, model: str, path: Path | str | None = None) -> str:
    """A model's label in tables and plots (the quant is a column of its own): its name, unless the name is the
    converter's concatenation of basename, size and finetune tag ("Smollm2 135M 8k Lc100K Mix1 Ep2") and the
    file is named after the model ("SmolLM2-135M-Instruct.Q4_1.gguf"): then the file's name without the quant."""
    md = spec.metadata or {}
    base, tune = md.get("general.basename"), md.get("general.finetune")
    stem = _QUANT_SUFFIX.sub("", Path(path).name.removesuffix(".gguf")) if path else ""
    if (isinstance(base, str) and isinstance(tune, str) and tune and stem.lower().startswith(base.lower())
            and tune.replace("-", " ").lower() in (spec.name or "").lower()):
        return stem
    return (spec.name or Path(model).stem or model).strip()


@lru_cache(maxsize=16)
def study(sc: Scenario) -> Study:
    """Resolve ``sc`` once per kernel (cached; a Scenario is immutable)."""
    path, spec = resolve(sc.model, build=True)
    label = _label(spec, sc.model, path)
    host = measured_host()          # the workbook shows this machine measured: measure it once if never
    device = get_device(sc.device)
    measured = sc.measured_model
    why = ""
    mpath = mspec = None
    if not sc.measure:
        why = "the scenario says measure: false"
    elif sc.server_url:
        return _remote_study(sc, spec, label, device, host)
    elif is_skeleton_name(measured):
        why = f"{sc.model} is a header-only skeleton (no weights) and the scenario names no stand_in_model"
    elif measured.lower().startswith(("http://", "https://")):
        why = "the model is a URL: only its header is read here, the weights are not downloaded"
    else:
        try:
            mpath, mspec = resolve(measured, build=True)
        except V100labError as exc:
            why = f"the model cannot be loaded here: {exc}"
            mpath = mspec = None
        if mpath is not None and mpath.stat().st_size > 0.7 * host.capacity_bytes:
            why = (f"{mpath.name} ({mpath.stat().st_size / GIB:.1f} GiB) is too big for this machine's "
                   f"{host.memory_gib:.0f} GiB of RAM")
            mpath = mspec = None
    if mspec is None:
        return Study(sc, spec, label, device, host, None, None, None, "", why)
    mlabel = _label(mspec, measured, mpath) + (" (stand-in)" if sc.is_stand_in else "")
    return Study(sc, spec, label, device, host, measured, mpath, mspec, mlabel, "")


def _remote_study(sc: Scenario, spec: ModelSpec, label: str, device, host) -> Study:
    """The study of a scenario measured through its running llama-server: the model measured is the one the
    server reports serving (not the scenario's stand-in); its header is read when the file is readable here,
    else the scenario's model stands for it in predictions."""
    try:
        served = served_model(sc.server_url)
    except V100labError as exc:
        return Study(sc, spec, label, device, host, None, None, None, "",
                     f"the remote llama-server at {sc.server_url} cannot be measured: {exc}", sc.server_url)
    measured = served["model"] or sc.server_url
    try:
        mspec = resolve(measured).spec
    except V100labError:
        mspec = spec
    mlabel = _label(mspec, measured) + " (remote)"
    return Study(sc, spec, label, device, host, measured, Path(measured), mspec, mlabel, "", sc.server_url)


class Failures(list):
    """The failed measurements of a step, and ``not_measured``: why its measured sweep was not run at all
    ("" when it was). :func:`lever_frame` shows it as the frame's ``why_not_measured``."""

    not_measured: str = ""


def _skipped(why: str) -> tuple[list[Observation], Failures]:
    failures = Failures()
    failures.not_measured = why
    return [], failures


def _restarts(configs: Sequence[RunConfig]) -> bool:
    """Whether measuring ``configs`` needs llama.cpp loaded more than one way (a load-time lever)."""
    return any(c != configs[0] for c in configs[1:])


def loading_study(sc: Scenario, load_log: bool = False) -> Study:
    """The study of a step that loads llama.cpp with flags of its own — several load-time values, other models,
    llama.cpp's load log (``load_log``): :func:`study`, or, when the scenario measures through a remote
    llama-server, that study measuring nothing with the reason (:meth:`Study.why_not_restarted`,
    :meth:`Study.why_no_load_log`), so the step predicts and says why, as for any study that does not measure."""
    st = study(sc)
    if not st.remote:
        return st
    why = st.why_no_load_log() if load_log else st.why_not_restarted()
    return replace(st, measured=None, measured_path=None, measured_spec=None, measured_label="",
                   why_not_measured=why)


@dataclass(frozen=True)
class Target:
    """A model predicted on a device, for the lessons about what fits on a GPU (01, 05)."""

    model: str                       # what spec_at_quant takes (an alias, a path or skeleton:ARCH:QUANT)
    spec: ModelSpec
    label: str
    device: Any                      # v100lab.facts.devices.Device


def seed_target_model() -> tuple[str, str]:
    """The seed's assumed model as a skeleton name at its first stage's quant, and its label."""
    claims = load_seed_claims()
    return f"{SKELETON_PREFIX}{claims['model']['arch']}:{claims['stages'][0]['quant']}", claims["model"]["label"]


@lru_cache(maxsize=16)
def beside(sc: Scenario) -> Target | None:
    """The GPU predicted beside this machine: when the scenario predicts for a CPU (the default scenario, and
    every scenario that measures on a CPU), the seed's model on ``compare_gpu`` (the V100 by default) — what
    the lessons about fitting on a card need, which a small model on a CPU never shows. None when the
    scenario's device is not a CPU (it is the target itself) or ``compare_gpu`` is none."""
    st = study(sc)
    if st.device.kind != "cpu" or sc.compare_gpu == NO_GPU:
        return None
    model, label = seed_target_model()
    return Target(model, resolve(model, build=True).spec, label, get_device(sc.compare_gpu))


def gpu_subject(sc: Scenario) -> Target:
    """What the -ngl and spill lessons are about: :func:`beside` when there is one, else the scenario's model
    on its device."""
    found = beside(sc)
    if found is not None:
        return found
    st = study(sc)
    return Target(sc.model, st.spec, st.label, st.device)


def threads_text(n_threads: int) -> str:
    """``-t`` as a reader needs it: the count, and what 0 means here."""
    return f"-t {n_threads}" if n_threads else f"-t {os.cpu_count() or 1} (all cores)"


def conditions(cfg: RunConfig, model: str = "", *, depth: int | str | None = 0, threads: bool = True,
               ctx: bool = True, fa: bool = True, extra: Sequence[str] = ()) -> str:
    """The conditions of a figure or a headline in one line: model, depth, -fa, -c, threads (and ``extra``).
    ``depth`` None leaves it out (a sweep over depth); ``ctx``/``threads`` False leave those out (a sweep
    over them, or a prediction where they do not matter)."""
    parts = [model] if model else []
    if depth is not None:
        parts.append(f"depth {depth}")
    if fa:
        parts.append(f"-fa {cfg.flash_attn}")
    if ctx:
        parts.append(f"-c {cfg.n_ctx}" if cfg.n_ctx else "-c 0 (the model's own)")
    if cfg.cache_type_k != "f16" or cfg.cache_type_v != "f16":
        parts.append(f"KV {cfg.cache_type_k}/{cfg.cache_type_v}")
    if threads:
        parts.append(threads_text(cfg.n_threads))
    parts += list(extra)
    return " · ".join(parts)


def gpu_backend() -> str | None:
    """The GPU(s) llama-cpp-python's build can use here, or None for a CPU-only build."""
    gpu = cpu_gpu_info()[1]
    return gpu or None


def bench_tests(sc: Scenario, pp: bool = True, tg: bool = True) -> list[str]:
    """The bench tests a step runs: pp``n_prompt`` and tg``n_gen`` (a zero count leaves its test out)."""
    out = []
    if pp and sc.n_prompt:
        out.append(f"pp{sc.n_prompt}")
    if tg and sc.n_gen:
        out.append(f"tg{sc.n_gen}")
    return out


def ctx_for(cfg: RunConfig, need: int) -> RunConfig:
    """``cfg`` with a context large enough for ``need`` tokens per sequence (0 = the model's own is kept)."""
    if cfg.n_ctx and cfg.n_ctx < need * max(1, cfg.n_parallel):
        return cfg.with_(n_ctx=pad(need * max(1, cfg.n_parallel), CTX_PAD))
    return cfg


@lru_cache(maxsize=1)
def gpu_host():
    """The CPU beside a catalog GPU, for layers that do not fit: the seed's assumed server CPU
    (``seed_claims.yaml`` host: 6 channels of DDR4-2666, uncalibrated) — not this machine, whose CPU
    says nothing about a V100 server's."""
    return seed_host_device(load_seed_claims())


def devices_for(device) -> list:
    """A GPU is predicted together with a host CPU (layers that do not fit run there): :func:`gpu_host`."""
    return [device] if device.kind == "cpu" else [device, gpu_host()]


def predict_rows(spec: ModelSpec, label: str, device, cfg: RunConfig, *, lever: str, value: Any,
                 depth: int = 0, n_prompt: int = 512, n_gen: int = 0, metrics: Iterable[str] = ("tg_tps", "pp_tps"),
                 fit: bool = True, note: str = "", fits: bool | None = None, cache_type: str = "",
                 group: str = "") -> list[Observation]:
    """Predicted rows for one configuration: decode (at the middle of ``n_gen`` tokens after ``depth``),
    prompt processing (``n_prompt`` tokens after ``depth``), the seed's weights-only ceiling and the physical one.

    ``fit``: on a GPU, a configuration that does not fit is predicted with the layers that do (and says so).
    ``fits``/``cache_type``/``group``: the rows' columns of those names (whether the configuration fits, the KV
    cache type, the group drawn together); the ``bound`` column says what limits each predicted speed."""
    devs = devices_for(device)
    why = ""
    if fit:
        cfg, why = fit_gpu_layers(spec, devs, cfg)
    pred_tg = speed.predict(spec, devs, cfg, depth=depth + n_gen // 2, n_prompt=max(1, n_prompt))
    pred_pp = speed.predict(spec, devs, cfg, depth=depth, n_prompt=max(1, n_prompt)) if "pp_tps" in metrics else None
    base_note = "; ".join(x for x in (note, why, f"bound: {pred_tg.bound}") if x)
    rows = []
    dev_id = device.id
    for metric in metrics:
        bound = ""
        if metric == "tg_tps":
            val, n, bound = pred_tg.tg_tps, base_note, pred_tg.bound
        elif metric == "pp_tps":
            val, n = pred_pp.pp_tps, "; ".join(x for x in (note, why, f"bound: {pred_pp.pp_bound}") if x)
            bound = pred_pp.pp_bound
        elif metric == "weights_ceiling_tg_tps":
            val, n = pred_tg.weights_ceiling_tg_tps, "the bandwidth ceiling: bandwidth / weight bytes placed"
        elif metric == "physical_ceiling_tg_tps":
            val, n = pred_tg.physical_ceiling_tg_tps, "bytes that must be read per token at peak bandwidth"
        else:
            raise ConfigError(f"unknown predicted metric '{metric}'")
        if not math.isfinite(val):
            continue
        rows.append(Observation(model=label, quant=spec.file_type, device=dev_id, lever=lever, value=str(value),
                                metric=metric, result=float(val), unit=TPS, source="predicted",
                                above_ceiling=(bool(val > pred_tg.physical_ceiling_tg_tps * 1.0001)
                                               if metric == "tg_tps" else None), note=n, bound=str(bound or ""),
                                fits=fits, cache_type=cache_type, group=group))
    return rows


def lever_rows(sc: Scenario, lever: str, values: Sequence[Any], cfg_of, tests: Sequence[str], depth: int = 0,
               backend: str | None = None, predict: bool = True, n_prompt: int | None = None):
    """Predicted rows for each value of one lever (the scenario's model on its device, and the measured model
    here) and the measured sweep: ``cfg_of(value)`` gives each value's configuration. Returns (rows, failures).

    ``n_prompt``: prompt tokens of the pp test and its prediction (default ``sc.n_prompt``)."""
    st = study(sc)
    n_prompt = sc.n_prompt if n_prompt is None else n_prompt
    rows: list[Observation] = []
    metrics = tuple(m for m, on in (("tg_tps", any(t.startswith("tg") for t in tests)),
                                    ("pp_tps", any(t.startswith("pp") for t in tests))) if on)
    metrics = metrics or ("tg_tps", "pp_tps")
    for v in values:
        cfg = cfg_of(v)
        if predict:
            if not st.same_model_here:
                rows += predict_rows(st.spec, st.label, st.device, cfg, lever=lever, value=v, depth=depth,
                                     n_prompt=n_prompt, n_gen=sc.n_gen, metrics=metrics + ("physical_ceiling_tg_tps",))
            if st.measuring and not st.remote:
                rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever=lever, value=v,
                                     depth=depth, n_prompt=n_prompt, n_gen=sc.n_gen,
                                     metrics=metrics + ("physical_ceiling_tg_tps",))
    obs, failures = [], []
    if st.measuring and tests:
        if st.remote and _restarts([cfg_of(v) for v in values]):
            obs, failures = _skipped(st.why_not_restarted())
        else:
            got = []
            for v in values:
                got += harness.run_tests(str(st.measured_path), cfg_of(v), list(tests), [depth], sc.repetitions,
                                         backend=st.backend or backend, monitor=False, lever=lever, value=v)
            obs, failures = measured_rows(got, st.measured_label)
    return rows + obs, failures


def _failure(row: Mapping[str, Any]) -> dict[str, str]:
    return {"lever": str(row.get("lever") or ""), "value": str(row.get("value") or ""),
            "test": str(row.get("test") or ""), "reason": str(row.get("reason") or "failed")}


def measured_rows(rows: Sequence[Mapping[str, Any]], label: str) -> tuple[list[Observation], list[dict[str, str]]]:
    """Bench rows → (measured observations on this machine labelled ``label``, the failed rows' reasons)."""
    return harness.rows_to_observations(rows, label, HOST), [_failure(r) for r in rows if r.get("status") != "ok"]


def measure_sweep(st: Study, lever: str, values: Sequence[Any], cfg: RunConfig, tests: Sequence[str],
                  depths: Sequence[int] = (0,), backend: str | None = None, model: str | None = None,
                  monitor_series: list | None = None):
    """Measured rows of a bench sweep of the measured model on this machine (one model load per value).

    ``monitor_series``: a list to receive, for each measured test, ``(test, samples)`` — the machine watched
    once a second while it ran (:class:`v100lab.measure.monitor.Monitor`: memory, CPU, and GPU memory,
    utilisation and power where there is an NVIDIA GPU); None: not watched.

    Through a remote llama-server (``st.remote``) only request-time levers are measured (depth, or a lever
    whose values all give one configuration); a load-time sweep returns no rows and says why
    (``Failures.not_measured``). Returns (observations, failures)."""
    if not st.measuring or not tests:
        return [], []
    if st.remote and (model is not None or _restarts([_swept_config(cfg, lever, v) for v in values])):
        return _skipped(st.why_not_restarted())
    rows = harness.sweep(str(model or st.measured_path), cfg, lever, list(values), tests=list(tests),
                         depths=list(depths), repetitions=st.sc.repetitions, backend=st.backend or backend,
                         results=None, progress=False, monitor=monitor_series is not None)
    if monitor_series is not None:
        monitor_series += [(str(r.get("test") or ""), list(r.get("monitor_series") or ())) for r in rows
                           if r.get("status") == "ok" and r.get("monitor_series")]
    return measured_rows(rows, st.measured_label)


def _swept_config(cfg: RunConfig, lever: str, value: Any) -> RunConfig:
    """The configuration :func:`v100lab.measure.harness.sweep` loads for one value of ``lever`` (depth and model
    values leave it as it is)."""
    if lever in ("n_depth", "model"):
        return cfg
    if lever == "cache_type":
        return cfg.with_(cache_type_k=value, cache_type_v=value)
    return cfg.with_(**{lever: value})


def lever_frame(rows: Iterable[Observation], failures: Sequence[Mapping[str, str]] = (), **attrs):
    """A step's tidy frame: measured and claimed decode rows flagged against the physical ceilings the rows
    predict (:func:`v100lab.facts.results.flag_above_ceiling`), measured speeds' spreads widened by the drift of
    the run's reference while they were measured (:func:`reference_after`), ``failures`` and ``attrs`` in
    ``frame.attrs``.
    A sweep that was not measured (:class:`Failures` ``not_measured``) says why in ``why_not_measured``
    unless the step gave one."""
    df = reference_after(flag_above_ceiling(tidy_frame(rows)))
    df.attrs["failures"] = list(failures)
    df.attrs.update(attrs)
    skipped = getattr(failures, "not_measured", "")
    if skipped and not df.attrs.get("why_not_measured"):
        df.attrs["why_not_measured"] = skipped
    return df


def stage_model(st: Study, quant: str) -> tuple[str, str]:
    """The file measured for a stage at ``quant``: the measured model's ladder rung when it has one
    (``default:Q4_0``, ``synth-1b:Q4_0``), else the measured model itself (note says so)."""
    base = (st.measured or "").partition(":")[0]
    if base in zoo.aliases() and base != zoo.GEMMA_ALIAS:
        return f"{base}:{quant}", ""
    return str(st.measured_path), f"measured at the stand-in's own quant {st.measured_spec.file_type}"


def with_note(o: Observation, note: str) -> Observation:
    """``o`` with ``note`` added to its note."""
    return replace(o, note="; ".join(x for x in (o.note, note) if x)) if note else o


def capture_load(st: Study, cfg: RunConfig):
    """Load the measured model with ``cfg`` and return llama.cpp's load facts (None when not measuring).
    The load runs in a worker process (a crash raises WorkerCrashed, a RunFailed). Through a remote
    llama-server nothing is loaded here: RunFailed with :meth:`Study.why_no_load_log`."""
    if not st.measuring:
        return None
    if st.remote:
        raise RunFailed(st.why_no_load_log())
    facts, _ = call_isolated(load_and_capture, st.measured_path, cfg, what=f"loading {st.measured_path.name}")
    return facts


# --------------------------------------------------------------------------------------------
# the run's reference measurement (v100lab.measure.reference): at its start and at its end
# --------------------------------------------------------------------------------------------

_REFS: dict[str, Any] = {}       # this kernel's references (one run of a notebook is one kernel): the start, the last


def reference_start(sc: Scenario) -> dict[str, Any] | None:
    """The run's start reference: measured the first time a scenario that measures on this machine asks (the
    notebook's first cell), then kept for the kernel; with the machine check on calibration's own rungs
    (``machine``: :func:`v100lab.measure.reference.machine_ratios`), shown beside the run's comparisons but never
    applied to its predictions, and the calibration's prediction for the reference (``predicted_tps``). None when
    the study measures nothing here (or through a remote server), or when the reference could not be measured (a
    warning says why)."""
    st = study(sc)
    if not st.measuring or st.remote:
        return None
    threads = sc.run_config().n_threads
    if _REFS.get("threads_asked") == threads:
        return _REFS["start"]
    try:
        rec = reference.measure(threads, when="start")
    except Exception as exc:  # noqa: BLE001 - a reference that cannot be made leaves the run unjudged, never failed
        log.warning("no reference measured at the start of this run: %s", exc)
        return None
    # where the machine stands against its calibration, on calibration's own rungs: said beside the comparisons,
    # not applied (one load's view of a streaming rung over-corrected a cache-resident model; docs/measuring.md)
    check = reference.machine_check(rec["threads"])
    rec["machine"] = reference.machine_ratios(check, rec["threads"])
    rec["predicted_tps"] = reference.predicted_tps(threads)
    _REFS.clear()
    _REFS.update(threads_asked=threads, start=rec, last=rec)
    return rec


def _reference_now(when: str) -> dict[str, Any] | None:
    try:
        rec = reference.measure(_REFS["threads_asked"], when=when)
    except Exception as exc:  # noqa: BLE001 - a reference that cannot be made leaves the run unjudged, never failed
        log.warning("no reference measured %s: %s", when, exc)
        return None
    _REFS["last"] = rec
    return rec


def reference_after(df):
    """``df`` (a step's frame) after its measurements: the reference decoded again now, and every measured tok/s
    row's spread widened by how far it moved since the run's previous reference (:func:`with_drift`) — the
    drift over the time those rows were measured, which every caption, summary and headline drawn from the frame
    then includes. ``attrs["reference_shift"]`` says how far it moved. ``df`` as it is when the run has no start
    reference or measured no speed."""
    if not _REFS.get("start") or not len(df) or not ((df["source"] == "measured") & (df["unit"] == TPS)).any():
        return df
    before = _REFS["last"]
    now = _reference_now("after measuring")
    shift = drift_scaling.reference_shift(before, now)
    out = with_drift(df, (shift or {}).get("drift"))
    out.attrs["reference_shift"] = shift
    return out


def reference_end() -> dict[str, Any] | None:
    """The run's references: ``{"start", "end", "shift" (:func:`v100lab.predict.drift_scaling.reference_shift`,
    end against start), "machine_ratio" / "machine_pp_ratio" (calibration's base rung at the start against its
    calibration figure: :func:`v100lab.measure.reference.machine_check`), "machine_moved" (a rung beyond the drift
    check's tolerance)}``. The end is the
    reference decoded after the run's last measuring step (:func:`reference_after`), or decoded now when none
    was; None when the run has no start reference."""
    start = _REFS.get("start")
    if not start:
        return None
    end = _REFS["last"] if _REFS.get("last") is not start else _reference_now("end")
    machine = start.get("machine") or {}
    return {"start": start, "end": end, "shift": drift_scaling.reference_shift(start, end),
            "machine_ratio": round(machine["tg"], 4) if machine.get("tg") else None,
            "machine_pp_ratio": round(machine["pp"], 4) if machine.get("pp") else None,
            "machine_moved": bool(machine.get("moved"))}


def with_drift(df, drift: float | None):
    """``df`` with every measured tok/s row's ``sd`` widened by the drift between the run's references
    (:func:`v100lab.predict.drift_scaling.spread_with_drift`): what every comparison drawn from it then uses.
    ``df`` itself when there is no drift to add."""
    if not drift or not len(df):
        return df
    out = df.copy()
    rows = (out["source"] == "measured") & (out["unit"] == TPS)
    out.loc[rows, "sd"] = [drift_scaling.spread_with_drift(v, sd, drift)
                           for v, sd in zip(out.loc[rows, "result"], out.loc[rows, "sd"])]
    out.attrs = dict(df.attrs)
    return out


def measured_points(df) -> list[dict[str, Any]]:
    """The measured tok/s figures of a frame per setup (what llama.cpp ran, :func:`harness.setup_of`): ``[{"setup",
    "metric", "measured", "sd", "repetitions"}]`` — what the batch index compares across notebooks."""
    if not len(df) or "setup" not in df:
        return []
    m = df[(df["source"] == "measured") & (df["unit"] == TPS) & (df["setup"] != "")]
    out = []
    for (setup, metric), g in m.groupby(["setup", "metric"], sort=False):
        out.append({"setup": str(setup), "metric": str(metric), "measured": round(float(g["result"].mean()), 3),
                    "sd": round(float(g["sd"].max()), 3), "repetitions": int(g["repetitions"].min())})
    return out
