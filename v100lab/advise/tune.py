"""``tune``: the fastest llama.cpp configuration that fits, as a llama-server command with a reason per flag.

Anchors: llama.cpp's ``--fit`` fits memory only, by loading; fituna measures and never predicts; llmfit prints a
command from a catalogue. ``tune`` predicts (memory :mod:`v100lab.predict.memory`, speed :mod:`v100lab.predict.speed`) over a
grid of run configurations — and quants, when MODEL names a family — keeps those that fit with a margin,
ranks them by predicted decode speed, optionally measures the best few for real (:mod:`v100lab.measure.harness`) and
chooses by measurement, then explains every flag of the resulting command with what it buys in predicted
tok/s or bytes.

The search (one source of truth: the constants below)

* **quants** — MODEL an architecture spec (``qwen35-27b``; skeletons, nothing downloaded) or a synthetic alias
  (``synth-tiny``; its ladder is built with llama.cpp's quantizer) → :data:`DEFAULT_QUANTS`, the rungs of 4 bits
  and more (the seed's own verdict on Q3_K_M: "clearly dumber, long reasoning goes wrong"); ``quants=`` widens or
  narrows it. Any other MODEL (a file, a URL, ``alias:QUANT``) is that one file.
* **per quant** — K/V cache types :data:`CACHE_TYPES` (K and V alike; a quantized V gets ``--flash-attn on``,
  which llama.cpp requires), flash attention ``auto``/``off`` for f16 caches, ``--ubatch-size`` in
  :data:`UBATCHES`, ``--ctx-size`` = ``min_ctx``, ``--parallel`` = ``parallel``; ``--gpu-layers 999`` when
  everything fits; else, for a MoE model, first its experts in host memory (the fewest ``--n-cpu-moe`` layers
  with which every layer fits, then ``--cpu-moe``), as llama.cpp's ``--fit`` does (common/fit.cpp,
  common_params_fit_impl: all MoE tensors in system memory, then full layers front to back); only then the most
  layers that fit.
* **fit** — :func:`v100lab.predict.memory.feasibility`, the rule ``plan`` prints too: every device's plan (weights + KV +
  recurrent state + compute + output + runtime overhead) — each GPU's and the host RAM's, for what stays on the
  CPU — must leave :func:`margin_bytes` free (3 % of its memory, at least 256 MiB), and llama.cpp's limits must
  hold (at most 256 sequences, cells for each, a context within its int32). Limits that no configuration can
  meet (``parallel`` > 256, ``min_ctx`` beyond the int32) are refused as bad input; when no candidate fits,
  :func:`tune` raises :class:`NothingFits` (exit 1) with what would have to change, and recommends nothing.
* **rank** — predicted decode tok/s halfway through the required context (``depth = min_ctx // 2``). Candidates
  within :data:`TIE` (1 %) of the fastest are a tie — the model's own error is larger — and a tie goes to the
  better-quality quant, then the less-quantized cache, then faster prompt processing, then the larger margin.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from v100lab.measure import harness
from v100lab.gguf import llama_context, skeleton
from v100lab.predict import memory, rates, speculative, speed
from v100lab.models import zoo
from v100lab.facts import config as config_mod
from v100lab.facts.config import ALL_LAYERS, RunConfig
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError, V100labError
from v100lab.models.resolve import resolve
from v100lab.predict.memory import margin_bytes
from v100lab.facts.results import TPS, Observation, tidy_frame
from v100lab.base.safeio import shell_join, shell_word
from v100lab.base.safeio import json_number

log = logging.getLogger(__name__)

DEFAULT_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
CACHE_TYPES = ("f16", "q8_0", "q4_0")
UBATCHES = (2048, 1024, 512, 256, 128)
DEFAULT_BATCH = 2048
TIE = 0.01
MEASURE_TOP = 3
_KV_RANK = {"f32": 5, "f16": 4, "bf16": 4, "q8_0": 3, "q5_1": 2, "q5_0": 2, "q4_1": 1, "q4_0": 1, "iq4_nl": 1}
_FA_RANK = {"auto": 2, "on": 1, "off": 0}


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One run configuration, predicted (and perhaps measured)."""

    quant: str
    config: RunConfig
    fits: bool                       # memory.feasibility: every device (GPUs and host RAM) with its margin, limits
    margin_bytes: int                # free bytes left on the tightest device (against its margin) after the plan
    used_bytes: int                  # the plan's total on that device
    offloaded_layers: int
    n_layer_total: int
    tg_tps: float                    # predicted decode at depth
    pp_tps: float                    # predicted prompt processing (512 tokens)
    weights_ceiling_tg_tps: float
    bound: str
    kv_bytes: int
    compute_bytes: int
    depth: int
    weight_bytes: int
    measured_tg_tps: float | None = None
    measured_cv: float | None = None
    measured_best_tg_tps: float | None = None       # the fastest repetition: what the choice uses (see _choose)
    note: str = ""
    full_offload_deficit_bytes: int | None = None   # partial offloads: what all layers would need on top
    blockers: tuple = ()                             # memory.Blocker: why it does not fit (empty when it fits)
    physical_ceiling_tg_tps: float = math.inf          # the bytes a token reads at peak bandwidth: tg never exceeds it
    tight_device: str = ""                           # the device margin_bytes and used_bytes are of

    @property
    def distance(self) -> float:
        """How far from fitting: the sum of the blockers' relative excesses (0 when it fits)."""
        return sum(b.excess for b in self.blockers)

    @property
    def label(self) -> str:
        c = self.config
        kv = c.cache_type_k if c.cache_type_k == c.cache_type_v else f"{c.cache_type_k}/{c.cache_type_v}"
        return (f"{self.quant} ngl={self.offloaded_layers}/{self.n_layer_total} ctx={c.n_ctx} kv={kv} "
                f"fa={c.flash_attn} ub={c.n_ubatch} np={c.n_parallel}"
                + (" cpu-moe" if c.cpu_moe else f" n-cpu-moe={c.n_cpu_moe}" if c.n_cpu_moe else ""))

    def as_dict(self) -> dict[str, Any]:
        return {"quant": self.quant, "label": self.label, "config": self.config.as_dict(), "fits": self.fits,
                "margin_bytes": self.margin_bytes, "used_bytes": self.used_bytes,
                "offloaded_layers": self.offloaded_layers, "n_layer_total": self.n_layer_total,
                "tg_tps": json_number(self.tg_tps), "pp_tps": json_number(self.pp_tps), "weights_ceiling_tg_tps": json_number(self.weights_ceiling_tg_tps),
                "physical_ceiling_tg_tps": json_number(self.physical_ceiling_tg_tps), "bound": self.bound, "kv_bytes": self.kv_bytes, "compute_bytes": self.compute_bytes,
                "depth": self.depth, "weight_bytes": self.weight_bytes,
                "measured_tg_tps": json_number(self.measured_tg_tps), "measured_cv": json_number(self.measured_cv, 4),
                "measured_best_tg_tps": json_number(self.measured_best_tg_tps),
                "note": self.note, "tight_device": self.tight_device,
                "blockers": [b.as_dict() for b in self.blockers]}


@dataclass(frozen=True)
class Reason:
    """Why one flag of the command is there, and what it buys."""

    flag: str                        # as it appears in the command, e.g. "--cache-type-v f16"
    why: str                         # one line
    delta_tps: float | None = None   # predicted tok/s this choice gains over the alternative named in ``why``
    delta_bytes: int | None = None   # bytes it saves (+) or costs (-) against that alternative

    def line(self) -> str:
        return f"{self.flag:<24} {self.why}"


class Recommendation:
    """What a recommendation shares: its ``argv`` (a llama-server command) and its ``best`` choice's config."""

    @property
    def command(self) -> str:
        """The llama-server command to copy: each argument one shell word, free of control characters."""
        return shell_join(self.argv)

    @property
    def config(self) -> RunConfig:
        return self.best.config


@dataclass(frozen=True)
class TuneResult(Recommendation):
    """The chosen configuration, its llama-server command, a reason per flag, and every candidate."""

    model: str
    device: str
    quant: str
    best: Candidate
    argv: tuple[str, ...]
    reasons: tuple[Reason, ...]
    candidates: tuple[Candidate, ...]     # every candidate evaluated, best first (fitting ones before the rest)
    margin_bytes: int
    min_ctx: int
    measured: bool = False
    notes: tuple[str, ...] = ()
    speculation: Mapping[str, Any] | None = None   # :func:`speculation_advice` (one user only)

    @property
    def predicted_tg_tps(self) -> float:
        return self.best.tg_tps

    def observations(self) -> list:
        """Every candidate as tidy rows (lever "config", value = the candidate's label): predicted tg/pp tok/s,
        ceiling, used and margin bytes, fits; measured tg tok/s where measured."""
        rows = []
        for c in self.candidates:
            base = dict(model=self.model, quant=c.quant, device=self.device, lever="config", value=c.label)
            note = f"bound: {c.bound}" + ("" if c.fits else "; does not fit with the margin")
            for metric, val, unit in (("tg_tps", c.tg_tps, TPS), ("pp_tps", c.pp_tps, TPS),
                                      ("weights_ceiling_tg_tps", c.weights_ceiling_tg_tps, TPS), ("used_bytes", c.used_bytes, "bytes"),
                                      ("margin_bytes", c.margin_bytes, "bytes"), ("fits", float(c.fits), "bool")):
                rows.append(Observation(**base, metric=metric, result=float(val), unit=unit, source="predicted",
                                        above_ceiling=(val > c.physical_ceiling_tg_tps) if metric == "tg_tps" else None,
                                        note=note))
            if c.measured_tg_tps is not None:
                rows.append(Observation(**base, metric="tg_tps", result=float(c.measured_tg_tps), unit=TPS,
                                        source="measured", note=f"cv {100 * (c.measured_cv or 0):.1f}%; {c.note}"))
        return rows

    def frame(self):
        """The candidates as a tidy DataFrame (:func:`v100lab.facts.results.tidy_frame`)."""
        return tidy_frame(self.observations())

    def candidates_frame(self):
        """One row per candidate (wide): label, quant, fits, tg/pp tok/s, margin MiB, measured tok/s."""
        import pandas as pd   # heavy: only the tables need it

        return pd.DataFrame([{"label": c.label, "quant": c.quant, "fits": c.fits, "tg_tps": c.tg_tps,
                              "pp_tps": c.pp_tps, "margin_mib": c.margin_bytes / 2**20,
                              "offloaded": f"{c.offloaded_layers}/{c.n_layer_total}",
                              "measured_tg_tps": c.measured_tg_tps} for c in self.candidates])

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "fits": True, "quant": self.quant, "min_ctx": self.min_ctx,
                "margin_bytes": self.margin_bytes, "measured": self.measured,
                "predicted_tg_tps": json_number(self.best.tg_tps), "predicted_pp_tps": json_number(self.best.pp_tps),
                "weights_ceiling_tg_tps": json_number(self.best.weights_ceiling_tg_tps), "measured_tg_tps": json_number(self.best.measured_tg_tps),
                "config": self.best.config.as_dict(), "argv": list(self.argv), "command": self.command,
                "reasons": [asdict(r) for r in self.reasons], "best": self.best.as_dict(),
                "candidates": [c.as_dict() for c in self.candidates], "notes": list(self.notes),
                "speculation": dict(self.speculation) if self.speculation else None}

    def format_text(self) -> str:
        b = self.best
        head = (f"{self.model} on {self.device}: {b.quant}, predicted {b.tg_tps:.1f} tok/s decode "
                f"(ceiling {b.physical_ceiling_tg_tps:.1f}, {b.bound}-bound), {b.pp_tps:.0f} tok/s prompt; "
                f"{b.margin_bytes / 2**20:.0f} MiB left (margin {self.margin_bytes / 2**20:.0f} MiB)")
        if b.measured_tg_tps is not None:
            head += f"; measured {b.measured_tg_tps:.1f} tok/s (cv {100 * (b.measured_cv or 0):.1f}%)"
        lines = [head, "", self.command, "", "why each flag:"]
        lines += [f"  {r.line()}" for r in self.reasons]
        fitting = [c for c in self.candidates if c.fits]
        lines += ["", f"{len(fitting)} of {len(self.candidates)} candidates fit; the fastest:"]
        for c in fitting[:5]:
            m = f", measured {c.measured_tg_tps:.1f}" if c.measured_tg_tps is not None else ""
            lines.append(f"  {c.tg_tps:7.2f} tok/s{m}  {c.label}  ({c.margin_bytes / 2**20:.0f} MiB left)")
        sp = self.speculation
        if sp:
            lines += ["", f"speculative decoding ({sp['verdict']}): {sp['why']}"]
            if sp.get("flags"):
                lines += [f"  add to the command: {sp['flags']}"]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# a gain smaller than this is within the prediction's error: speculation is not recommended for it
SPEC_MIN_GAIN = 1.05
SPEC_MAX_DRAFT = 16


def speculation_advice(spec, devices, cfg: RunConfig, depth: int, file_arg: str,
                       alpha: float | None = None) -> dict[str, Any]:
    """Whether speculative decoding is predicted to speed up one user's decode with ``cfg``: the model's own
    MTP layers when it has them (draft-mtp), else n-gram self-speculation (ngram-mod, no draft model); α
    assumed unless given (said in ``why``); the best draft length up to :data:`SPEC_MAX_DRAFT`; the command."""
    kind = "draft-mtp" if spec.nextn_layers else "ngram-mod"
    probe = speculative.predict(spec, devices, cfg, spec_type=kind, n_draft=1, alpha=alpha, depth=depth,
                                n_max=SPEC_MAX_DRAFT)
    n = max(1, probe.best_n)
    p = speculative.predict(spec, devices, cfg, spec_type=kind, n_draft=n, alpha=alpha, depth=depth,
                            n_max=SPEC_MAX_DRAFT)
    base = {"spec_type": kind, "draft_max": n, "alpha": p.alpha, "alpha_source": p.alpha_source,
            "predicted_tg_tps": json_number(p.tps), "plain_tg_tps": json_number(p.plain_tps), "speedup": json_number(p.speedup),
            "tokens_per_pass": json_number(p.tokens_per_pass)}
    a = f"α {p.alpha:g} {p.alpha_source}"
    if probe.best_n == 0 or p.speedup < SPEC_MIN_GAIN:
        return {**base, "verdict": "not recommended", "command": None, "flags": None,
                "why": f"at {a}, no draft length gains {100 * (SPEC_MIN_GAIN - 1):.0f} % or more "
                       f"(best {p.speedup:.2f}× at {n} drafted): verifying several tokens costs about as much as "
                       "decoding them here"}
    scfg = cfg.with_(spec_type=kind, draft_max=n, draft_min=1 if kind == "ngram-mod" else 0)
    what = "the model's MTP layers" if kind == "draft-mtp" else "n-gram lookup in the text so far (no draft model)"
    return {**base, "verdict": "recommended",
            "command": " ".join(("llama-server", "-m", file_arg, *scfg.to_server_argv())),
            "flags": " ".join(config_mod.spec_argv(scfg)),
            "why": f"{what}, {n} drafted per pass at {a}: {p.tps:.1f} tok/s predicted vs {p.plain_tps:.1f} "
                   f"({p.speedup:.2f}×); the gain is only as good as α — text that repeats itself (code edits, "
                   "quoting) accepts more, free prose less"}



@dataclass(frozen=True)
class NoFit:
    """What :func:`tune` found when no candidate fits: the closest one, what would have to change, every candidate."""

    model: str
    device: str
    min_ctx: int
    blockers: tuple                       # memory.Blocker of the closest candidate, with figures (detail)
    closest: Candidate
    candidates: tuple[Candidate, ...]     # closest first
    margin_bytes: int
    notes: tuple[str, ...] = ()

    @property
    def blocker(self):
        """The closest candidate's smallest blocker (the least relative excess)."""
        return min(self.blockers, key=lambda b: b.excess)

    def message(self) -> str:
        """One line: nothing fits, and what would have to change."""
        others = [b for b in self.blockers if b is not self.blocker]
        more = "".join(f"; and {b.line()}" for b in others)
        return (f"nothing fits {self.device} ({len(self.candidates)} candidates, the closest {self.closest.label}): "
                f"{self.blocker.line()}{more}")

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "fits": False, "min_ctx": self.min_ctx,
                "margin_bytes": self.margin_bytes, "argv": [], "command": None, "message": self.message(),
                "blocker": self.blocker.as_dict(), "blockers": [b.as_dict() for b in self.blockers],
                "closest": self.closest.as_dict(), "candidates": [c.as_dict() for c in self.candidates],
                "notes": list(self.notes)}


class NothingFits(V100labError):
    """No configuration :func:`tune` searched fits (:func:`v100lab.predict.memory.feasibility`): nothing is recommended.
    ``result`` (a :class:`NoFit`) says what would have to change. Exit status 1."""

    exit_status = 1

    def __init__(self, result: NoFit):
        self.result = result
        super().__init__(result.message())


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelChoice:
    label: str
    quant: str
    spec: Any                       # ModelSpec
    path: str | None                # a real file (None: a skeleton)
    file_arg: str                   # what the command's -m gets


def _models(model: str, quants: Sequence[str] | None) -> list[ModelChoice]:
    """The model(s) MODEL names: a skeleton family (arch name), a synthetic alias's ladder, or one file."""
    text = os.fspath(model)
    parsed = skeleton.parse_skeleton_name(text)
    if parsed is not None:
        arch, q = parsed
        if quants:
            raise ConfigError(f"--quants: '{text}' names one quant ({q}); give the architecture name ({arch}) to "
                              "search several")
        return [ModelChoice(arch, q, skeleton.skeleton_spec(arch, q), None, f"{arch}-{q}.gguf")]
    if text in skeleton.arch_names():
        qs = [q.upper() for q in (quants or DEFAULT_QUANTS)]
        return [ModelChoice(text, q, skeleton.skeleton_spec(text, q), None, f"{text}-{q}.gguf") for q in qs]
    base, sep, _ = text.partition(":")
    ladder_alias = not sep and zoo.is_alias(text) and (base.startswith("synth-") or quants)
    if ladder_alias:
        out = []
        for q in (quants or DEFAULT_QUANTS):
            alias = f"{text}:{q.upper()}"
            path, spec = resolve(alias, build=True)
            out.append(ModelChoice(text, q.upper(), spec, str(path), str(path)))
        return out
    if quants:
        raise ConfigError(f"--quants needs an architecture name ({', '.join(skeleton.arch_names())}) or a "
                          f"synthetic alias; '{text}' is one file")
    path, spec = resolve(text, build=True)
    return [ModelChoice(text, spec.file_type, spec, str(path or text) if not str(text).startswith("http") else None,
                   str(path or text))]


# ------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------

def evaluate(m: ModelChoice, devices: list, cfg: RunConfig, depth: int) -> Candidate:
    mplan = memory.plan(m.spec, devices, cfg, with_max_ctx=False)
    feas = memory.feasibility(m.spec, devices, cfg, mplan)
    # the tightest device: the least memory left above its margin (GPUs and the host alike)
    tight, dm = min(mplan.devices.items(), key=lambda kv: kv[1].margin_bytes - feas.margins[kv[0]])
    placement = speed.placement_from_plan(mplan, devices)
    pred = speed.predict(m.spec, devices, cfg, depth=depth, n_prompt=512, placement=placement)
    kv = sum(d.kv_cache_bytes for d in mplan.devices.values())
    comp = max((d.compute_bytes for d in mplan.devices.values()), default=0)
    return Candidate(quant=m.quant, config=cfg, fits=feas.fits, margin_bytes=dm.margin_bytes, used_bytes=dm.total_bytes,
                     offloaded_layers=mplan.offloaded_layers, n_layer_total=mplan.n_layer_total, tg_tps=pred.tg_tps,
                     pp_tps=pred.pp_tps, weights_ceiling_tg_tps=pred.weights_ceiling_tg_tps, bound=pred.bound, kv_bytes=kv,
                     compute_bytes=comp, depth=depth, weight_bytes=m.spec.weight_bytes, blockers=feas.blockers,
                     tight_device=tight, physical_ceiling_tg_tps=pred.physical_ceiling_tg_tps)


def _expert_offload(m: ModelChoice, devices: list, cfg: RunConfig, depth: int) -> Candidate | None:
    """Every layer on the GPU with the experts of the fewest layers in host memory (``--n-cpu-moe N``, the least N
    whose plan leaves the GPUs their margin; ``--cpu-moe`` when that is every layer): the candidate, or None when
    not even every expert on the CPU lets every layer fit. Moving experts frees GPU memory monotonically, so the
    least N is found by bisection."""
    n_layer = m.spec.n_layer

    def at(n: int) -> Candidate:
        c = cfg.with_(cpu_moe=True) if n >= n_layer else cfg.with_(n_cpu_moe=n)
        return evaluate(m, devices, c, depth)

    last = at(n_layer)
    if _gpu_deficit(last) > 0:
        return None
    lo, hi, best = 1, n_layer, last      # at(hi) has no GPU deficit
    while lo < hi:
        mid = (lo + hi) // 2
        c = at(mid)
        if _gpu_deficit(c) > 0:
            lo = mid + 1
        else:
            hi, best = mid, c
    flag = "--cpu-moe" if best.config.cpu_moe else f"--n-cpu-moe {best.config.n_cpu_moe}"
    return replace(best, note=f"expert offload: {flag} keeps those experts in host memory, every layer on the GPU")


def _fitted(m: ModelChoice, devices: list, cfg: RunConfig, depth: int, gpu: bool, partial: bool = True) -> Candidate:
    """``cfg`` with every layer on the GPU, or — when the GPU cannot hold every layer — a MoE's experts in host
    memory first, then the most layers that fit (``partial=False``: no such fallback, the full offload as it is)."""
    c = evaluate(m, devices, cfg, depth)
    deficit = _gpu_deficit(c)
    if not (gpu and partial and deficit > 0):
        return c
    part = _expert_offload(m, devices, cfg, depth) if m.spec.expert_count else None
    if part is None or not part.fits:
        base = cfg.with_(cpu_moe=True) if m.spec.expert_count else cfg
        fitted, _ = memory.fit_gpu_layers(m.spec, devices, base, margin=True)
        part = replace(evaluate(m, devices, fitted, depth),
                       note=f"partial offload: --gpu-layers {fitted.n_gpu_layers} is the most that fits"
                            + (" with every expert on the CPU" if base.cpu_moe else ""))
    part = replace(part, full_offload_deficit_bytes=deficit)
    return part if part.fits or part.distance < c.distance else replace(c, full_offload_deficit_bytes=deficit)


def _gpu_deficit(c: Candidate) -> int:
    """Bytes the GPUs lack (with their margins) for this candidate's layers."""
    return sum(b.shortfall_bytes for b in c.blockers if b.kind == "memory" and b.device != memory.HOST)


def _configs(gpu: bool, min_ctx: int, parallel: int) -> Iterable[RunConfig]:
    for ct in CACHE_TYPES:
        fas = ("auto", "off") if ct in ("f16", "f32", "bf16") else ("on",)
        for fa in fas:
            for ub in UBATCHES:
                yield RunConfig(n_gpu_layers=ALL_LAYERS if gpu else 0, n_ctx=min_ctx, n_batch=max(DEFAULT_BATCH, ub),
                                n_ubatch=ub, cache_type_k=ct, cache_type_v=ct, flash_attn=fa, n_parallel=parallel)


def _quality_key(c: Candidate, bpw: Mapping[str, float]):
    return (-bpw.get(c.quant, 0.0), -_KV_RANK.get(c.config.cache_type_v, 0), -_FA_RANK.get(c.config.flash_attn, 0))


def _choose(cands: Sequence[Candidate], bpw: Mapping[str, float], by_measured: bool = False) -> Candidate:
    """The fastest fitting candidate. Within TIE of the fastest, quality decides (quant bits, then the cache type,
    then flash attention auto > on > off); among those, prompt speed within TIE of the best, then llama.cpp's
    default --ubatch-size 512, then the larger margin."""
    pool = [c for c in cands if c.fits]
    if not pool:
        raise ValueError("_choose: no candidate fits")   # tune raises NothingFits before it gets here
    # measured: the fastest repetition of each — other processes only ever slow a run down, so on a shared
    # machine the best repetition is the least disturbed estimate; differences inside the repetitions' own
    # spread (cv, at most 50 %) are ties too
    score = (lambda c: c.measured_best_tg_tps or c.measured_tg_tps or 0.0) if by_measured else (lambda c: c.tg_tps)
    top = max(score(c) for c in pool)
    tol = TIE
    if by_measured:
        tol = min(0.5, max([TIE] + [c.measured_cv or 0.0 for c in pool if c.measured_cv is not None and
                                    (c.measured_cv or 0.0) <= 0.5]))
    near = [c for c in pool if score(c) >= top * (1 - tol)]
    q = min(_quality_key(c, bpw) for c in near)
    near = [c for c in near if _quality_key(c, bpw) == q]
    pp_top = max(c.pp_tps for c in near)
    near = [c for c in near if c.pp_tps >= pp_top * (1 - TIE)]
    return min(near, key=lambda c: (c.config.n_ubatch != 512, -c.margin_bytes))


def _distinct_top(ranked: Sequence[Candidate], bpw: Mapping[str, float], k: int) -> list[Candidate]:
    """The k best fitting candidates that differ in what decode speed depends on (quant, cache type, flash
    attention, layers offloaded) — each group represented by its own tie-broken choice; --ubatch-size and
    --batch-size variants are not worth a measurement each."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in ranked:
        if c.fits:
            key = (c.quant, c.config.cache_type_v, c.config.flash_attn, c.offloaded_layers)
            groups.setdefault(key, []).append(c)
    reps = [_choose(g, bpw) for g in groups.values()]
    return sorted(reps, key=lambda c: -c.tg_tps)[:k]


# flags whose llama.cpp default a tuned command leaves only for a measured gain: (RunConfig fields, default values)
_DEFAULT_FLAGS = (("--flash-attn", {"flash_attn": "auto"}),
                  ("--cache-type-k/v", {"cache_type_k": "f16", "cache_type_v": "f16", "flash_attn": "auto"}))


def _default_twins(c: Candidate, ranked: Sequence[Candidate]) -> list[Candidate]:
    """The fitting candidates that differ from ``c`` only in taking llama.cpp's default for one of
    :data:`_DEFAULT_FLAGS` (same quant, layers, batch sizes): measured beside ``c`` so that a flag's predicted gain
    is checked against a real run."""
    out = []
    for _, default in _DEFAULT_FLAGS:
        want = c.config.with_(**default)
        if want == c.config:
            continue
        twin = next((x for x in ranked if x.fits and x.quant == c.quant and x.config == want), None)
        if twin is not None and twin not in out:
            out.append(twin)
    return out


def _one_flag_from_default(c: Candidate, alt: Candidate) -> str:
    """The flag name when ``alt`` is ``c`` with llama.cpp's default for one of :data:`_DEFAULT_FLAGS`, else ""."""
    if c.quant != alt.quant or c.offloaded_layers != alt.offloaded_layers or c.config == alt.config:
        return ""
    return next((name for name, default in _DEFAULT_FLAGS if c.config.with_(**default) == alt.config), "")


def measured_gain(c: Candidate, alt: Candidate) -> tuple[float, float, bool]:
    """(gain, noise, beyond): ``c``'s measured decode minus ``alt``'s, the two runs' standard deviations added,
    and whether the gain exceeds that noise — a flag whose gain does not is not recommended for its predicted
    gain. (0, 0, False) unless both were measured."""
    if not (c.measured_tg_tps and alt.measured_tg_tps):
        return 0.0, 0.0, False
    gain = c.measured_tg_tps - alt.measured_tg_tps
    noise = c.measured_tg_tps * (c.measured_cv or 0.0) + alt.measured_tg_tps * (alt.measured_cv or 0.0)
    return gain, noise, gain > noise


# ------------------------------------------------------------------------------------------------
# measuring
# ------------------------------------------------------------------------------------------------

def _can_measure(device) -> tuple[bool, str]:
    if device.kind == "cpu":
        return True, ""
    try:
        import llama_cpp   # heavy, and absent without a llama.cpp build: only --measure on a GPU asks

        if llama_cpp.llama_supports_gpu_offload():
            return True, ""
    except Exception:  # noqa: BLE001 - no llama_cpp means no measurement either way
        pass
    return False, (f"--measure on {device.id} needs a GPU build of llama.cpp on this machine (this llama-cpp-python "
                   "cannot offload); measure on the machine that has the GPU, or tune for --device host")


def _measure(c: Candidate, m: ModelChoice, n_gen: int, repetitions: int) -> Candidate:
    # measured where it was predicted: decode after c.depth tokens (the middle of the required context)
    cfg = c.config
    need = c.depth + n_gen + 1
    if cfg.n_ctx and cfg.n_ctx < need:
        cfg = cfg.with_(n_ctx=need)
    rows = harness.run_tests(m.path, cfg, tests=[f"tg{n_gen}"], depths=[c.depth], repetitions=repetitions,
                           monitor=False)
    ok = [r for r in rows if r.get("status") == "ok" and r.get("avg_ts")]
    if not ok:
        reason = rows[0].get("reason") if rows else "no result"
        return replace(c, note=f"measurement failed: {reason}")
    r = ok[0]
    samples = [float(x) for x in (r.get("samples_ts") or []) if x]
    return replace(c, measured_tg_tps=float(r["avg_ts"]), measured_cv=r.get("cv"),
                   measured_best_tg_tps=max(samples) if samples else float(r["avg_ts"]),
                   note=f"tg{n_gen} r={repetitions} backend {r.get('backend')}" + ("; noisy" if r.get("noisy") else ""))


# ------------------------------------------------------------------------------------------------
# tune
# ------------------------------------------------------------------------------------------------

def tune(model: str, device, *, min_ctx: int = 4096, parallel: int = 1, quants: Sequence[str] | None = None,
         measure: bool = False, measure_top: int = MEASURE_TOP, n_gen: int = 64, repetitions: int = 3,
         host=None) -> TuneResult:
    """Search run configurations (and quants) for the fastest that fits ``device`` with a margin.

    ``model``: an architecture name (``qwen35-27b``: skeletons of :data:`DEFAULT_QUANTS` or ``quants``),
    ``skeleton:ARCH:QUANT``, a synthetic alias (its ladder), or one GGUF file / alias / URL.
    ``measure``: run the ``measure_top`` best predictions for real (``tg{n_gen}``, ``repetitions``) and choose by
    measurement (real files only; the device must be where this llama.cpp runs).
    ``host``: the CPU that holds what the GPU does not (``"host"``: this machine as its stored profile says)."""
    if min_ctx < 1:
        raise ConfigError(f"--min-ctx must be >= 1, got {min_ctx}")
    if parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {parallel}")
    dev = get_device(device)
    devices = [dev] if dev.kind == "cpu" else [dev] + ([get_device(host)] if host is not None else [])
    n_ctx = llama_context.pad(min_ctx, llama_context.CTX_PAD)
    # llama.cpp's limits that no candidate can meet: bad input, refused before any search
    for b in memory.limit_blockers(None, RunConfig(n_ctx=n_ctx, n_parallel=parallel), devices):
        raise ConfigError(b.line())
    if measure:
        ok, why = _can_measure(dev)
        if not ok:
            raise ConfigError(why)
    models = _models(model, quants)
    if measure and any(m.path is None for m in models):
        raise ConfigError(f"--measure needs real model files; '{model}' is an architecture description (skeleton)")
    depth = n_ctx // 2
    gpu = dev.kind != "cpu"
    notes: list[str] = []
    if any(d.id == "host" for d in devices):      # the host's rates: their profile's age, quality, mismatches
        hp = rates.describe_host_rates()
        notes += [f"host: {hp.line}"] + [f"host: warning: {w}" for w in hp.warnings]
    for m in models:
        seq = llama_context.context_sizes(m.spec, RunConfig(n_ctx=n_ctx, n_parallel=parallel)).n_ctx_seq
        if m.spec.n_ctx_train and seq > m.spec.n_ctx_train:
            notes.append(f"--min-ctx {min_ctx}: {memory.ctx_train_warning(m.spec, seq)}")
            break
    cands = [_fitted(m, devices, cfg, depth, gpu) for m in models for cfg in _configs(gpu, n_ctx, parallel)]
    if not any(c.fits for c in cands):
        raise NothingFits(_no_fit(model, dev, devices, models, cands, min_ctx, notes))
    bpw = {m.quant: m.spec.bits_per_weight for m in models}
    ranked = sorted(cands, key=lambda c: (not c.fits, -c.tg_tps))
    best = _choose(ranked, bpw)
    measured = False
    if measure:
        by_quant = {m.quant: m for m in models}
        top = _distinct_top(ranked, bpw, measure_top)
        top += [t for t in _default_twins(top[0] if top else best, ranked) if t.label not in {c.label for c in top}]
        done = {c.label: _measure(c, by_quant[c.quant], n_gen, repetitions) for c in top}
        ranked = [done.get(c.label, c) for c in ranked]
        timed = [c for c in ranked if c.measured_tg_tps]
        if timed:
            best = _choose(timed, bpw, by_measured=True)
            for alt in timed:       # a flag away from llama.cpp's default must earn its place by measurement
                if _one_flag_from_default(best, alt) and not measured_gain(best, alt)[2]:
                    notes.append(f"{_one_flag_from_default(best, alt)}: measured {measured_gain(best, alt)[0]:+.1f} "
                                 f"tok/s (± {measured_gain(best, alt)[1]:.1f}), not beyond the noise: llama.cpp's "
                                 "default kept")
                    best = alt
            measured = True
            noisy = [c for c in timed if (c.measured_cv or 0) > 0.05]
            if noisy:
                notes.append(f"{len(noisy)} of {len(timed)} measurements are noisy (cv > 5 %): the choice among "
                             "near-equal candidates may flip on a rerun")
        else:
            notes.append("every measurement failed: chose by prediction")
    m_best = next(m for m in models if m.quant == best.quant)
    argv = ("llama-server", "-m", m_best.file_arg, *best.config.to_server_argv())
    reasons = _reasons(best, m_best, models, devices, dev, ranked, depth, bpw)
    ordered = [best] + [c for c in ranked if c is not best and c.label != best.label]
    spec_advice = None
    if parallel == 1:      # speculation speeds one stream; with several users the batch already fills the pass
        spec_advice = speculation_advice(m_best.spec, devices, best.config, depth, m_best.file_arg)
    return TuneResult(model=str(model), device=dev.id, quant=best.quant, best=best, argv=argv,
                      reasons=tuple(reasons), candidates=tuple(ordered), margin_bytes=margin_bytes(dev),
                      min_ctx=min_ctx, measured=measured, notes=tuple(notes), speculation=spec_advice)


def _no_fit(model, dev, devices, models, cands, min_ctx, notes) -> NoFit:
    """The closest candidate (least total excess; then the fastest), with what would have to change (detailed)."""
    ordered = sorted(cands, key=lambda c: (c.distance, -c.tg_tps))
    closest = ordered[0]
    m = next(x for x in models if x.quant == closest.quant)
    detail = memory.feasibility(m.spec, devices, closest.config, detail=True)
    return NoFit(model=str(model), device=dev.id, min_ctx=min_ctx, blockers=detail.blockers or closest.blockers,
                 closest=closest, candidates=tuple(ordered), margin_bytes=margin_bytes(dev), notes=tuple(notes))


# ------------------------------------------------------------------------------------------------
# reasons: one per flag, each against the alternative that matters
# ------------------------------------------------------------------------------------------------

def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def signed_tps_delta(a: float, b: float) -> str:
    d = a - b
    return f"{'+' if d >= 0 else '−'}{abs(d):.2f} tok/s"


def _expert_reason(best: Candidate, m: ModelChoice, devices, depth) -> Reason:
    """Why the experts are in host memory: against dropping whole layers instead (the same flags, no expert offload,
    the most layers that fit), as llama.cpp's --fit prefers moving experts first."""
    cfg = best.config
    flag = "--cpu-moe" if cfg.cpu_moe else f"--n-cpu-moe {cfg.n_cpu_moe}"
    what = ("every layer's experts" if cfg.cpu_moe
            else f"the experts of the first {cfg.n_cpu_moe} of {m.spec.n_layer} layers")
    plain = cfg.with_(cpu_moe=False, n_cpu_moe=0, n_gpu_layers=ALL_LAYERS)
    fitted, _ = memory.fit_gpu_layers(m.spec, devices, plain, margin=True)
    alt = evaluate(m, devices, fitted, depth)
    why = (f"{what} in host memory (a MoE model reads {m.spec.expert_used_count} of {m.spec.expert_count} experts "
           f"per token), chosen before dropping whole layers as llama.cpp's --fit does")
    if alt.fits:
        why += (f": {signed_tps_delta(best.tg_tps, alt.tg_tps)} vs --gpu-layers {fitted.n_gpu_layers} without expert offload "
                f"({alt.tg_tps:.1f} tok/s)")
        return Reason(flag, why, best.tg_tps - alt.tg_tps)
    return Reason(flag, why + "; without it no layer split fits with the margin")


def _reasons(best: Candidate, m: ModelChoice, models, devices, dev, ranked, depth, bpw) -> list[Reason]:
    cfg = best.config
    out: list[Reason] = []
    gpu = dev.kind != "cpu"

    # -m: the quant
    others = {}
    for c in ranked:
        if c.quant != best.quant and c.quant not in others:
            others[c.quant] = c
    better = sorted((q for q in others if bpw.get(q, 0) > bpw.get(best.quant, 0)), key=lambda q: bpw[q])
    why = (f"{best.quant}: {best.weight_bytes / 1e9:.2f} GB of weights → ceiling {best.weights_ceiling_tg_tps:.1f} tok/s on "
           f"{dev.id}, predicted {best.tg_tps:.1f}")
    delta = None
    if better:
        q = better[0]
        alt = others[q]
        if alt.fits and alt.offloaded_layers < alt.n_layer_total:
            why += (f"; the better {q} fits with the margin only as a partial offload ({alt.offloaded_layers}/"
                    f"{alt.n_layer_total} layers): {alt.tg_tps:.1f} tok/s predicted"
                    + (f", all layers need {_mib(alt.full_offload_deficit_bytes)} more"
                       if alt.full_offload_deficit_bytes else ""))
            delta = best.tg_tps - alt.tg_tps
        elif alt.fits:
            why += f"; the better {q} fits too but predicts {alt.tg_tps:.1f} ({signed_tps_delta(best.tg_tps, alt.tg_tps)} here)"
            delta = best.tg_tps - alt.tg_tps
        else:
            why += f"; the better {q} does not fit with the margin (" + (
                alt.blockers[0].problem if alt.blockers else "it does not fit") + ")"
    elif len(models) > 1:
        why += "; the best-quality quant searched"
    out.append(Reason(f"-m {shell_word(m.file_arg)}", why, delta))

    # --gpu-layers
    if gpu:
        slots = best.n_layer_total
        if best.offloaded_layers >= slots:
            zero = evaluate(m, devices, cfg.with_(n_gpu_layers=0), depth)
            out.append(Reason(f"--gpu-layers {cfg.n_gpu_layers}",
                              f"all {slots} layer slots on {dev.id} (999 = every layer): {signed_tps_delta(best.tg_tps, zero.tg_tps)} "
                              f"vs --gpu-layers 0, the old default ({zero.tg_tps:.1f} tok/s with every layer on the CPU)",
                              best.tg_tps - zero.tg_tps))
        else:
            out.append(Reason(f"--gpu-layers {cfg.n_gpu_layers}",
                              f"{best.offloaded_layers}/{slots} layer slots fit with the margin; the other "
                              f"{slots - best.offloaded_layers} run on the CPU (a smaller quant or context would fit all)"))
        if cfg.cpu_moe or cfg.n_cpu_moe:
            out.append(_expert_reason(best, m, devices, depth))
    else:
        out.append(Reason(f"--gpu-layers {cfg.n_gpu_layers}", "a CPU device: nothing to offload"))

    # --ctx-size
    mx = memory.max_ctx(m.spec, devices, cfg, limit=max(cfg.n_ctx, m.spec.n_ctx_train), margin=True)
    out.append(Reason(f"--ctx-size {cfg.n_ctx}",
                      f"the context asked for (--min-ctx): KV cache {_mib(best.kv_bytes)}; a longer context costs memory, "
                      f"not decode speed while it is empty; this configuration has room for up to {mx} tokens "
                      "(with the margin on every device)", None, None))

    # --batch-size / --ubatch-size
    base_ub = evaluate(m, devices, cfg.with_(n_ubatch=512, n_batch=max(DEFAULT_BATCH, 512)), depth) \
        if cfg.n_ubatch != 512 else best
    ub_why = (f"{cfg.n_ubatch} tokens per physical batch: compute buffer {_mib(best.compute_bytes)}, prompt "
              f"{best.pp_tps:.0f} tok/s predicted")
    if cfg.n_ubatch != 512:
        ub_why += (f" vs {base_ub.pp_tps:.0f} at 512 ({_mib(base_ub.compute_bytes - best.compute_bytes)} "
                   "of compute buffer saved)" if base_ub.compute_bytes >= best.compute_bytes else
                   f" vs {base_ub.pp_tps:.0f} at 512 (+{_mib(best.compute_bytes - base_ub.compute_bytes)} of compute buffer)")
    ub_why += "; decode speed does not depend on it"
    out.append(Reason(f"--batch-size {cfg.n_batch}", "the logical batch: at least the physical one; it changes "
                      "nothing in memory or decode speed"))
    out.append(Reason(f"--ubatch-size {cfg.n_ubatch}", ub_why, None,
                      base_ub.compute_bytes - best.compute_bytes if cfg.n_ubatch != 512 else None))

    # cache types
    ct = cfg.cache_type_v
    alt_ct = "q8_0" if ct == "f16" else "f16"
    alt_cfg = cfg.with_(cache_type_k=alt_ct, cache_type_v=alt_ct, flash_attn="on" if alt_ct != "f16" else "auto")
    alt = evaluate(m, devices, alt_cfg, depth)
    if ct == "f16":
        kv_why = (f"f16 keeps the cache exact; q8_0 would save {_mib(best.kv_bytes - alt.kv_bytes)} and change decode by "
                  f"{signed_tps_delta(alt.tg_tps, best.tg_tps)} — not needed: {_mib(best.margin_bytes)} are left")
        kv_delta_b = best.kv_bytes - alt.kv_bytes
        kv_delta_t = best.tg_tps - alt.tg_tps
    else:
        need = "needed to fit with the margin" if not alt.fits else f"{signed_tps_delta(best.tg_tps, alt.tg_tps)} vs f16"
        kv_why = f"{ct} saves {_mib(alt.kv_bytes - best.kv_bytes)} of KV cache vs f16 ({need})"
        kv_delta_b = alt.kv_bytes - best.kv_bytes
        kv_delta_t = best.tg_tps - alt.tg_tps
    out.append(Reason(f"--cache-type-k {cfg.cache_type_k}", kv_why, kv_delta_t, kv_delta_b))
    out.append(Reason(f"--cache-type-v {cfg.cache_type_v}",
                      "same type as K" + (" (a quantized V needs flash attention: see --flash-attn)" if ct != "f16" else ""),
                      None, None))

    # flash attention
    if cfg.kv_quantized_v:
        fa_why = ("on: required — llama.cpp refuses a quantized V cache without flash attention "
                  "(\"quantized V cache requires flash_attn to be enabled\")")
        out.append(Reason(f"--flash-attn {cfg.flash_attn}", fa_why))
    else:
        other_fa = "off" if cfg.flash_attn != "off" else "auto"
        o = evaluate(m, devices, cfg.with_(flash_attn=other_fa), depth)
        if cfg.flash_attn == "auto":
            fa_why = (f"auto: llama.cpp turns it on where the device has the kernels; predicted {signed_tps_delta(best.tg_tps, o.tg_tps)} "
                      f"and {_mib(o.compute_bytes - best.compute_bytes)} less compute buffer than off")
        else:
            fa_why = (f"off: {signed_tps_delta(best.tg_tps, o.tg_tps)} vs auto ({_mib(best.compute_bytes - o.compute_bytes)} more "
                      "compute buffer); the seed saw no gain from it on a V100")
        out.append(Reason(f"--flash-attn {cfg.flash_attn}", fa_why, best.tg_tps - o.tg_tps,
                          o.compute_bytes - best.compute_bytes))

    # parallel
    out.append(Reason(f"--parallel {cfg.n_parallel}",
                      f"{cfg.n_parallel} server slot(s): each gets {cfg.n_ctx // cfg.n_parallel} of the {cfg.n_ctx} "
                      "cells; one user needs one (more slots share the same bandwidth)"))
    return out
