"""The in-process backend: llama.cpp through llama-cpp-python's low-level API, llama-bench's method.

Why the low-level API and not ``llama_cpp.Llama``: ``Llama()`` cannot set ``n_seq_max``, ``kv_unified`` or
flash attention "auto", and it tokenises, samples and copies logits on every call. Here the model and context
are built from ``llama_model_default_params()`` / ``llama_context_default_params()`` with
``RunConfig.apply_to_model_params`` / ``apply_to_context_params``, so every RunConfig field applies, and the
clock runs only around ``llama_decode`` (+ ``llama_synchronize``).

The tests mirror llama.cpp's tools/llama-bench/llama-bench.cpp (``test_prompt``, ``test_gen`` and the
repetition loop in ``llama_bench()``):

* ppN: N random tokens (BOS first when the vocabulary adds one) decoded in chunks of ``n_batch``;
* tgN: N single-token decodes starting from BOS, each next token drawn at random (seeded), as llama-bench's
  ``test_gen`` does: with routed experts the cost of a decode can depend on the tokens (greedy decoding of a
  random-weight model tends to repeat one token, so its router would pick the same experts every step);
* depth D: before each repetition the context is cleared and D tokens are decoded untimed; the state after
  the first fill is saved with ``llama_state_seq_get_data`` and restored for later repetitions (as
  llama-bench does since PR 16944). With ``depth_states`` (a folder) the saved state also goes to a file there,
  and a later session of the same model file and context restores it instead of filling again: calibration
  loads each depth point several times (:data:`v100lab.measure.calibration.DEPTH_LOADS`), and a fill of 4096 tokens at
  one thread costs a minute that the timed decodes do not need;
* warmup: one ppN (when the test has a prompt) and one tg1 (when it generates), untimed;
* ``llama_memory_clear(llama_get_memory(ctx), True)`` before every repetition.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import os
import random
import time
from functools import lru_cache
from pathlib import Path
from typing import Any


from v100lab.measure.backends.types import BenchTest, Measurement, MeasureFailed
from v100lab.facts.config import RunConfig
from v100lab.facts.loadlog import capture_llama_log

log = logging.getLogger(__name__)

# include/llama.h: n_vocab tokens; seeded so two runs decode the same "random" prompt
_SEED = 1234


@lru_cache(maxsize=1)
def _backend_init() -> None:
    import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

    llama_cpp.llama_backend_init()


@lru_cache(maxsize=1)
def _ggml_lib():
    import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

    libdir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (libdir / name).exists():
            return ctypes.CDLL(str(libdir / name))
    return None


def build_info() -> dict[str, Any]:
    """llama.cpp build of llama-cpp-python: ``build_commit`` from ggml_commit(), ggml version, system info."""
    import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

    out: dict[str, Any] = {"build_commit": None, "build_number": None, "ggml_version": None,
                           "llama_cpp_python": llama_cpp.__version__,
                           "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}
    lib = _ggml_lib()
    if lib is not None:
        for fn, key in (("ggml_commit", "build_commit"), ("ggml_version", "ggml_version")):
            try:
                f = getattr(lib, fn)
                f.restype = ctypes.c_char_p
                out[key] = f().decode()
            except (AttributeError, OSError):
                pass
    return out


@lru_cache(maxsize=1)
def ggml_devices() -> tuple[dict[str, Any], ...]:
    """ggml's backend devices (name, description, type), as llama-bench's get_cpu_info/get_gpu_info see them."""
    _backend_init()
    import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

    libdir = Path(llama_cpp.__file__).parent / "lib"
    try:
        lib = ctypes.CDLL(str(libdir / "libggml.so"))
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError) as exc:
        log.debug("ggml device enumeration unavailable: %s", exc)
        return ()
    # ggml/include/ggml-backend.h: enum ggml_backend_dev_type
    types = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}
    devs = []
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        devs.append({"name": lib.ggml_backend_dev_name(d).decode(errors="replace"),
                     "description": lib.ggml_backend_dev_description(d).decode(errors="replace"),
                     "type": types.get(lib.ggml_backend_dev_type(d), "?")})
    return tuple(devs)


def cpu_gpu_info() -> tuple[str, str]:
    """llama-bench's cpu_info / gpu_info: device descriptions joined with ", "."""
    devs = ggml_devices()
    cpu = ", ".join(d["description"] for d in devs if d["type"] == "CPU")
    gpu = ", ".join(d["description"] for d in devs if d["type"] in ("GPU", "IGPU"))
    return cpu, gpu


def load_facts(cap) -> dict[str, Any]:
    """The parsed load facts (:mod:`v100lab.facts.loadlog`) of a capture, as a JSON-ready dict."""
    return cap.facts().as_dict()


def failure_reason(cap, default: str) -> str:
    """llama.cpp's own words for a failure: the last error-level line it logged (else ``default``)."""
    errors = [e.strip() for e in cap.facts().errors if e.strip()]
    if errors:
        return errors[-1]
    # ggml/include/ggml.h (current): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 — older builds had
    # INFO 1, WARN 2, ERROR 3, DEBUG 4. Take the last line logged at the highest level seen >= WARN.
    recs = [(lvl, t.strip()) for lvl, t in getattr(cap, "records", ()) if t.strip() and lvl in (3, 4)]
    if recs:
        top = max(lvl for lvl, _ in recs)
        return [t for lvl, t in recs if lvl == top][-1]
    return default


class InProcessBackend:
    """llama-cpp-python in this process (the default backend)."""

    name = "inprocess"

    def open(self, model: Path, cfg: RunConfig, depth_states: Path | None = None) -> "InProcessSession":
        return InProcessSession(Path(model), cfg, depth_states)


def depth_state_name(model_path: Path, cfg: RunConfig, depth: int) -> str:
    """The file name a filled context of ``depth`` tokens is kept under in a ``depth_states`` folder: the model
    file (name, size, modification time) and every setting that shapes the KV cache (the context, cache types,
    flash attention — V is stored transposed without it —, sequences, SWA); not the thread counts, which change
    how fast the cells are written, not what they hold."""
    st = model_path.stat()
    kv = dataclasses.replace(cfg, n_threads=0, use_mmap=True, use_mlock=False)
    digest = hashlib.sha256(repr((model_path.name, st.st_size, st.st_mtime_ns, kv)).encode()).hexdigest()[:16]
    return f"{model_path.stem}-d{depth}-{digest}.state"


class InProcessSession:
    """One loaded model + context; ``run`` executes llama-bench tests on it."""

    def __init__(self, model_path: Path, cfg: RunConfig, depth_states: Path | None = None):
        import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

        _backend_init()
        self.cfg = cfg
        self.model_path = model_path
        self.monitor_pid = None
        self._model = None
        self._ctx = None
        self._keep: list[Any] = []   # ctypes buffers that must outlive the C structs pointing at them
        self._depth_state: tuple[int, Any] | None = None
        self.depth_states = Path(depth_states) if depth_states else None
        self.depth_restores = 0      # fills taken from a depth_states file instead of decoded (for the tests)
        self._rng = random.Random(_SEED)
        self._cap_cm = None
        self._cap = None
        self.load: dict[str, Any] | None = None
        if not model_path.is_file():
            raise MeasureFailed(f"model file not found: {model_path}")
        # The capture stays open for the session's life: decode-time and teardown messages land in the
        # same raw log, and llama.cpp's chatter stays off stderr.
        self._cap_cm = capture_llama_log()
        self._cap = self._cap_cm.__enter__()
        t0 = time.perf_counter()
        try:
            mparams = llama_cpp.llama_model_default_params()
            cfg.apply_to_model_params(mparams)
            if cfg.tensor_split:
                n = llama_cpp.llama_max_devices()
                arr = (ctypes.c_float * n)(*(list(cfg.tensor_split) + [0.0] * n)[:n])
                self._keep.append(arr)
                mparams.tensor_split = arr
            self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
            if not self._model:
                raise MeasureFailed(failure_reason(self._cap, f"llama.cpp could not load {model_path.name}"),
                                    self._cap.text, load_facts(self._cap))
            cparams = llama_cpp.llama_context_default_params()
            cfg.apply_to_context_params(cparams)
            self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
            if not self._ctx:
                raise MeasureFailed(failure_reason(self._cap, "llama.cpp could not create a context"),
                                    self._cap.text, load_facts(self._cap))
        except BaseException:
            self.close()
            raise
        load_s = time.perf_counter() - t0
        self.load = load_facts(self._cap)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.bos = llama_cpp.llama_vocab_bos(self._vocab)
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self._ctx)
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, len(buf))
        cpu, gpu = cpu_gpu_info()
        b = build_info()
        self.info = {"model_type": buf.value.decode(errors="replace"),
                     "model_size": int(llama_cpp.llama_model_size(self._model)),
                     "model_n_params": int(llama_cpp.llama_model_n_params(self._model)),
                     "build_commit": b["build_commit"], "build_number": b["build_number"],
                     "cpu_info": cpu, "gpu_info": gpu, "n_ctx": int(llama_cpp.llama_n_ctx(self._ctx)),
                     "n_ctx_seq": int(self.n_ctx_seq), "load_s": load_s}

    # ---- llama-bench's test_prompt / test_gen ------------------------------------------------
    def _prompt_tokens(self, n: int) -> list[Any]:
        """Chunks of at most n_batch tokens as ctypes arrays, built before the clock starts."""
        import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

        chunks = []
        done = 0
        while done < n:
            k = min(n - done, self.n_batch)
            toks = [self._rng.randrange(self.n_vocab) for _ in range(k)]
            if done == 0 and self.add_bos:
                toks[0] = self.bos
            chunks.append(((llama_cpp.llama_token * k)(*toks), k))
            done += k
        return chunks

    def _decode(self, arr, n: int) -> int:
        """One timed llama_decode (+ synchronize); returns nanoseconds."""
        import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

        batch = llama_cpp.llama_batch_get_one(arr, n)
        t0 = time.perf_counter_ns()
        rc = llama_cpp.llama_decode(self._ctx, batch)
        llama_cpp.llama_synchronize(self._ctx)
        dt = time.perf_counter_ns() - t0
        if rc != 0:
            # include/llama.h: 1 = no KV slot for the batch, 2 = aborted, -1 = invalid input, < -1 = error
            meaning = {1: "no KV cache slot for the batch (context full)", 2: "aborted", -1: "invalid batch"}
            raise MeasureFailed(f"llama_decode returned {rc}: {meaning.get(rc, 'error')}", self.raw_log, self.load)
        return dt

    def _run_prompt(self, n: int) -> int:
        return sum(self._decode(arr, k) for arr, k in self._prompt_tokens(n))

    def _run_gen(self, n: int) -> int:
        import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

        tok = (llama_cpp.llama_token * 1)(self.bos if self.add_bos else self._rng.randrange(self.n_vocab))
        total = 0
        for _ in range(n):
            total += self._decode(tok, 1)
            tok[0] = self._rng.randrange(self.n_vocab)      # llama-bench's way; untimed
        return total

    def _clear(self) -> None:
        import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)

    def _fill_depth(self, depth: int) -> None:
        """Bring the context to ``depth`` tokens (untimed): restore a saved state (kept in memory by this load, else a
        file in ``depth_states``), else decode and save it (there too)."""
        import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

        if self._depth_state and self._depth_state[0] == depth:
            buf = self._depth_state[1]
            if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(buf), 0) != 0:
                return
            self._clear()
        file = self.depth_states / depth_state_name(self.model_path, self.cfg, depth) if self.depth_states else None
        if file is not None and file.is_file():
            data = file.read_bytes()
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(buf), 0) != 0:
                self._depth_state = (depth, buf)
                self.depth_restores += 1
                return
            log.warning("depth state %s does not fit this context; filling again", file.name)
            self._clear()
        self._run_prompt(depth)
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, 0) == size:
            self._depth_state = (depth, buf)
            if file is not None:
                tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
                try:
                    tmp.write_bytes(bytes(buf))
                    os.replace(tmp, file)
                except OSError as exc:       # a full disk costs the next load a fill, nothing more
                    log.warning("depth state not kept (%s); the next load fills again", exc)
                    tmp.unlink(missing_ok=True)

    def run(self, test: BenchTest, repetitions: int, warmup: bool = True) -> Measurement:
        if self._ctx is None:
            raise MeasureFailed("session is closed")
        if test.n_ctx_needed > self.n_ctx_seq:
            raise MeasureFailed(f"context too small: {test.name} needs {test.n_ctx_needed} tokens, "
                                f"the context holds {self.n_ctx_seq} per sequence (raise -c/--ctx-size)")
        if warmup:
            self._clear()
            if test.n_prompt:
                self._run_prompt(test.n_prompt)
            if test.n_gen:
                self._run_gen(1)
        samples = []
        for _ in range(repetitions):
            self._clear()
            if test.n_depth:
                self._fill_depth(test.n_depth)
            ns = 0
            if test.n_prompt:
                ns += self._run_prompt(test.n_prompt)
            if test.n_gen:
                ns += self._run_gen(test.n_gen)
            samples.append(ns)
        return Measurement(samples_ns=samples, n_tokens=test.n_tokens, timing="decode")

    @property
    def raw_log(self) -> str:
        """Everything llama.cpp logged for this loaded model so far (load, decode errors, teardown)."""
        return self._cap.text if self._cap is not None else ""

    def close(self) -> None:
        import llama_cpp  # heavy: llama.cpp is loaded only in the process that runs the model

        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None
        self._depth_state = None
        if self._cap_cm is not None:
            self._cap_cm.__exit__(None, None, None)
            self._cap_cm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
