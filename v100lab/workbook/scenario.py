"""The scenario: the ONE schema behind ``params/*.yaml`` and every notebook's parameters cell.

A scenario says which model to study, which device the predictions are for, which levers to sweep and
how much measuring to do. One parameter file drives every notebook of a batch, so all notebooks accept
the same keys; a notebook reads the part it needs. An unknown key is a :class:`ConfigError` everywhere
(parameter file, notebook, papermill's injected parameters) — a key a notebook does not use is not.

The schema is the frozen dataclass :class:`Scenario` itself: each field's name, type annotation,
default and ``metadata`` (``help`` comment, ``group``, ``choices``, ``min``) is the single source of
truth. Everything else is generated from it:

* ``load_scenario(path | dict)`` validates a parameter file (YAML) or a mapping;
* ``from_notebook(globals())`` validates a notebook's parameters after papermill injected them: the
  names in the notebook's namespace that are scenario keys, and nothing else;
* ``parameters_cell_source(keys)`` writes the typed, commented literals of a notebook's ``parameters``
  cell for the keys that notebook reads (``v100lab.workbook.levers.course.keys_of``), so notebooks and schema never
  drift (a test compares every notebook's cell with it).

The llama.cpp flags are :class:`v100lab.facts.config.RunConfig`'s fields under the same names; their
defaults are read from ``RunConfig`` and ``Scenario.run_config()`` builds a ``RunConfig``, whose own
validation applies (cache types, ``n_ubatch <= n_batch``, ...), so none of it is repeated here.

List-valued keys are written as lists (YAML, notebook literals) and stored as tuples (hashable,
immutable); ``to_parameters()`` gives them back as lists, the form papermill injects.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import types
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

import yaml

from v100lab.facts.config import CACHE_TYPES, RunConfig, normalize_flash_attn
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError, V100labError
from v100lab.base.safeio import read_text_bounded, load_yaml, short_repr
from v100lab.models.zoo import LADDER, ftype_of

GROUPS = {
    "scenario": "the scenario: what is studied, for which device",
    "flags": "llama.cpp flags (v100lab.facts.config.RunConfig; llama.cpp's defaults)",
    "sweeps": "levers swept by the notebooks",
    "budget": "measurement budget",
    "fleet": "where `v100lab batch --engine ray` runs it (ignored by the local engine)",
}

CLAIMS = ("seed", "none")
MAX_PARAMETER_FILE_BYTES = 1 << 20
CORPORA = ("pydoc_data.topics",)


def _key(default, help: str, group: str, *, choices: tuple | None = None, min: int | None = None,
         check: Callable[[Any], None] | None = None, empty: bool = False):
    """A scenario key: default value plus the metadata the validators and the cell generator read.

    ``help`` must not contain "=": papermill's parameter parser skips any line with two of them.

    ``choices``/``min`` apply to the value or to each item of a list; ``check(item)`` may raise any
    V100labError, whose message is reported under the key's name."""
    if "=" in help:
        raise ValueError(f"scenario key help must not contain '=': {help!r}")
    meta = {"help": help, "group": group, "choices": choices, "min": min, "check": check, "empty": empty}
    if isinstance(default, dict):   # a mapping key: each Scenario gets its own copy
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def _flag(name: str, help: str, empty: bool = False):
    """A key that is a RunConfig field: its default is RunConfig's (llama.cpp's), never restated. ``empty``:
    an empty string is a value (a flag that is not given)."""
    return _key(getattr(RunConfig, name), help, "flags", empty=empty)


NO_GPU = "none"


def _gpu_or_none(value: str) -> None:
    """``compare_gpu``: ``none``, or a catalog GPU (or a device file) — a CPU cannot stand in for the GPU."""
    if value == NO_GPU:
        return
    if value == "host" or get_device(value).kind != "gpu":
        raise ConfigError(f"'{value}' is not a GPU (a catalog GPU id such as v100-16gb, a GPU device file, "
                          f"or {NO_GPU})")


def _resource(item: tuple[str, float]) -> None:
    """``resources``: a Ray resource name and a positive amount; CPU and GPU may be fractional, as in Ray."""
    name, amount = item
    if not _NAME.fullmatch(name):
        raise ConfigError(f"resource name {name!r} is not a Ray resource name (letters, digits, _ - . : /)")
    if amount <= 0:
        raise ConfigError(f"{name}: the amount must be > 0, got {amount:g}")


def _accelerator(value: str) -> None:
    if not _NAME.fullmatch(value):
        raise ConfigError(f"{value!r} is not an accelerator type (letters, digits, _ - .; e.g. V100, T4, A100)")


def _label(item: tuple[str, str]) -> None:
    for part in item:
        if not _NAME.fullmatch(part):
            raise ConfigError(f"{part!r} is not a node label key or value (letters, digits, _ - . : /)")


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")


def _server_url(value: str) -> None:
    """``server_url``: http:// or https://, a host and a port, no path (or just "/"), no query or user info."""
    try:
        u = urlsplit(value)
        port = u.port
    except ValueError as exc:
        raise ConfigError(f"{value!r} is not a URL: {exc}") from None
    if u.scheme not in ("http", "https") or not u.hostname or port is None or u.path not in ("", "/") \
            or u.query or u.fragment or u.username or u.password or any(c.isspace() for c in value):
        raise ConfigError(f"{value!r} is not a llama-server address: write http://HOST:PORT "
                          "(or https://), with no path")


@dataclass(frozen=True)
class Scenario:
    """One validated scenario (see the module docstring). Build with ``load_scenario``/``from_notebook``."""

    # ---- the scenario -------------------------------------------------------------------------
    scenario: str = _key("default", "name shown in reports and in the batch index", "scenario")
    model: str = _key("default", "model studied: GGUF path, http(s) URL or zoo alias "
                      "(default, gemma3-270m, synth-1b, synth-280m:Q4_0, ...)", "scenario")
    stand_in_model: str | None = _key(
        None, "model measured here when `model` is a header-only skeleton or too big for this "
        "machine (None: measure `model`); its rows are labelled stand-in", "scenario")
    device: str = _key("host", "device the predictions are for: catalog id (v100-16gb, ...) or a "
                       "device YAML file; host: this machine, measured", "scenario")
    compare_devices: tuple[str, ...] = _key((), "catalog ids to compare the ceiling across "
                                            "(02); []: the whole catalog", "scenario")
    compare_gpu: str = _key("v100-16gb", "GPU predicted beside this machine when `device` is a CPU: the "
                            "seed's model on it (01 what fits, 05 -ngl and the spill); none: no GPU",
                            "scenario", check=_gpu_or_none)
    measure: bool = _key(True, "run real llama.cpp measurements here (False: predictions only)",
                         "scenario")
    server_url: str | None = _key(None, "an already running llama-server measured instead of this machine, "
                                  "http://HOST:PORT; flags it was started with stay (None: llama.cpp here)",
                                  "scenario", check=_server_url)
    claims: str = _key("seed", "reference rows to plot: seed (the blog post's claimed figures) "
                       "or none", "scenario", choices=CLAIMS)

    # ---- llama.cpp flags (RunConfig) ----------------------------------------------------------
    n_gpu_layers: int = _flag("n_gpu_layers", "-ngl: layers offloaded to the GPU (999: all)")
    n_ctx: int = _flag("n_ctx", "-c: context size in tokens (0: the model's training context)")
    n_batch: int = _flag("n_batch", "-b: logical batch size")
    n_ubatch: int = _flag("n_ubatch", "-ub: physical batch size, at most n_batch")
    cache_type_k: str = _flag("cache_type_k", "-ctk: K cache type")
    cache_type_v: str = _flag("cache_type_v", "-ctv: V cache type (quantized V needs flash attention)")
    flash_attn: str = _flag("flash_attn", "-fa: on, off or auto")
    n_parallel: int = _flag("n_parallel", "-np: parallel sequences (server slots)")
    kv_unified: bool = _flag("kv_unified", "--kv-unified: one KV buffer shared by all sequences")
    swa_full: bool = _flag("swa_full", "--swa-full: full-size cache for sliding-window layers")
    use_mmap: bool = _flag("use_mmap", "False: --no-mmap (read the model instead of mapping it)")
    use_mlock: bool = _flag("use_mlock", "--mlock: lock the model in RAM")
    n_threads: int = _flag("n_threads", "-t: CPU threads (0: llama.cpp's choice, all cores)")
    tensor_split: tuple[float, ...] = _flag("tensor_split", "-ts: per-GPU proportions ([]: llama.cpp's split)")
    n_cpu_moe: int = _flag("n_cpu_moe", "-ncmoe: MoE experts of the first N layers kept on the CPU")
    cpu_moe: bool = _flag("cpu_moe", "-cmoe: every layer's MoE experts kept on the CPU")
    override_tensor: tuple[str, ...] = _flag("override_tensor", "-ot: tensor overrides, each a name "
                                             "pattern, an equals sign, a buffer type (CPU, CUDA0)")
    spec_type: str = _flag("spec_type", "--spec-type: speculative decoding (none, draft-simple, draft-mtp, "
                           "ngram-simple, ngram-mod, ...; llama-server only)")
    draft_max: int = _flag("draft_max", "--spec-draft-n-max: tokens drafted per pass (0: the type's default)")
    draft_min: int = _flag("draft_min", "--spec-draft-n-min: fewest tokens drafted")
    draft_p_min: float = _flag("draft_p_min", "--spec-draft-p-min: stop drafting below this probability")
    draft_model: str = _flag("draft_model", "-md: draft model file for draft-simple (empty: none)", empty=True)
    ngram_size_n: int = _flag("ngram_size_n", "--spec-ngram-*-size-n: n-gram lookup length (0: the type's default)")

    # ---- levers swept by the notebooks --------------------------------------------------------
    quants: tuple[str, ...] = _key(LADDER, "quant ladder: predicted for `model`, measured on "
                                   "`ladder_model` (04)", "sweeps", check=ftype_of)
    ladder_model: str = _key("synth-280m", "synthetic zoo alias whose quant ladder is built and "
                             "measured here (04)", "sweeps")
    ctx_sizes: tuple[int, ...] = _key((2048, 4096, 8192, 16384, 32768),
                                      "context sizes (01 what-fits heatmap, 06 KV memory)", "sweeps", min=0)
    cache_types: tuple[str, ...] = _key(("f16", "q8_0", "q4_0"), "KV cache types (01, 06)", "sweeps",
                                        choices=CACHE_TYPES)
    depths: tuple[int, ...] = _key((0, 512, 1024, 2048), "tokens already in the context when decode "
                                   "is measured (06; llama-bench -d)", "sweeps", min=0)
    gpu_layers: tuple[int, ...] = _key((), "-ngl values for the offload sweep (05); []: every "
                                       "value from 0 to all layers", "sweeps", min=0)
    batch_sizes: tuple[int, ...] = _key((128, 512, 2048), "n_ubatch values for the batch sweep, "
                                        "n_batch at least each (07)", "sweeps", min=1)
    parallel_slots: tuple[int, ...] = _key((1, 2, 4), "-np values through llama-server (07)",
                                           "sweeps", min=1)
    thread_counts: tuple[int, ...] = _key((), "-t values for the threads sweep (07); []: 1 up to "
                                          "this machine's cores", "sweeps", min=1)
    target_ctx: int = _key(2048, "context the tuned configuration must hold (08)", "sweeps", min=1)

    # ---- measurement budget -------------------------------------------------------------------
    n_prompt: int = _key(512, "prompt tokens per pp test (llama-bench -p)", "budget", min=0)
    n_gen: int = _key(128, "generated tokens per tg test (llama-bench -n)", "budget", min=0)
    repetitions: int = _key(5, "repetitions per test (llama-bench -r); reports show the spread",
                            "budget", min=1)
    perplexity_corpus: str = _key("pydoc_data.topics", "text for perplexity and KL divergence (04): "
                                  "Python's own help text, ships with CPython", "budget", choices=CORPORA)
    perplexity_ctx: int = _key(256, "tokens per perplexity chunk (even; llama-perplexity -c)",
                               "budget", min=16)
    perplexity_chunks: int = _key(4, "chunks scored per quant (cost: chunks x ctx tokens per model)",
                                  "budget", min=1)

    # ---- where a Ray batch runs it --------------------------------------------------------------
    resources: dict[str, float] = _key({}, "Ray resources each run needs, name: amount (GPU, "
                                       "bench, a custom resource); {}: one CPU", "fleet", check=_resource)
    accelerator_type: str | None = _key(None, "GPU type the node must have, as Ray names it (V100, "
                                           "T4, A100); None: any", "fleet", check=_accelerator)
    node_labels: dict[str, str] = _key({}, "labels the node must carry (ray start --labels); {}: any",
                                       "fleet", check=_label)

    def __post_init__(self):
        hints = _hints()
        for f in fields(self):
            value = _check(f.name, getattr(self, f.name), hints[f.name], f.metadata)
            object.__setattr__(self, f.name, value)
        # llama.cpp's own spellings of -fa (1, true, enabled, ...) mean on/off/auto here too
        object.__setattr__(self, "flash_attn", normalize_flash_attn(self.flash_attn))
        if self.n_prompt == 0 and self.n_gen == 0:
            raise ConfigError("n_prompt/n_gen: at least one must be > 0")
        if self.perplexity_ctx % 2:
            raise ConfigError(f"perplexity_ctx: must be even, got {self.perplexity_ctx}")
        self.run_config()  # RunConfig's own validation, with its messages naming the key

    def __hash__(self):   # by value, mapping keys included (the notebooks cache per scenario)
        return hash(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v
                          for v in (getattr(self, f.name) for f in fields(self))))

    # ---- views --------------------------------------------------------------------------------
    def run_config(self) -> RunConfig:
        """The llama.cpp flags of this scenario as a validated ``RunConfig``."""
        return RunConfig(**{name: getattr(self, name) for name in run_config_keys()})

    @property
    def measured_model(self) -> str:
        """The model measured on this machine: ``stand_in_model`` when set, else ``model``."""
        return self.stand_in_model or self.model

    @property
    def is_stand_in(self) -> bool:
        return self.stand_in_model is not None

    def to_parameters(self) -> dict[str, Any]:
        """Plain values (lists, not tuples), as papermill injects them and YAML writes them."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def with_(self, **changes) -> "Scenario":
        """A validated copy with some keys changed (unknown keys: ConfigError)."""
        _reject_unknown(changes, "with_()")
        return replace(self, **changes)


# --------------------------------------------------------------------------------------------
# type checking (driven by the annotations)
# --------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _hints() -> dict[str, Any]:
    return get_type_hints(Scenario)


def keys() -> tuple[str, ...]:
    """Every scenario key, in schema order."""
    return tuple(f.name for f in fields(Scenario))


def run_config_keys() -> tuple[str, ...]:
    """The keys that are RunConfig fields (the llama.cpp flags)."""
    rc = {f.name for f in fields(RunConfig)}
    return tuple(k for k in keys() if k in rc)


def defaults() -> dict[str, Any]:
    """Every key's default, as plain values."""
    return Scenario().to_parameters()


def _shape(annotation) -> tuple[str, Any]:
    """A Scenario field's annotation as ("list", item type), ("mapping", (key type, value type)),
    ("optional", inner annotation) or ("scalar", type) — the shapes the schema uses; every reader of
    annotations goes through here."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is tuple:
        return "list", args[0]
    if origin is dict:
        return "mapping", args
    if origin in (Union, types.UnionType):
        return "optional", next(a for a in args if a is not type(None))
    return "scalar", annotation


def describe(annotation) -> str:
    """The expected type in words, for error messages and docs."""
    kind, inner = _shape(annotation)
    if kind == "list":
        return f"a list of {_PLURAL[inner]}"
    if kind == "mapping":
        return f"a mapping of {_PLURAL[inner[0]]} to {_PLURAL[inner[1]]}"
    if kind == "optional":
        return f"{describe(inner)} or null"
    return _SINGULAR[inner]


_SINGULAR = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_PLURAL = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}


def _scalar_ok(value, typ) -> bool:
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, typ)


def _check(name: str, value, annotation, meta: Mapping[str, Any]):
    """Type-check and normalise one value (lists → tuples, ints → floats); ConfigError names the key."""
    bad = ConfigError(f"{name}: expected {describe(annotation)}, got {_short(value)}")
    kind, inner = _shape(annotation)
    if kind == "optional":
        if value is None:
            return None
        annotation = inner
        kind, inner = _shape(annotation)
    if kind == "mapping":
        ktype, vtype = inner
        if not isinstance(value, Mapping) or not all(_scalar_ok(k, ktype) and _scalar_ok(v, vtype)
                                                     for k, v in value.items()):
            raise bad
        items = {k: _as_float(name, v) if vtype is float else v for k, v in value.items()}
        for item in items.items():   # a check sees (key, value); choices and min do not apply to mappings
            _check_limits(name, item, {"check": meta.get("check")})
        return items
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise bad
        item = inner
        if not all(_scalar_ok(v, item) for v in value):
            raise bad
        items = tuple(_as_float(name, v) if item is float else v for v in value)
        for v in items:
            _check_limits(name, v, meta)
        return items
    if not _scalar_ok(value, annotation):
        raise bad
    if annotation is float:
        value = _as_float(name, value)
    _check_limits(name, value, meta)
    if annotation is str and not value.strip() and not (meta or {}).get("empty"):
        raise ConfigError(f"{name}: must not be empty")
    return value


MAX_INT = 2**53   # any integer key beyond this is a typo (and would lose precision as a float)


def _as_float(name: str, value) -> float:
    """A number as a finite float; ConfigError for NaN, infinities and integers too large for a float."""
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise ConfigError(f"{name}: must be a finite number, got {_short(value)}")
    return x


def _check_limits(name: str, value, meta: Mapping[str, Any]) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ConfigError(f"{name}: {_short(value)} is too large (at most 2**53)")
    choices, lo = meta.get("choices"), meta.get("min")
    if choices and value not in choices:
        raise ConfigError(f"{name}: {_short(value)} is not one of {', '.join(map(str, choices))}")
    if lo is not None and value < lo:
        raise ConfigError(f"{name}: must be >= {lo}, got {value}")
    check = meta.get("check")
    if check is not None:
        try:
            check(value)
        except V100labError as exc:
            raise ConfigError(f"{name}: {exc}") from None


def _short(value) -> str:
    return short_repr(value, limit=60)


def _plain(value):
    if isinstance(value, dict):
        return dict(value)
    return list(value) if isinstance(value, tuple) else value


def _reject_unknown(data: Mapping[str, Any], where: str, hint_all: str = "") -> None:
    known = keys()
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: unknown scenario key '{key}'{hint}{hint_all}")


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------

def read_parameters(path: str | os.PathLike) -> dict[str, Any]:
    """The raw mapping in a parameter file (YAML; JSON is YAML too), unvalidated.

    This is exactly what ``papermill -f FILE`` injects, and what ``v100lab batch`` passes to papermill.
    """

    p = Path(path)
    if not (p.exists() or p.is_symlink()):
        raise ConfigError(f"{p}: parameter file not found")
    text = read_text_bounded(p, MAX_PARAMETER_FILE_BYTES, what="parameter file", error=ConfigError)
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid YAML: nested too deeply") from None
    except ValueError as exc:   # PyYAML's int() of a number too long to convert
        raise ConfigError(f"{p}: not valid YAML: {str(exc).splitlines()[0][:200]}") from None
    if data is None:
        # an empty file (or only comments) is more likely a mistake than a wish for every default
        raise ConfigError(f"{p}: the parameter file is empty; write at least `scenario: NAME` "
                          "(or `{}` for every default)")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a parameter file must be a mapping of keys to values, "
                          f"got {type(data).__name__}")
    return data


def load_scenario(source: str | os.PathLike | Mapping[str, Any]) -> Scenario:
    """A validated Scenario from a parameter file path or a mapping.

    Unknown keys, wrong types and bad values raise ConfigError naming the key (and the file).
    """
    if isinstance(source, Mapping):
        data, where = dict(source), "scenario"
    else:
        data, where = read_parameters(source), str(source)
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{where}: keys must be strings, got {short_repr(key)}")
    _reject_unknown(data, where)
    try:
        return Scenario(**data)
    except ConfigError as exc:
        if where == "scenario":
            raise
        raise ConfigError(f"{where}: {exc}") from None


def notebook_parameters(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters in a notebook's globals: the names that are scenario keys — those of its parameters
    cell and whatever papermill injected (a parameter file may set keys a notebook does not show). Every
    other name is the notebook's own (its imports, ``sc``, the frames of later cells), so validating again
    after running later cells sees the same parameters."""
    return {k: namespace[k] for k in keys() if k in namespace}


def from_notebook(namespace: Mapping[str, Any]) -> Scenario:
    """Validate a notebook's parameters: call ``from_notebook(globals())`` right after the parameters
    cell (papermill's injected cell, if any, sits between them). Only scenario keys are read
    (:func:`notebook_parameters`); a wrong type or value is a ConfigError naming the key.

    A typed assignment (``n_ctxx: int = 8192``, the parameters cell's own form) whose name is not a key is
    a ConfigError too: the cell was edited with a misspelt key. Parameter files are checked for unknown
    keys when they are loaded (``v100lab batch``; papermill itself warns about unknown parameters)."""
    shadowed = [k for k in keys() if isinstance(namespace.get(k), types.ModuleType)]
    if shadowed:
        raise ConfigError(f"notebook parameter '{shadowed[0]}' was replaced by a module of that name (an import "
                          f"after the parameters cell); import it under another name")
    typed = namespace.get("__annotations__")
    if isinstance(typed, Mapping):
        _reject_unknown({k: None for k in typed if not str(k).startswith("_")}, "notebook parameters")
    return Scenario(**notebook_parameters(namespace))


# --------------------------------------------------------------------------------------------
# the notebooks' parameters cell
# --------------------------------------------------------------------------------------------

PARAMETERS_HEADER = (
    "# Parameters (tag: parameters). Generated from v100lab.workbook.scenario; do not edit by hand.\n"
    "# papermill and `v100lab batch` replace these from a params/*.yaml file; by hand, edit them here."
)


_COMMENT_COLUMN = 40  # trailing comments line up here (longer assignments push theirs right)


def _literal(value) -> str:
    """A Python literal for a plain parameter value (double-quoted strings, lists)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def parameters_cell_source(names: Iterable[str] | None = None) -> str:
    """The source of a notebook's ``parameters`` cell: typed, commented literals from the schema for the keys
    in ``names`` (in the schema's order; None: every key). An unknown name is a ConfigError."""
    hints = _hints()
    lines = [PARAMETERS_HEADER]
    assigns = []
    wanted = set(keys()) if names is None else set(names)
    _reject_unknown(dict.fromkeys(wanted), "parameters_cell_source()")
    for f in fields(Scenario):
        if f.name not in wanted:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        assigns.append((f.metadata["group"], f"{f.name}: {_annotation_text(hints[f.name])} = "
                        f"{_literal(default)}", f.metadata["help"]))
    width = min(max(len(a) for _, a, _ in assigns), _COMMENT_COLUMN)
    group = None
    for g, assign, help_ in assigns:
        if g != group:
            lines += ["", f"# -- {GROUPS[g]}"]
            group = g
        lines.append(f"{assign.ljust(width)}  # {help_}")
    return "\n".join(lines)


def _annotation_text(annotation) -> str:
    kind, inner = _shape(annotation)
    if kind == "list":
        return f"list[{inner.__name__}]"
    if kind == "mapping":
        return f"dict[{inner[0].__name__}, {inner[1].__name__}]"
    if kind == "optional":
        # a string annotation: papermill's parameter parser (translators.PythonTranslator) does not
        # accept "X | None", and a string needs no `from typing import Optional` in the cell
        return f'"Optional[{_annotation_text(inner)}]"'
    return inner.__name__
