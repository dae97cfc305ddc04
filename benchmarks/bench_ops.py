"""Where a decoded token's (or a prompt token's) time goes, per ggml op, on this CPU, beside the speed model's terms.

    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_ops.py                # the default set
    .venv/bin/python benchmarks/bench_ops.py --model default --threads 1,2 --depth 0,1024 --json out.json
    .venv/bin/python benchmarks/bench_ops.py --model synth-deepseek2-500m:Q4_K_M --depth 0,1024 --predicted
    .venv/bin/python benchmarks/bench_ops.py --model default --model synth-qwen35-500m:Q4_K_M --prompt 512

With ``--prompt 512`` it times a pp512 as llama-bench runs it (one ubatch of 512 tokens, logits for the last
one) and prints, per term of the prompt model (``speed.prompt_terms``: weight products per type, output product,
attention, the recurrent kernels, every other node), the measured and predicted milliseconds per prompt token and
each term's share of the miss: the table says which term a prompt misprediction comes from.

How: llama.cpp's scheduler calls an *eval callback* (``llama_context_params.cb_eval``, the mechanism of
llama.cpp's ``llama-eval-callback`` tool; ggml-backend.cpp ``ggml_backend_sched_compute_splits``) once per
graph node; a callback that asks for every node makes the scheduler compute the graph one node at a time and
synchronise after each, so the time between the "ask" and the "done" call of a node is that node's compute
(plus one thread-pool launch). The same token is also timed without the callback (one launch per graph) in a
second context: the difference between the plain token and the sum of the node times is what per-node
dispatch costs, and the sum of the small ops (norms, rope, adds, copies) is the per-layer cost that a
weights-only model lacks.

For each model, thread count and depth it prints: the plain token time; matrix multiplications of weights
per ggml type (ms, weights/ns, GB/s of the weights read); the output matrix apart (tied or not); attention
over the KV cache; every other op (count, ms, µs per node); and the bytes a token reads against the CPU's
last-level cache. With ``--predicted``, each weight role's products (``attn_k_b``, ``ffn_up_exps``), attention
and the other nodes beside what the speed model charges for each (:func:`v100lab.predict.speed.decode_terms`):
which term a miss comes from. No test asserts any of it: it explains where the speed model's terms come from
(benchmarks/RESULTS.md, "Why the host model misses").
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import llama_cpp

from v100lab.base import buildflags
from v100lab.facts.config import RunConfig
from v100lab.gguf.header import read_spec
from v100lab.measure import calibration
from v100lab.models import zoo
from v100lab.predict import speed
from v100lab.predict.work import weight_role
from v100lab.measure.backends.inprocess import build_info

MAX_DIMS, MAX_SRC, MAX_OP_PARAMS, MAX_NAME = 4, 10, 64, 64


class GgmlTensor(ctypes.Structure):
    """ggml/include/ggml.h ``struct ggml_tensor`` (this build: GGML_MAX_DIMS 4, GGML_MAX_SRC 10)."""


GgmlTensor._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * MAX_DIMS), ("nb", ctypes.c_size_t * MAX_DIMS),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * (MAX_OP_PARAMS // 4)), ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GgmlTensor) * MAX_SRC), ("view_src", ctypes.POINTER(GgmlTensor)),
    ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * MAX_NAME),
    ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8),
]

_ggml = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
_ggml.ggml_op_desc.restype = ctypes.c_char_p
_ggml.ggml_op_desc.argtypes = [ctypes.POINTER(GgmlTensor)]
_ggml.ggml_type_name.restype = ctypes.c_char_p
_ggml.ggml_type_name.argtypes = [ctypes.c_int]
_ggml.ggml_nbytes.restype = ctypes.c_size_t
_ggml.ggml_nbytes.argtypes = [ctypes.POINTER(GgmlTensor)]
_ggml.ggml_nelements.restype = ctypes.c_int64
_ggml.ggml_nelements.argtypes = [ctypes.POINTER(GgmlTensor)]

EMPTY_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}   # ggml-cpu computes nothing for these


def _base(t):
    """The tensor a view looks at (a weight's name lives there)."""
    while t.contents.view_src:
        t = t.contents.view_src
    return t


def classify(node) -> tuple[str, dict]:
    """(category, facts) of one graph node."""
    op = _ggml.ggml_op_desc(node).decode()
    c = node.contents
    if op == "MUL_MAT" or op == "MUL_MAT_ID":
        w = _base(c.src[0])
        wname = w.contents.name.decode(errors="replace")
        tname = _ggml.ggml_type_name(c.src[0].contents.type).decode()
        if wname.endswith(".weight"):
            elems = _ggml.ggml_nelements(c.src[0])
            nbytes = _ggml.ggml_nbytes(c.src[0])
            kind = "output" if wname.startswith(("output.", "token_embd.")) else "weights"
            if op == "MUL_MAT_ID":   # routed experts: src[2] holds the ids, n_expert_used per token
                n_expert, used = int(c.src[0].contents.ne[2]), int(c.src[2].contents.ne[0])
                elems, nbytes, kind = elems * used // n_expert, nbytes * used // n_expert, "experts"
            return f"{kind}:{tname}", {"elements": elems, "bytes": nbytes, "row": int(c.src[0].contents.ne[0]),
                                       "weight": wname}
        return "attention", {"op": op}
    if op in ("FLASH_ATTN_EXT", "SOFT_MAX"):
        return "attention", {"op": op}
    if op in EMPTY_OPS:
        return "empty", {"op": op}
    return f"op:{op}", {"op": op}


class Profiler:
    """The eval callback: times every node between its "ask" and its "done" call."""

    def __init__(self):
        self.on = False
        self.t_ask = 0
        self.nodes: list[tuple[str, dict, int]] = []
        self.cb = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, tensor, ask, _user):
        if not self.on:
            return False
        node = ctypes.cast(tensor, ctypes.POINTER(GgmlTensor))
        if ask:
            self.t_ask = time.perf_counter_ns()
            return True
        dt = time.perf_counter_ns() - self.t_ask
        cat, facts = classify(node)
        self.nodes.append((cat, facts, dt))
        return True


@llama_cpp.llama_log_callback
def _QUIET(level, text, user):   # llama.cpp's load log is not what this script prints
    return None


def _context(model, n_ctx: int, threads: int, cb=None):
    p = llama_cpp.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = p.n_ubatch = 512
    p.n_threads = p.n_threads_batch = threads
    p.no_perf = True
    if cb is not None:
        p.cb_eval = cb
    ctx = llama_cpp.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    return ctx


def _decode(ctx, tokens: list[int]) -> None:
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens))) != 0:
        raise RuntimeError("llama_decode failed")


def _fill(ctx, depth: int, vocab_n: int) -> None:
    tok = [(7 * i + 13) % vocab_n for i in range(depth)]
    for i in range(0, depth, 512):
        _decode(ctx, tok[i:i + 512])


def _load(path: Path):
    """The model on the CPU, and its vocabulary's size."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise RuntimeError(f"cannot load {path}")
    return model, llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))


def profile(path: Path, threads: int, depth: int, n_tokens: int) -> dict:
    model, vocab_n = _load(path)
    n_ctx = depth + 2 * n_tokens + 64
    prof = Profiler()
    plain, timed = _context(model, n_ctx, threads), _context(model, n_ctx, threads, prof.cb)
    try:
        out = {}
        for name, ctx in (("plain", plain), ("timed", timed)):
            _fill(ctx, depth, vocab_n)
            _decode(ctx, [1])                       # warm-up token
            times = []
            for i in range(n_tokens):
                prof.nodes = []
                prof.on = name == "timed"
                t0 = time.perf_counter_ns()
                _decode(ctx, [(31 * i + 5) % vocab_n])
                times.append(time.perf_counter_ns() - t0)
                prof.on = False
                if name == "timed":
                    out.setdefault("tokens", []).append(list(prof.nodes))
            out[f"{name}_ms"] = statistics.median(times) / 1e6
            out[f"{name}_cv"] = statistics.pstdev(times) / statistics.fmean(times)
        return out
    finally:
        llama_cpp.llama_free(plain)
        llama_cpp.llama_free(timed)
        llama_cpp.llama_model_free(model)


def profile_prompt(path: Path, threads: int, depth: int, n_prompt: int, repetitions: int) -> dict:
    """One prompt of ``n_prompt`` tokens in one ubatch after ``depth`` tokens of context, as llama-bench's pp test
    runs it (logits for the last token only), timed plain and node by node; the cache is cleared and refilled to
    ``depth`` before every repetition (a recurrent model's state cannot be cut back to a position)."""
    model, vocab_n = _load(path)
    n_ctx = depth + n_prompt + 64
    prof = Profiler()
    plain, timed = _context(model, n_ctx, threads), _context(model, n_ctx, threads, prof.cb)
    prompt = [(17 * i + 3) % vocab_n for i in range(n_prompt)]
    try:
        out = {}
        for name, ctx in (("plain", plain), ("timed", timed)):
            times = []
            for rep in range(repetitions + 1):          # the first is a warm-up
                llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
                _fill(ctx, depth, vocab_n)
                prof.nodes = []
                prof.on = name == "timed"
                t0 = time.perf_counter_ns()
                _decode(ctx, prompt)
                dt = time.perf_counter_ns() - t0
                prof.on = False
                if rep == 0:
                    continue
                times.append(dt / n_prompt)
                if name == "timed":
                    out.setdefault("tokens", []).append([(c, f, ns / n_prompt) for c, f, ns in prof.nodes])
            out[f"{name}_ms"] = statistics.median(times) / 1e6
            out[f"{name}_cv"] = statistics.pstdev(times) / statistics.fmean(times)
        return out
    finally:
        llama_cpp.llama_free(plain)
        llama_cpp.llama_free(timed)
        llama_cpp.llama_model_free(model)


def summarise(res: dict) -> dict:
    """Per category: median over tokens of the summed node time, with weights and bytes per token."""
    per_tok = []
    for nodes in res["tokens"]:
        agg = defaultdict(lambda: {"ns": 0, "n": 0, "elements": 0, "bytes": 0})
        for cat, facts, dt in nodes:
            a = agg[cat]
            a["ns"] += dt
            a["n"] += 1
            a["elements"] += facts.get("elements", 0)
            a["bytes"] += facts.get("bytes", 0)
        per_tok.append(agg)
    cats = sorted({c for a in per_tok for c in a})
    rows = {}
    for c in cats:
        ns = statistics.median(a[c]["ns"] for a in per_tok if c in a)
        first = next(a[c] for a in per_tok if c in a)
        rows[c] = {"ms": ns / 1e6, "nodes": first["n"], "elements": first["elements"], "bytes": first["bytes"],
                   "us_per_node": ns / 1e3 / max(1, first["n"])}
        if first["bytes"]:
            rows[c]["gbs"] = first["bytes"] / ns
            rows[c]["weights_per_ns"] = first["elements"] / ns
    total_nodes_ms = sum(r["ms"] for r in rows.values())
    return {"plain_ms": res["plain_ms"], "plain_cv": res["plain_cv"], "timed_ms": res["timed_ms"],
            "nodes_ms": total_nodes_ms, "categories": rows,
            "bytes_read": sum(r["bytes"] for c, r in rows.items() if c.startswith(("weights", "output", "experts")))}


def role_rows(res: dict) -> dict:
    """Per weight role (the weight's name without its layer: ``ffn_up_exps``, summed over layers): the median over
    tokens of its products' time (ms), beside attention and every other node, for :func:`print_roles`."""
    per_tok = []
    for nodes in res["tokens"]:
        agg: dict[str, int] = defaultdict(int)
        for cat, facts, dt in nodes:
            key = ("matmul:" + weight_role(facts["weight"]) if "weight" in facts else
                   "attention" if cat == "attention" else "other ops")
            agg[key] += dt
        per_tok.append(agg)
    return {k: statistics.median(a.get(k, 0) for a in per_tok) / 1e6 for k in sorted({k for a in per_tok for k in a})}


def print_roles(s: dict) -> None:
    """Each weight role's measured products, attention and the other nodes, beside the speed model's terms."""
    meas, pred = s["roles_ms"], s.get("predicted_ms") or {}
    print(f"  {'term':<22} {'measured':>9} {'predicted':>9}  (ms a token; other ops node by node, callback included)")
    for name in sorted(set(meas) | set(pred), key=lambda k: (not k.startswith("matmul"), k)):
        ms, p = meas.get(name, 0.0), pred.get(name)
        print(f"  {name:<22} {ms:9.3f} " + (f"{p:9.3f}" if p is not None else "") +
              (f"  {p / ms - 1:+5.0%}" if p is not None and ms else ""))
    if pred:
        total = sum(pred.values())
        print(f"  {'token (plain)':<22} {s['plain_ms']:9.3f} {total:9.3f}  {total / s['plain_ms'] - 1:+5.0%}")


#: measured node categories → the prompt model's term that charges them (speed.prompt_terms)
RECURRENT_OPS = ("op:GATED_DELTA_NET", "op:SSM_CONV")


def prompt_rows(s: dict, predicted: dict) -> list[tuple[str, float, float | None]]:
    """(term, measured ms per prompt token, predicted ms per prompt token or None) for each of the prompt model's
    terms: the weight products per type, the output product, attention, the recurrent kernels, every other node
    (which no term charges but the per-ubatch overhead), and the plain prompt against the model's sum."""
    cats = s["categories"]
    rows = []
    for c, r in sorted(cats.items()):
        if c.startswith(("weights:", "output:", "experts:")):
            kind, _, tname = c.partition(":")
            key = ("output:" if kind == "output" else "matmul:") + tname.upper()
            rows.append((key, r["ms"], predicted.get(key)))
    rows.append(("attention", cats.get("attention", {"ms": 0.0})["ms"], predicted.get("attention")))
    rec = sum(cats[c]["ms"] for c in RECURRENT_OPS if c in cats)
    if rec or "recurrent" in predicted:
        rows.append(("recurrent", rec, predicted.get("recurrent", 0.0)))
    other = sum(r["ms"] for c, r in cats.items() if (c.startswith("op:") and c not in RECURRENT_OPS) or c == "empty")
    rows.append(("other ops", other, predicted.get("overhead", 0.0)))
    rows.append(("prompt token", s["plain_ms"], sum(predicted.values())))
    return rows


def print_prompt(s: dict) -> None:
    """The prompt's per-term table: measured (node by node) beside predicted, and each term's share of the miss."""
    rows = prompt_rows(s, s["predicted_ms"])
    nodes = s["nodes_ms"]
    total_pred = rows[-1][2]
    print(f"  {'term':<14} {'measured':>9} {'predicted':>9} {'error':>6} {'miss':>6}   (ms per prompt token; miss: "
          "the term's predicted − measured as a share of the measured node sum)")
    for name, ms, p in rows:
        err = f"{p / ms - 1:+6.0%}" if p is not None and ms else ""
        miss = f"{(p - ms) / nodes:+6.1%}" if p is not None and name != "prompt token" and nodes else ""
        print(f"  {name:<14} {ms:9.4f} " + (f"{p:9.4f} " if p is not None else f"{'—':>9} ") + f"{err:>6} {miss:>6}")
    print(f"  plain {s['plain_ms']:.4f} ms (pp {1e3 / s['plain_ms']:.1f} tok/s, cv {s['plain_cv']:.0%}), node by node "
          f"{s['timed_ms']:.4f} ms; predicted pp {1e3 / total_pred:.1f} tok/s ({total_pred / s['plain_ms'] - 1:+.0%} "
          "time)")


def llc_bytes() -> int | None:
    """The last-level cache this CPU reports (sysfs), in bytes."""
    best = None
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (idx / "size").read_text().strip()
            level = int((idx / "level").read_text())
        except (OSError, ValueError):
            continue
        mult = {"K": 1024, "M": 2**20, "G": 2**30}.get(size[-1], 1)
        b = int(size.rstrip("KMG")) * mult
        if best is None or level > best[0]:
            best = (level, b)
    return best[1] if best else None


# F16 and Q4_0 at growing sizes (the bytes a token reads against the last-level cache), the other pure types of
# calibration, and the two real models the validation judges on
DEFAULT_SET = ["calib-deep:F16", "calib-deep96:F16", "calib-wide:F16", "synth-280m:F16", "synth-1b:F16",
               "calib-deep:Q4_0", "calib-wide:Q4_0", "synth-280m:Q4_0", "synth-1b:Q4_0",
               "calib-wide:Q4_1", "calib-wide:Q8_0", "default", "gemma3-270m"]


def resolve_model(name: str) -> Path:
    if name.startswith("calib-"):
        label, _, tname = name.partition(":")
        paths = calibration.calibration_model_paths()
        if (label, tname) not in paths:
            raise SystemExit(f"bench_ops: no calibration model {name}")
        return paths[(label, tname)]
    return zoo.model_path(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="zoo alias, calib-deep:F16-style name or path (repeatable)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--depth", default="0")
    ap.add_argument("--tokens", type=int, default=12, help="tokens timed per configuration (median)")
    ap.add_argument("--by-weight", action="store_true", help="also each weight role's products (attn_k_b, ffn_up_exps)")
    ap.add_argument("--predicted", action="store_true",
                    help="each weight role, attention and the other nodes beside what the speed model charges for "
                         "them (speed.decode_terms, from the stored calibration)")
    ap.add_argument("--prompt", type=int, default=0, metavar="N",
                    help="time a prompt of N tokens in one ubatch (llama-bench's ppN; 512) instead of decoded tokens, "
                         "per op per prompt token beside what the speed model charges (speed.prompt_terms)")
    ap.add_argument("--repetitions", type=int, default=3, help="prompts timed per configuration (--prompt)")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args(argv)
    models = args.model or DEFAULT_SET
    threads = [int(x) for x in args.threads.split(",")]
    depths = [int(x) for x in args.depth.split(",")]
    llama_cpp.llama_log_set(_QUIET, None)
    llama_cpp.llama_backend_init()
    info = build_info()
    llc = llc_bytes()
    print(f"# CPU {buildflags.host_cpu().model}, {os.cpu_count()} cores, LLC {llc / 2**20 if llc else '?'} MiB; "
          f"llama.cpp {info.get('build_commit')} (llama-cpp-python {llama_cpp.__version__}); "
          f"load {os.getloadavg()[0]:.2f}")
    out = []
    for name in models:
        path = Path(name) if Path(name).exists() else resolve_model(name)
        for th in threads:
            for d in depths:
                if args.prompt:
                    s = summarise(profile_prompt(path, th, d, args.prompt, args.repetitions))
                    cfg = RunConfig(n_threads=th, n_ctx=d + args.prompt + 64, n_batch=args.prompt,
                                    n_ubatch=args.prompt)
                    s["predicted_ms"] = {k: 1e3 * v for k, v in speed.prompt_terms(
                        read_spec(path), "host", cfg, d, args.prompt).items()}
                    s.update(model=name, threads=th, depth=d, n_prompt=args.prompt, load=os.getloadavg()[0])
                    out.append(s)
                    print(f"\n{name} t{th} d{d} pp{args.prompt} (load {s['load']:.1f}):")
                    print_prompt(s)
                    sys.stdout.flush()
                    continue
                res = profile(path, th, d, args.tokens)
                s = summarise(res)
                s.update(model=name, threads=th, depth=d)
                if args.by_weight or args.predicted:
                    s["roles_ms"] = role_rows(res)
                if args.predicted:
                    s["predicted_ms"] = {k: 1e3 * v for k, v in speed.decode_terms(
                        read_spec(path), "host", RunConfig(n_threads=th), d).items()}
                out.append(s)
                cats = s["categories"]
                mm = {c: r for c, r in cats.items() if c.startswith(("weights", "output", "experts"))}
                other = {c: r for c, r in cats.items() if c.startswith("op:")}
                other_ms = sum(r["ms"] for r in other.values())
                other_n = sum(r["nodes"] for r in other.values())
                att = cats.get("attention", {"ms": 0.0, "nodes": 0})
                empty = cats.get("empty", {"us_per_node": 0.0, "nodes": 0})
                print(f"\n{name} t{th} d{d}: token {s['plain_ms']:.2f} ms plain (cv {s['plain_cv']:.0%}), "
                      f"{s['timed_ms']:.2f} ms node by node, nodes sum {s['nodes_ms']:.2f} ms; "
                      f"reads {s['bytes_read'] / 2**20:.1f} MiB of weights"
                      + (f" ({s['bytes_read'] / llc:.2f} × LLC)" if llc else ""))
                for c, r in sorted(mm.items()):
                    print(f"  {c:<16} {r['ms']:7.3f} ms  {r['nodes']:3d} nodes  {r['bytes'] / 2**20:7.1f} MiB  "
                          f"{r['gbs']:6.2f} GB/s  {r['weights_per_ns']:6.3f} weights/ns")
                print(f"  {'attention':<16} {att['ms']:7.3f} ms  {att['nodes']:3d} nodes")
                print(f"  {'other ops':<16} {other_ms:7.3f} ms  {other_n:3d} nodes  "
                      f"{1e3 * other_ms / max(1, other_n):.1f} µs/node: "
                      + ", ".join(f"{c[3:]} {r['nodes']}×{r['us_per_node']:.1f}µs"
                                  for c, r in sorted(other.items(), key=lambda kv: -kv[1]['ms'])[:6]))
                print(f"  {'no-op nodes':<16} {empty['nodes']:3d} nodes  {empty['us_per_node']:.1f} µs/node "
                      "(the callback's own cost per node: subtract it from the µs/node above)")
                if "roles_ms" in s:
                    print_roles(s)
                sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
