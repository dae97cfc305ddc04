"""Notebook 12, the final configuration: the tuned configuration (:func:`v100lab.advise.tune.tune`), its llama-server command with a reason per flag, its own staircase, and the seed's command judged flag by flag.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path

from v100lab.advise import tune
from v100lab.measure import harness
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError, V100labError
from v100lab.models.resolve import resolve
from v100lab.facts.results import Observation
from v100lab.workbook.scenario import Scenario
from v100lab.advise.seed import load_seed_claims, seed_verdict
from v100lab.gguf.skeleton import parse_skeleton_name, is_skeleton_name
from v100lab.models.zoo import cache_dir
from v100lab.workbook.levers.steps import (MIB, ctx_for, gpu_host, lever_frame, measured_rows, parameters, predict_rows, spec_at_quant, stage_model, loading_study, study, threads_text, with_note, gpu_subject)

PARAMETERS = parameters("claims", "compare_gpu", "n_parallel", "n_threads", "quants", "target_ctx", "n_gen",
                        "repetitions")


@lru_cache(maxsize=8)
def final_config(sc: Scenario):
    """The tuned configuration for the scenario (:func:`v100lab.advise.tune.tune`): the fastest that fits the
    device with a margin at ``target_ctx`` and ``n_parallel``, over ``quants`` when the model is a skeleton
    family or a synthetic ladder; measured and chosen by measurement when the device is this machine and the
    scenario measures. Cached per scenario (the notebook's cells share it)."""
    st = loading_study(sc)
    model = sc.model
    quants = None
    # the scenario's quants of 4 bits and more (tune.DEFAULT_QUANTS: the seed's own quality verdict on
    # Q3_K_M; notebook 04 measures what lower ones cost)
    family = tuple(q.upper() for q in sc.quants if q.upper() in tune.DEFAULT_QUANTS) or None
    if st.skeleton:
        model = parse_skeleton_name(model)[0]
        quants = family
    elif model.partition(":")[0].startswith("synth-") and ":" not in model:
        quants = family
    measure = st.measuring and st.device.kind == "cpu" and not sc.is_stand_in
    return tune.tune(model, st.device, min_ctx=sc.target_ctx, parallel=sc.n_parallel, quants=quants,
                        measure=measure, measure_top=2 if sc.repetitions <= 2 else 3, n_gen=max(1, sc.n_gen),
                        repetitions=sc.repetitions, host=gpu_host() if st.device.kind != "cpu" else None)


def command_reasons(sc: Scenario):
    """The tuned llama-server command, one row per flag with why it is there and what it buys."""
    import pandas as pd  # heavy third-party dependency

    t = final_config(sc)
    rows = [{"flag": _display_flag(r.flag), "why": r.why,
             "buys (tok/s)": None if r.delta_tps is None else round(r.delta_tps, 2),
             "saves (MiB)": None if r.delta_bytes is None else round(r.delta_bytes / MIB, 1)} for r in t.reasons]
    return pd.DataFrame(rows)


def tuned_command(sc: Scenario) -> list[str]:
    """The tuned llama-server command, as arguments, with the model named by a path a reader can use: the
    file's name when it lives inside the virtual environment or the model cache (where nobody would type it),
    else relative to the current folder when it is below it (:func:`display_path`). Show it with
    ``render.command`` (one flag per line, never wrapped)."""
    argv = list(final_config(sc).argv)
    if "-m" in argv[:-1]:
        i = argv.index("-m") + 1
        argv[i] = display_path(argv[i])
    return argv


def measured_candidates(sc: Scenario):
    """The candidates ``tune`` measured, beside their predictions: flags, predicted and measured decode (± one
    standard deviation of the repetitions), the error (predicted / measured − 1) and which one the command takes;
    with the best predicted candidate first when it was not measured. Empty when nothing was measured."""
    import pandas as pd  # heavy third-party dependency

    t = final_config(sc)
    shown = [c for c in t.candidates if c.measured_tg_tps]
    rows = []
    for c in shown:
        sd = c.measured_tg_tps * (c.measured_cv or 0.0)
        rows.append({"candidate": _flags_of(c), "predicted (tok/s)": round(c.tg_tps, 1),
                     "measured (tok/s)": f"{c.measured_tg_tps:.1f} ± {sd:.1f}",
                     "error": f"{100 * (c.tg_tps / c.measured_tg_tps - 1):+.0f} %",
                     "in the command": "yes" if c.label == t.best.label else ""})
    df = pd.DataFrame(rows, columns=["candidate", "predicted (tok/s)", "measured (tok/s)", "error", "in the command"])
    df.attrs["measured"] = t.measured
    return df


def _flags_of(c) -> str:
    cfg = c.config
    kv = cfg.cache_type_k if cfg.cache_type_k == cfg.cache_type_v else f"{cfg.cache_type_k}/{cfg.cache_type_v}"
    return f"{c.quant} -fa {cfg.flash_attn} -ctk/-ctv {kv} -ub {cfg.n_ubatch}"


def judge_flags(df):
    """Each flag's verdict from its predicted and measured gain (columns "predicted gain", "measured gain",
    "noise", tok/s): recommended only when the measured gain exceeds the noise; a predicted gain that measures
    nil or negative is not a reason to set the flag. Returns a copy with a "verdict" column."""
    out = df.copy()

    def verdict(pred, meas, noise):
        if meas != meas:                                 # not measured: the prediction is all there is
            return "predicted only"
        if meas > noise:
            return f"recommended: measured {meas:+.1f} tok/s, beyond the noise (± {noise:.1f})"
        what = "worse" if meas < -noise else "no difference beyond the noise"
        return (f"not recommended: measured {meas:+.1f} tok/s (± {noise:.1f}), {what}"
                + (f" — the predicted {pred:+.1f} does not hold here" if pred == pred and pred > 0 else ""))
    out["verdict"] = [verdict(p, m, n) for p, m, n in zip(out["predicted gain"], out["measured gain"], out["noise"])]
    return out


def flag_checks(sc: Scenario):
    """Every flag that ``tune`` measured both ways (its value and llama.cpp's default, all else equal), with the
    predicted and measured gain of the value over the default and :func:`judge_flags`' verdict."""
    import pandas as pd  # heavy third-party dependency

    t = final_config(sc)
    timed = [c for c in t.candidates if c.measured_tg_tps]
    rows = []
    for a in timed:
        for b in timed:
            flag = tune._one_flag_from_default(a, b)
            if flag:
                gain, noise, _ = tune.measured_gain(a, b)
                rows.append({"flag": flag, "value": _flags_of(a), "default": _flags_of(b),
                             "predicted gain": round(a.tg_tps - b.tg_tps, 2), "measured gain": round(gain, 2),
                             "noise": round(noise, 2)})
    df = pd.DataFrame(rows, columns=["flag", "value", "default", "predicted gain", "measured gain", "noise"])
    return judge_flags(df) if len(df) else df.assign(verdict=[])


def gpu_command(sc: Scenario) -> list[str]:
    """The tuned llama-server command for the GPU the lessons are about (:func:`gpu_subject`: the scenario's
    device, or the seed's model on the GPU beside this machine), predicted (nothing is measured there), as
    arguments to show with ``render.command``; empty when there is no such GPU or nothing fits it."""
    gpu = gpu_subject(sc)
    if gpu.device.kind == "cpu":
        return []
    model = gpu.model
    quants = None
    if is_skeleton_name(model):
        model = parse_skeleton_name(model)[0]
        quants = tuple(q.upper() for q in sc.quants if q.upper() in tune.DEFAULT_QUANTS) or None
    try:
        t = tune.tune(model, gpu.device, min_ctx=sc.target_ctx, parallel=sc.n_parallel, quants=quants,
                         host=gpu_host())
    except V100labError:
        return []
    argv = list(t.argv)
    if "-m" in argv[:-1]:
        i = argv.index("-m") + 1
        argv[i] = display_path(argv[i])
    return argv


def display_path(path: str) -> str:
    """A model path as the command shows it: inside the virtual environment or the v100lab cache, the file's
    name (``v100lab models`` says where it is); below the current folder, relative to it; else as it is."""
    p = Path(path)
    if not p.is_absolute():
        return path
    hidden = [Path(sys.prefix)]
    try:
        hidden.append(Path(cache_dir()))
    except (ImportError, OSError, V100labError):
        pass
    if any(_below(p, h) for h in hidden):
        return p.name
    if _below(p, Path.cwd()):
        return os.path.relpath(p)
    return path


def _below(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except (ValueError, OSError):
        return False


def _display_flag(flag: str) -> str:
    if flag.startswith("-m "):
        return "-m " + display_path(flag[3:])
    return flag


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
    flag = {"n_gpu_layers": "-ngl", "n_ctx": "-c", "cache_type_k": "-ctk", "cache_type_v": "-ctv",
            "flash_attn": "-fa", "n_batch": "-b", "n_ubatch": "-ub", "use_mlock": "--mlock", "n_parallel": "-np"}
    quant = own
    for name, changed, change in steps:
        if not changed:
            continue
        if change is None:
            quant = tuned.quant
            label = f"{len(stages) + 1} {tuned.quant}"
        else:
            before = cfg
            cfg = cfg.with_(**change)
            words = [flag[k] if isinstance(v, bool) else f"{flag[k]} {v}" for k, v in change.items()
                     if getattr(before, k) != v]
            label = f"{len(stages) + 1} " + " ".join(words)
        stages.append((label, quant, cfg))
    return stages


def own_staircase(sc: Scenario):
    """The scenario's own staircase, from llama.cpp's defaults to the tuned configuration, one change per
    stage: predicted on the scenario's device (with what fits) and, when measuring, measured here with each
    stage's flags (lever "stage"). Predicted and measured decode are both taken halfway through the
    context the tuned configuration must hold (depth ``target_ctx // 2``, as ``tune.tune`` ranks), so the
    two are comparable."""
    st = loading_study(sc)
    tuned = final_config(sc)
    rows: list[Observation] = []
    failures: list[dict[str, str]] = []
    depth = sc.target_ctx // 2
    for label, quant, cfg in _stage_configs(sc, tuned):
        try:
            spec = spec_at_quant(sc.model, quant)
        except ConfigError:
            spec = st.spec
        rows += predict_rows(spec, st.label, st.device, cfg, lever="stage", value=label, depth=depth,
                             n_gen=sc.n_gen, metrics=("tg_tps", "physical_ceiling_tg_tps"))
        if st.measuring and sc.n_gen:
            model, note = stage_model(st, quant)
            mcfg = ctx_for(cfg.with_(n_threads=sc.n_threads, n_parallel=1), depth + sc.n_gen + 1)
            try:
                mspec = resolve(model, build=True).spec
            except V100labError as exc:
                failures.append({"lever": "stage", "value": label, "test": "", "reason": str(exc)})
                continue
            if not st.same_model_here:
                rows += predict_rows(mspec, st.measured_label, st.host, mcfg, lever="stage", value=label,
                                     depth=depth, n_gen=sc.n_gen, metrics=("tg_tps", "physical_ceiling_tg_tps"),
                                     note=note)
            got = harness.run_tests(model, mcfg, [f"tg{sc.n_gen}"], [depth], sc.repetitions, monitor=False,
                                  lever="stage", value=label)
            obs, fails = measured_rows(got, st.measured_label)
            rows += [with_note(o, note) for o in obs]
            failures += fails
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, command=tuned.command, depth=depth,
                  conditions=f"each stage's own flags · decode at depth {depth} (halfway through -c {sc.target_ctx})"
                             + (f" · here: {st.measured_label}, {threads_text(sc.n_threads)}, "
                                f"tg{sc.n_gen} × {sc.repetitions}" if st.measuring else ""))


def seed_verdict_table(sc: Scenario):
    """The seed's final command against the tuned one for the seed's device and assumed model, flag by flag
    (:func:`v100lab.advise.seed.seed_verdict`); empty when the scenario's claims are not the seed's."""
    import pandas as pd  # heavy third-party dependency

    if sc.claims != "seed":
        return pd.DataFrame(columns=["flag", "seed", "tuned", "verdict"])
    claims = load_seed_claims()
    v = seed_verdict(device=claims["device"], arch=claims["model"]["arch"], min_ctx=2048)
    df = v.frame()
    df.attrs.update(seed_command=" ".join(v.seed_argv), tuned_command=v.tuned.command,
                    seed_predicted=v.seed_candidate.tg_tps, tuned_predicted=v.tuned.best.tg_tps,
                    claimed=v.claimed_tps, ceiling=v.seed_candidate.weights_ceiling_tg_tps, seed_problem=v.seed_problem)
    return df
