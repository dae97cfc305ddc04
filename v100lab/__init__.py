"""v100lab: why llama.cpp is slow on your GPU, and what makes it fast — with numbers.

The package is layered, bottom to top; a module imports only from its own layer or a lower one, and no two
modules import each other. The order is a contract (``[tool.importlinter]`` in pyproject.toml, checked by
tests/test_layers.py, or ``lint-imports``); an import inside a function is kept only for an optional or heavy
third-party dependency (llama_cpp, httpx, pandas, matplotlib, ...).

0. base — ``errors``, ``safeio`` (bounded reads, atomic writes, escaping), ``buildflags`` (llama.cpp's safe
   CPU build flags for this host)
1. facts: pure data, no llama.cpp run, no file built — ``spec`` (ModelSpec), ``config`` (RunConfig),
   ``results`` (the tidy table: schema and ``compare()``), ``quantmix`` (llama-quantize's per-tensor rules),
   ``loadlog`` (llama.cpp log capture and parsing), ``devices`` (the catalog and the stored host profile),
   ``store`` (JSONL results that survive crashes)
2. llama.cpp arithmetic and the GGUF reader — ``llama_context`` (cells per stream, padding, SWA and
   recurrent sizing, n_kv at a depth, row sizes, flash-attention resolution, KV bytes), ``header`` (a bounded
   GGUF header reader: a path, URL or file object → ModelSpec; never an alias), ``skeleton`` (ModelSpec
   from an architecture spec)
3. models on disk — ``worker`` (crash isolation: every llama.cpp run happens in a worker child process),
   ``modelcache`` (the cache directory, atomic verified builds, the default model's tokenizer), ``synth``
   (synthetic models of other architectures), ``zoo`` (aliases → files: default, gemma3-270m, synthetic,
   quant ladders), ``resolve`` (any model argument → (path or None, ModelSpec); building is explicit)
4. predictions — ``memory`` (the VRAM triangle, feasibility, the ``--fit`` fallback) < ``work`` (bytes and
   operations of one token per device, before any rate) < ``rates`` (device rates: GPU class fits, host rates
   from the stored profile) < ``speed`` (placement, the roofline, the two ceilings) < ``serving`` (batched
   decode under load)
5. measurement — ``backends`` (``backends.types`` < in-process in a worker, llama-server) < ``monitor``
   (telemetry while measuring) < ``harness`` (llama-bench-grade measurements of llama.cpp) < ``llamabench``
   (llama-bench's output in and out) < ``quality`` (perplexity, KL divergence), ``selftest`` (does this llama.cpp build run here?), ``loadgen``
   (serve-bench: load on an OpenAI-compatible server), ``memcheck`` (predicted memory against llama.cpp's)
   < ``calibration`` (measure this host, fit, store the profile)
6. the seed — ``seed`` (the blog's claims, the staircase, the verdict)
7. the workbook — ``render`` (escaped display) < ``scenario`` (the params schema) < ``plots`` <
   ``advisor`` (tune), ``doctor`` (log diagnosis) < ``workload_advice`` (tune for a workload: slots, context
   per slot, cache types under an SLO) < ``levers`` (one sweep per lever → tidy rows) <
   ``batch_runner`` (papermill per scenario × notebook, HTML reports, the index) < ``fleet`` (the same batch
   fanned out on a Ray cluster)
8. the ``v100lab`` command — ``commands`` (one module per subcommand) < ``cli`` (the dispatcher) < ``__main__``
"""

__version__ = "0.1.0"
