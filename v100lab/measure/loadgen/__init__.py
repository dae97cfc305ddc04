"""A load generator for OpenAI-compatible servers: serving measured the way serving benchmarks measure it.

What it sends: streamed ``POST /v1/completions`` (or ``/v1/chat/completions``) requests to llama-server,
llama-cpp-python's server, vLLM or any OpenAI-compatible URL, and reads each response's server-sent events
token by token (httpx, async). The workload:

* **levels** — closed-loop concurrency (``Level(concurrency=4)``: four requests always in flight, the next
  sent as one finishes) or open-loop arrival at a rate (``Level(rate=2.0, arrival="poisson")``: requests
  sent at exponential intervals, or ``"constant"`` ones, whatever the server's state; optionally capped
  at ``max_concurrency`` in flight, as ``vllm bench serve --max-concurrency``);
* **lengths** — prompt and output lengths fixed (``Lengths.parse("128")``) or drawn from a distribution
  (``"uniform:64-256"``, ``"normal:128,32"``), seeded: every level sends the same lengths in the same order
  (its prompts' *content* differs per level, and llama-server's prompt cache is off, so no level reuses
  another's cache);
* **prompts** — for llama-server, token ids (exact counts): real word tokens from the server's own
  ``/tokenize`` of a word list, drawn at random; for other servers, text of random common words, counted
  by the server's ``usage.prompt_tokens`` when it reports one. Output: greedy (temperature 0) with
  ``ignore_eos`` so each request generates its ``max_tokens``.

Per request (:class:`RequestResult`): TTFT, each inter-token gap, end-to-end latency, prompt and generated
token counts, status and the reason of a failure, and llama-server's own ``timings`` when it sends them.

Per level (:func:`summarize_level`), with **vLLM's definitions** (``vllm bench serve``,
``vllm/benchmarks/serve.py`` ``calculate_metrics`` and the OpenAI completions request function):

* TTFT — from sending the request to the first event carrying generated text;
* ITL (inter-token latency) — the gap between successive events carrying text, *pooled over all
  requests* (every gap of every request is one sample);
* TPOT (time per output token) — per request, ``(latency − TTFT) / (output tokens − 1)``, for requests with
  more than one output token; output tokens are the server's ``usage.completion_tokens`` (else
  llama-server's ``timings.predicted_n``, else the number of text events);
* E2EL (end-to-end latency) — from sending to the last event carrying ``choices``;
* request throughput = completed requests / level duration; output tok/s = output tokens / duration;
  total tok/s = (prompt + output tokens) / duration; the duration runs from the first send to the last
  response of the level;
* goodput = requests meeting every stated SLO (TTFT ≤ ``slo.ttft_ms``, TPOT ≤ ``slo.tpot_ms``, E2EL ≤
  ``slo.e2el_ms``) / duration (a request with one output token has no TPOT and meets a TPOT limit, as in vLLM);
* mean, median, p90, p99 (numpy's linear interpolation) and standard deviation of TTFT, TPOT, ITL, E2EL, in ms.

Faults never stop a run: a URL that is not an OpenAI-compatible server, an HTTP 4xx/5xx, a stream cut
mid-event, a server that dies, a request past its time limit — each becomes a request with status
``failed`` and its reason; the summary counts them. Every request is bounded in time (``timeout_s``,
``read_timeout_s`` between two events), every level in count, and optionally in time
(``level_time_limit_s``).

Against llama-server (:func:`server_side_by_side`), each level also holds the server's own figures for the
same requests: ``timings`` (prompt_ms, predicted_ms, predicted_per_second) and the deltas of its
``/metrics`` counters over the level (when started with ``--metrics``; :func:`serve_bench` does).

Entry points: :func:`run_serve_bench` (a URL), :func:`serve_bench` (a URL, or a model it serves with
llama-server on 127.0.0.1 for the duration).

The package, one job per module (each imports only those above it in this list):

* :mod:`.request` — one request's record (:class:`RequestResult`) and vLLM's TPOT from it;
* :mod:`.workload` — levels, lengths, SLOs, the workload, planned requests and arrival schedules;
* :mod:`.client` — the HTTP client (httpx): probe, prompts from the server's vocabulary, one streamed
  request, one level;
* :mod:`.metrics` — the statistics of a level and llama-server's figures beside the client's;
* :mod:`.runner` — a run against a URL, stored as rows;
* :mod:`.llamaserver` — a model served by llama-server for the duration of a run;
* :mod:`.report` — the printed tables.
"""
from v100lab.measure.loadgen.client import (ServerInfo, parse_prometheus, probe, request_body, run_level, scrape_metrics,
                                    send_request, token_pool)
from v100lab.measure.loadgen.llamaserver import check_fits, is_url, serve_bench
from v100lab.measure.loadgen.metrics import fmt_figure, server_side_by_side, summarize_level
from v100lab.measure.loadgen.report import format_levels, format_side_by_side
from v100lab.measure.loadgen.request import RequestResult
from v100lab.measure.loadgen.runner import DEFINITIONS, ServeRun, normalize_url, run_serve_bench
from v100lab.measure.loadgen.workload import (DEFAULT_TIMEOUT_S, ENDPOINTS, MAX_CONCURRENCY, MAX_ERROR_BODY, MAX_EVENT_LINE,
                                      MAX_LENGTH, MAX_REQUESTS, METRICS, PROMPT_MODES, SLO, STATS, WORDS, Lengths,
                                      Level, PlannedRequest, Workload, arrival_offsets, default_requests,
                                      parse_concurrency, parse_rate, plan_level)

__all__ = [
    "DEFAULT_TIMEOUT_S", "DEFINITIONS", "ENDPOINTS", "MAX_CONCURRENCY", "MAX_ERROR_BODY", "MAX_EVENT_LINE",
    "MAX_LENGTH", "MAX_REQUESTS", "METRICS", "PROMPT_MODES", "SLO", "STATS", "WORDS", "Lengths", "Level",
    "PlannedRequest", "RequestResult", "ServeRun", "ServerInfo", "Workload", "arrival_offsets", "check_fits",
    "default_requests", "fmt_figure", "format_levels", "format_side_by_side", "is_url",
    "normalize_url", "parse_concurrency", "parse_prometheus", "parse_rate", "plan_level", "probe",
    "request_body", "run_level", "run_serve_bench", "scrape_metrics", "send_request",
    "serve_bench", "server_side_by_side", "summarize_level", "token_pool",
]
