"""The seed's claims judged: the blog post's staircase of configurations and tok/s, its ceiling table, and
the verdict on each stage (claimed vs predicted vs the physical ceiling).

``data/seed_claims.yaml`` holds what the seed claims (its device, its assumed model and server CPU, each
stage's quant and flags and claimed tok/s) and independent published rows. This module sits on top of the
predictions: it predicts every stage with :mod:`v100lab.speed` and marks claims above the physical ceiling
(the bytes a token must read at peak bandwidth) as impossible.
"""

from __future__ import annotations

from typing import Any, Mapping

from v100lab import memory, speculative
from v100lab.config import RunConfig
from v100lab.devices import device_from_mapping, get_device
from v100lab.rates import arch_spec, data_text
from v100lab.results import Observation
from v100lab.speed import predict

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


MTP_DRAFT = 2    # the draft length published V100 sweeps of MTP found best


def seed_mtp_stage(device: str = "v100-16gb", arch: str | None = None, claims_file=None, n_draft: int = MTP_DRAFT,
                   alpha: float | None = None) -> list:
    """A predicted stage after the seed's last: its configuration with an MTP head drafting ``n_draft`` tokens
    (``--spec-type draft-mtp``) at per-token acceptance ``alpha`` (None: :func:`v100lab.speculative.assumed_alpha`,
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
