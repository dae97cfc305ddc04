"""The seed's claims judged: the blog post's staircase of configurations and tok/s, its ceiling table, and
the verdict on each stage (claimed vs predicted vs the physical ceiling).

``data/seed_claims.yaml`` holds what the seed claims (its device, its assumed model and server CPU, each
stage's quant and flags and claimed tok/s) and independent published rows. This module sits on top of the
predictions: it predicts every stage with :mod:`v100lab.predict.speed` and marks claims above the physical ceiling
(the bytes a token must read at peak bandwidth) as impossible.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from v100lab.advise.tune import Candidate, ModelChoice, TuneResult, evaluate, signed_tps_delta, tune
from v100lab.gguf import skeleton
from v100lab.predict import memory, speculative
from v100lab.facts.config import RunConfig, add_flag_arguments, from_flag_args
from v100lab.facts.devices import device_from_mapping, get_device
from v100lab.predict.rates import arch_spec, data_text
from v100lab.facts.results import TPS, Observation
from v100lab.predict.speed import predict

SEED_CLAIMS = "seed_claims.yaml"
# said beside every predicted stage on a CUDA card: the class is fitted on published rows, the V100's among them
CUDA_FIT_NOTE = ("CUDA rates fitted on published llama-bench rows, the V100 scoreboard row among them "
                 "(data/cuda_llama7b.csv)")


def load_seed_claims(path=None) -> dict[str, Any]:
    """``data/seed_claims.yaml`` (or ``path``): the seed's staircase, its ceiling table, and independent anchors."""
    import yaml   # third-party parser

    if path is None:
        return yaml.safe_load(data_text(SEED_CLAIMS))
    with open(path) as f:
        return yaml.safe_load(f)


def seed_host_device(claims: Mapping[str, Any]):
    """The seed's assumed server CPU (``host`` in the claims: uncalibrated, a catalog-like row)."""
    return device_from_mapping(claims["host"], "seed_claims.yaml host")


def seed_stage_prediction(stage: Mapping[str, Any], claims: Mapping[str, Any], device: str, arch: str):
    """Predict one stage: the stage's quant and flags on ``device`` plus the seed's (assumed) host CPU.
    A configuration that does not fit is predicted with the most GPU layers that do (what llama.cpp's
    ``--fit`` does; older builds refuse to load) and says so."""
    spec = arch_spec(arch, stage["quant"])
    cfg = RunConfig.from_mapping(stage.get("config") or {})
    gpu = get_device(device)
    host = seed_host_device(claims)
    devs = [gpu, host]
    cfg, note = memory.fit_gpu_layers(spec, devs, cfg)
    pred = predict(spec, devs, cfg, depth=int(stage.get("depth", 0)), n_prompt=512)
    return pred, spec, note


def seed_staircase(device: str = "v100-16gb", arch: str | None = None, claims_file=None) -> list:
    """The seed's staircase (its configurations, one change per stage, and the tok/s it claims for each) on
    ``device``: for each stage one "claimed" row per end of
    the claimed range and one "predicted" row, plus the seed's plain and the physical ceiling; claims
    above the physical ceiling are marked ``above_ceiling=True`` and noted "impossible"."""
    claims = load_seed_claims(claims_file)
    arch = arch or claims["model"]["arch"]
    own = {c["quant"]: float(c["claimed_ceiling_tps"]) for c in claims.get("ceiling_table", [])}
    rows: list = []
    for stage in claims["stages"]:
        pred, spec, note = seed_stage_prediction(stage, claims, device, arch)
        label = f"{stage['id']} {stage['name']}"
        strict = pred.physical_ceiling_tg_tps
        plain = pred.weights_ceiling_tg_tps
        lo, hi = stage["claimed_tps"]
        for v in sorted({float(lo), float(hi)}):
            above = v > strict
            above_plain = v > plain
            why = "impossible: above the physical ceiling" if above else (
                "above the seed's plain ceiling (bandwidth / file size)" if above_plain else "")
            if stage["quant"] in own and v > own[stage["quant"]]:
                why = "; ".join(x for x in (why, f"above the seed's own ceiling ({own[stage['quant']]:g})") if x)
            rows.append(Observation(model=claims["model"]["label"], quant=stage["quant"], device=device,
                                    lever="stage", value=label, metric="tg_tps", result=v, unit="tok/s",
                                    source="claimed", above_ceiling=above,
                                    note="; ".join(x for x in (why, claims.get("source", "")) if x)))
        rows.append(Observation(model=claims["model"]["label"], quant=stage["quant"], device=device, lever="stage",
                                value=label, metric="tg_tps", result=pred.tg_tps, unit="tok/s", source="predicted",
                                above_ceiling=pred.tg_tps > strict,
                                note="; ".join(x for x in (f"bound: {pred.bound}", note,
                                                           CUDA_FIT_NOTE if get_device(device).kind == "gpu" else "")
                                               if x)))
        for metric, val in (("weights_ceiling_tg_tps", plain), ("physical_ceiling_tg_tps", strict)):
            rows.append(Observation(model=claims["model"]["label"], quant=stage["quant"], device=device, lever="stage",
                                    value=label, metric=metric, result=val, unit="tok/s", source="predicted",
                                    note="seed's plain ceiling" if metric == "weights_ceiling_tg_tps" else
                                    "bytes read per token at peak bandwidth"))
    return rows


def parallel_claim(claims=None) -> dict[str, Any]:
    """The seed's ``--parallel`` advice as data (``parallel`` in ``seed_claims.yaml``): its words, the slot
    count it names, the metric it is about and the bound it puts that metric under (a direction, no figure)."""
    c = (claims if isinstance(claims, Mapping) else load_seed_claims(claims))["parallel"]
    return {"advice": str(c["advice"]), "slots": int(c["slots"]), "metric": str(c["metric"]),
            "below": float(c["below"])}


def parallel_claim_rows(model: str, quant: str, device: str, slots: int | None = None, claims=None) -> list:
    """The seed's ``--parallel`` claim as a "claimed" row of the tidy table (lever ``n_parallel``): at
    ``slots`` (default: the slot count the seed names) one user's decode speed ÷ its speed at ``-np 1`` is
    below :func:`parallel_claim`'s bound — ``result`` holds that bound and the note says it is an upper one."""
    c = parallel_claim(claims)
    n = c["slots"] if slots is None else int(slots)
    where = "" if n == c["slots"] else f"; tested at -np {n} (the seed names {c['slots']})"
    return [Observation(model=model, quant=quant, device=device, lever="n_parallel", value=str(n),
                        metric=c["metric"], result=c["below"], unit="×", source="claimed",
                        group="concurrency 1",
                        note=f"claimed: below {c['below']:g} (the seed gives no figure): '{c['advice']}'{where}")]


# ------------------------------------------------------------------------------------------------
# the seed's final command, checked
# ------------------------------------------------------------------------------------------------

# The seed post's final command, verbatim; the post says flash attention was left off.
SEED_ARGV = ("llama-server", "-m", "qwen-27b-instruct-q4_0.gguf", "--host", "0.0.0.0", "--port", "8080",
             "--ctx-size", "2048", "--batch-size", "512", "--ubatch-size", "512", "--gpu-layers", "999",
             "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--parallel", "1", "--mlock")
SEED_QUANT = "Q4_0"
SEED_CLAIMED_TPS = (63.0, 65.0)   # the tok/s the post claims for that command (its stage 6)


def seed_config() -> RunConfig:
    """The seed's final command as a RunConfig (llama.cpp's own flag parser spellings; -fa left off)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-m", "--model")      # taken here, or argparse reads -m as short for -md (the draft model)
    add_flag_arguments(p)
    args, _ = p.parse_known_args(list(SEED_ARGV[1:]))
    return from_flag_args(args).with_(flash_attn="off")


@dataclass(frozen=True)
class SeedVerdict:
    """The seed's final command next to the tuned one: flag by flag, with predictions."""

    device: str
    arch: str
    seed_argv: tuple[str, ...]
    seed_config: RunConfig
    seed_candidate: Candidate           # the seed's configuration, predicted (fits: with our margin)
    seed_runs: bool                     # False: llama.cpp refuses it (quantized V without flash attention)
    seed_problem: str
    tuned: TuneResult
    rows: tuple[tuple[str, str, str, str], ...]   # (flag, seed, tuned, verdict)
    claimed_tps: tuple[float, float] = SEED_CLAIMED_TPS

    def frame(self):
        import pandas as pd   # heavy: only the tables need it

        return pd.DataFrame(list(self.rows), columns=["flag", "seed", "tuned", "verdict"])

    def observations(self) -> list:
        """Claimed, seed-predicted and tuned-predicted decode tok/s (+ the ceiling), lever "command"."""
        c = self.seed_candidate
        base = dict(model=self.arch, device=self.device, lever="command", metric="tg_tps", unit=TPS)
        rows = [Observation(**base, quant=SEED_QUANT, value="seed", result=v, source="claimed",
                            above_ceiling=v > c.weights_ceiling_tg_tps, note="the seed's section 8, stage 6")
                for v in self.claimed_tps]
        rows.append(Observation(**base, quant=SEED_QUANT, value="seed", result=c.tg_tps, source="predicted",
                                above_ceiling=False, note=self.seed_problem or "runs"))
        t = self.tuned.best
        rows.append(Observation(**base, quant=t.quant, value="tuned", result=t.tg_tps, source="predicted",
                                above_ceiling=False, note=t.label))
        rows.append(Observation(model=self.arch, quant=SEED_QUANT, device=self.device, lever="command", value="seed",
                                metric="weights_ceiling_tg_tps", result=c.weights_ceiling_tg_tps, unit=TPS, source="predicted",
                                note="bandwidth / weight bytes"))
        return rows

    def format_text(self) -> str:
        c, t = self.seed_candidate, self.tuned.best
        lines = [f"seed:  {' '.join(self.seed_argv)}",
                 f"       predicted {c.tg_tps:.1f} tok/s (claimed {self.claimed_tps[0]:g}–{self.claimed_tps[1]:g}, "
                 f"ceiling {c.weights_ceiling_tg_tps:.1f})" + (f"; {self.seed_problem}" if self.seed_problem else ""),
                 f"tuned: {self.tuned.command}",
                 f"       predicted {t.tg_tps:.1f} tok/s", ""]
        w = max(len(r[0]) for r in self.rows)
        ws = max(len(r[1]) for r in self.rows)
        wt = max(len(r[2]) for r in self.rows)
        for flag, s, tv, verdict in self.rows:
            lines.append(f"  {flag:<{w}}  {s:>{ws}} → {tv:<{wt}}  {verdict}")
        return "\n".join(lines)


def seed_verdict(device: str = "v100-16gb", arch: str = "qwen35-27b", min_ctx: int = 2048,
                 quants: Sequence[str] | None = None) -> SeedVerdict:
    """Tune the seed's scenario (``arch`` on ``device`` with ``min_ctx``) and compare with the seed's command.

    One call for notebook 08: ``v = seed_verdict(); print(v.format_text()); v.frame()``."""
    dev = get_device(device)
    tuned = tune(arch, dev, min_ctx=min_ctx, quants=quants)
    scfg = seed_config()
    m = ModelChoice(arch, SEED_QUANT, skeleton.skeleton_spec(arch, SEED_QUANT), None, SEED_ARGV[2])
    depth = tuned.best.depth
    seed_c = evaluate(m, [dev], scfg, depth)
    runs = not (scfg.kv_quantized_v and scfg.flash_attn == "off")
    problem = "" if runs else ("llama.cpp refuses it: a q8_0 V cache needs flash attention (\"quantized V cache "
                               "requires flash_attn to be enabled\"); newer builds' default -fa auto turns it on")
    t = tuned.config
    rows = []

    def verdict(flag, sv, tv, why):
        rows.append((flag, str(sv), str(tv), why if str(sv) != str(tv) else "kept: " + why))

    verdict("-m (quant)", SEED_QUANT, tuned.quant, "fastest ≥4-bit quant that fits with the margin")
    verdict("--gpu-layers", scfg.n_gpu_layers, t.n_gpu_layers, "every layer on the GPU")
    verdict("--ctx-size", scfg.n_ctx, t.n_ctx, "the context asked for")
    verdict("--batch-size", scfg.n_batch, t.n_batch, "changes neither memory nor decode speed")
    verdict("--ubatch-size", scfg.n_ubatch, t.n_ubatch,
            f"prompt {tuned.best.pp_tps:.0f} vs {seed_c.pp_tps:.0f} tok/s predicted; decode unchanged")
    seed_kv = scfg.cache_type_v
    verdict("--cache-type-k/v", seed_kv, t.cache_type_v,
            f"KV {seed_c.kv_bytes / 2**20:.0f} vs {tuned.best.kv_bytes / 2**20:.0f} MiB; decode "
            f"{signed_tps_delta(tuned.best.tg_tps, seed_c.tg_tps)}; f16 fits, so no need to quantize" if t.cache_type_v == "f16"
            else "needed to fit")
    verdict("--flash-attn", scfg.flash_attn + " (left off)", t.flash_attn,
            "q8_0 V with flash attention off is refused by llama.cpp" if not runs else "as predicted")
    verdict("--parallel", scfg.n_parallel, t.n_parallel, "one user, one slot")
    verdict("--mlock", "yes", "yes" if t.use_mlock else "no",
            "every layer is on the GPU: only token_embd stays in host memory, so locking it buys no decode speed")
    return SeedVerdict(device=dev.id, arch=arch, seed_argv=SEED_ARGV, seed_config=scfg, seed_candidate=seed_c,
                       seed_runs=runs, seed_problem=problem, tuned=tuned, rows=tuple(rows))


MTP_DRAFT = 2    # the draft length published V100 sweeps of MTP found best


def seed_mtp_stage(device: str = "v100-16gb", arch: str | None = None, claims_file=None, n_draft: int = MTP_DRAFT,
                   alpha: float | None = None) -> list:
    """A predicted stage after the seed's last: its configuration with an MTP head drafting ``n_draft`` tokens
    (``--spec-type draft-mtp``) at per-token acceptance ``alpha`` (None: :func:`v100lab.predict.speculative.assumed_alpha`,
    said in the note) — the stage's tok/s, and the plain and speculative ceilings (plain × tokens per pass)."""
    claims = load_seed_claims(claims_file)
    arch = arch or claims["model"]["arch"]
    stage = claims["stages"][-1] if claims["stages"][-1]["quant"] != "Q3_K_M" else claims["stages"][-2]
    spec = arch_spec(arch, stage["quant"])
    devs = [get_device(device), seed_host_device(claims)]
    cfg, fit_note = memory.fit_gpu_layers(spec, devs, RunConfig.from_mapping(stage.get("config") or {}))
    p = speculative.predict(spec, devs, cfg, spec_type="draft-mtp", n_draft=n_draft, alpha=alpha,
                            depth=int(stage.get("depth", 0)))
    label = f"{stage['id']}+ with MTP (draft {n_draft}, predicted)"
    note = "; ".join(x for x in (*p.notes, fit_note, f"{p.speedup:.2f}× the same stage without MTP") if x)
    base = dict(model=claims["model"]["label"], quant=stage["quant"], device=device, lever="stage", value=label,
                unit="tok/s", source="predicted")
    return [Observation(metric="tg_tps", result=p.tps, note=note, bound="speculative", **base),
            Observation(metric="tg_tps_without_mtp", result=p.plain_tps, note=f"stage {stage['id']} as predicted",
                        **base),
            Observation(metric="weights_ceiling_tg_tps", result=p.plain_ceiling_tps, note="seed's plain ceiling",
                        **base),
            Observation(metric="speculative_ceiling_tg_tps", result=p.ceiling_tps,
                        note=f"plain ceiling × {p.tokens_per_pass:.2f} tokens per pass", **base)]
