"""Notebook 11, loading the model: the load modes this llama.cpp build accepts (``--no-mmap`` and
``--mlock`` are folded into one ``llama_load_mode`` in current llama.cpp) and, per mode, the time to load the
model and create the context and the time to the first token after it, measured here.
"""

from __future__ import annotations

from v100lab.measure.backends import BenchTest, MeasureFailed
from v100lab.measure.backends.isolated import IsolatedBackend
from v100lab.facts.config import RunConfig
from v100lab.facts.results import Observation
from v100lab.workbook.scenario import Scenario
from v100lab.models.worker import WorkerCrashed
from v100lab.workbook.levers.steps import HOST, conditions, ctx_for, lever_frame, parameters, loading_study

PARAMETERS = parameters("n_ctx", "n_threads", "n_prompt", "repetitions")

# The flag combinations measured: (name, RunConfig flags). RunConfig.apply_to_model_params maps each to a
# llama_load_mode; load_modes() shows which.
MODES = (("mmap", dict(use_mmap=True, use_mlock=False)), ("no-mmap", dict(use_mmap=False, use_mlock=False)),
         ("mmap + mlock", dict(use_mmap=True, use_mlock=True)), ("no-mmap + mlock", dict(use_mmap=False, use_mlock=True)))
_FLAGS = {"mmap": "(default)", "no-mmap": "--no-mmap", "mmap + mlock": "--mlock", "no-mmap + mlock": "--no-mmap --mlock"}


def load_modes():
    """The load modes of the llama.cpp build in use (``llama_cpp.LLAMA_LOAD_MODE_*``, include/llama.h's
    ``enum llama_load_mode``), each with the build's own name for it, whether it is the build's default, and
    the flags (``--no-mmap``/``--mlock``, RunConfig's ``use_mmap``/``use_mlock``) that select it — modes no
    flag selects are listed as such. Also whether the build supports mmap and mlock on this machine."""
    import llama_cpp  # heavy dependency: llama-cpp-python (loads llama.cpp)
    import pandas as pd  # heavy third-party dependency

    by_value: dict[int, list[str]] = {}
    for name, flags in MODES:
        params = llama_cpp.llama_model_default_params()
        RunConfig(**flags).apply_to_model_params(params)
        by_value.setdefault(int(params.load_mode), []).append(_FLAGS[name])
    default = int(llama_cpp.llama_model_default_params().load_mode)
    namer = getattr(llama_cpp, "llama_load_mode_name", None)
    rows = []
    for const in sorted((n for n in dir(llama_cpp) if n.startswith("LLAMA_LOAD_MODE_")),
                        key=lambda n: getattr(llama_cpp, n)):
        value = int(getattr(llama_cpp, const))
        own = namer(value) if namer else None
        rows.append({"load mode": const.removeprefix("LLAMA_LOAD_MODE_").lower(), "value": value,
                     "llama.cpp's name": own.decode() if isinstance(own, bytes) else (own or "—"),
                     "build default": "yes" if value == default else "",
                     "selected by": ", ".join(by_value.get(value, [])) or "no flag here (not measured)"})
    df = pd.DataFrame(rows)
    df.attrs.update(supports_mmap=bool(llama_cpp.llama_supports_mmap()),
                    supports_mlock=bool(llama_cpp.llama_supports_mlock()))
    return df


def mmap_mlock(sc: Scenario):
    """Loading with each of :data:`MODES` (mmap, --no-mmap, --mlock, both) — the time to load the model and create the context,
    and the time to the first token after it (pp + one decoded token), measured here (lever "load_mode").
    The speed model does not model loading, so these rows have no prediction."""
    st = loading_study(sc)
    rows: list[Observation] = []
    failures: list[dict[str, str]] = []
    if not st.measuring:
        return lever_frame(rows, why_not_measured=st.why_not_measured)
    base = ctx_for(sc.run_config(), sc.n_prompt + 2)
    n_prompt = max(1, sc.n_prompt)
    for _ in range(max(1, min(sc.repetitions, 3))):
        for name, flags in MODES:
            cfg = base.with_(**flags)
            try:
                sess = IsolatedBackend().open(st.measured_path, cfg)
            except (MeasureFailed, WorkerCrashed) as exc:
                failures.append({"lever": "load_mode", "value": name, "test": "load", "reason": str(exc)})
                continue
            try:
                load_s = sess.info["load_s"]            # timed in the worker, around load + context creation
                m = sess.run(BenchTest(n_prompt, 1), 1, warmup=False)
            except (MeasureFailed, WorkerCrashed) as exc:
                failures.append({"lever": "load_mode", "value": name, "test": "first token", "reason": str(exc)})
                sess.close()
                continue
            try:
                first = sum(m.samples_ns) / 1e9
                warn = [w for w in (sess.load or {}).get("warnings", []) if "mlock" in w.lower()]
            finally:
                sess.close()
            note = "; ".join(["measured in-process"] + warn[:1])
            for metric, val in (("load_s", load_s), ("first_token_s", first)):
                rows.append(Observation(st.measured_label, st.measured_spec.file_type, HOST, "load_mode", name,
                                        metric, float(val), "s", "measured", note=note))
    return lever_frame(rows, failures, why_not_measured="",
                  conditions=conditions(base, st.measured_label, depth=None, fa=False,
                                        extra=[f"prompt {n_prompt} tokens + 1", f"{max(1, min(sc.repetitions, 3))} run(s)",
                                               "the file in the page cache after the first load"]))
