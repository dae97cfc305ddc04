"""v100lab: why llama.cpp is slow on your GPU, and what makes it fast — with numbers.

The package is layered so that nothing imports upward:

1. data and config — ``errors``, ``spec`` (ModelSpec), ``config`` (RunConfig), ``results`` (the tidy
   table), ``devices`` (catalog + measured host), ``loadlog`` (llama.cpp log capture and parsing),
   ``quantmix`` (llama-quantize's per-tensor rules), ``store`` (JSONL results that survive crashes),
   ``buildflags`` (llama.cpp's safe CPU build flags for this host), ``worker`` (crash isolation: every
   llama.cpp run happens in a worker child process)
2. model facts — ``header`` (bounded GGUF header reader → ModelSpec), ``skeleton`` (ModelSpec from an
   architecture spec), ``zoo`` (the models on disk: default, gemma3-270m, synthetic, quant ladders)
3. predictions — ``memory`` (the VRAM triangle), ``speed`` and ``calibration`` (the roofline)
4. measurements — ``bench`` with ``backends`` (in-process in a worker, llama-server, llama-bench files),
   ``monitor`` (telemetry while measuring), ``quality`` (perplexity, KL divergence), ``selftest`` (does this
   llama.cpp build run here?)
5. the workbook — ``levers`` (one sweep per lever → tidy rows), ``plots``, ``render`` (escaped
   display), ``scenario`` (the params schema), ``advisor`` (tune), ``doctor``, ``workbook`` (batch)
6. the ``v100lab`` command — ``cli`` and ``commands``
"""

__version__ = "0.1.0"
