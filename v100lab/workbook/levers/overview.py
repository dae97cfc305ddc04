"""Notebook 00: the workbook's map, what this run studies, and the seed's staircase (claimed vs predicted vs measured, stage by stage).
"""

from __future__ import annotations

from dataclasses import replace

from v100lab.measure.harness import run_tests
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.base.errors import V100labError
from v100lab.models.resolve import resolve
from v100lab.workbook.scenario import Scenario
from v100lab.advise.seed import load_seed_claims, seed_staircase
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.workbook.levers.course import LESSONS
from v100lab.workbook.levers.steps import (GIB, beside, ctx_for, gpu_backend, lever_frame, measured_rows, parameters,
                                  predict_rows, reference_start, stage_model, study, threads_text, with_note)
from v100lab.workbook.render import reference_text

PARAMETERS = parameters("claims", "compare_gpu", "n_threads", "n_gen", "repetitions")


def notebook_map():
    """The notebooks of the workbook, in reading order, and the question each answers."""
    import pandas as pd  # heavy third-party dependency

    return pd.DataFrame([(x.notebook, x.question) for x in LESSONS], columns=["notebook", "what it shows"])


def scenario_facts(sc: Scenario):
    """What this run studies: the model, the device, what is measured here (or why not), the flags, and the
    run's reference measured at its start (:func:`v100lab.workbook.levers.steps.reference_start`; the headline
    measures it again at the end)."""
    import pandas as pd  # heavy third-party dependency

    st = study(sc)
    ref = reference_start(sc)
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
    if ref is not None:
        rows.append(("reference at the start", reference_text(ref)))
    gpu = beside(sc)
    if gpu is not None:
        rows.insert(3, ("GPU predicted beside it", f"{gpu.label} on {gpu.device.name} (compare_gpu): what fits and "
                                                   "the -ngl spill, which a CPU never shows (01, 05)"))
    return pd.DataFrame(rows, columns=["", "value"])


def staircase(sc: Scenario):
    """The seed's staircase: each stage claimed (the seed, its device) vs predicted (that device, the seed's
    assumed model) — and, on this machine, each stage's flags measured vs predicted for the measured model.

    Lever "stage", value "N name"; claimed rows only when the scenario's ``claims`` is "seed"."""
    st = study(sc)
    claims = load_seed_claims()
    relabel = {f"{s['id']} {s['name']}": stage_label(i, s) for i, s in enumerate(claims["stages"])}
    rows = [replace(o, value=relabel.get(o.value, o.value)) for o in seed_staircase(device=claims["device"])
            if sc.claims == "seed" or o.source != "claimed"]
    failures: list[dict[str, str]] = []
    depths = set()
    for i, stage in enumerate(claims["stages"]):
        label = stage_label(i, stage)
        cfg_map = dict(stage.get("config") or {})
        depth = int(stage.get("depth", 0))
        depths.add(depth)
        cfg = ctx_for(RunConfig.from_mapping({**cfg_map, "n_threads": sc.n_threads}), depth + sc.n_gen + 1)
        if not st.measuring:
            continue
        model, note = stage_model(st, stage["quant"])
        try:
            mspec = resolve(model, build=True).spec
        except V100labError as exc:
            failures.append({"lever": "stage", "value": label, "test": "", "reason": str(exc)})
            continue
        mlabel = st.measured_label
        rows += predict_rows(mspec, mlabel, st.host, cfg, lever="stage", value=label, depth=depth, n_gen=sc.n_gen,
                             metrics=("tg_tps", "physical_ceiling_tg_tps"), note=note)
        if sc.n_gen:
            got = run_tests(model, cfg, [f"tg{sc.n_gen}"], [depth], sc.repetitions, monitor=False,
                            lever="stage", value=label)
            obs, fails = measured_rows(got, mlabel)
            rows += [with_note(o, note) for o in obs]
            failures += fails
    here = (f"right: {st.measured_label}, each stage's own flags (-c, -fa, KV cache), depth "
            f"{'/'.join(map(str, sorted(depths)))}, {threads_text(sc.n_threads)}, tg{sc.n_gen} × {sc.repetitions}"
            if st.measuring else "")
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, conditions=here,
                  depth=next(iter(depths)) if len(depths) == 1 else None)


def stage_label(index: int, stage) -> str:
    """A seed stage's label: its place in the staircase (1, 2, … without gaps) and its name (the seed's own
    numbering skips to 9 for its section-9 figure; the name keeps that reference)."""
    return f"{index + 1} {stage['name']}"


def seed_stage(index: int = -1):
    """One stage of the seed's staircase (default: the last) as the by-hand cell needs it: (the seed's
    assumed model at the stage's quant, the seed's device, the stage's label in :func:`staircase`'s frame,
    the stage's claimed tok/s range)."""
    claims = load_seed_claims()
    stage = claims["stages"][index]
    spec = skeleton_spec(claims["model"]["arch"], stage["quant"])
    return spec, get_device(claims["device"]), stage_label(range(len(claims["stages"]))[index], stage), \
        tuple(stage["claimed_tps"])
