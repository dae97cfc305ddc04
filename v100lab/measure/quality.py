"""Quality per quant, measured instead of judged by impression: perplexity and KL divergence.

The method mirrors llama.cpp's ``llama-perplexity`` (tools/perplexity/perplexity.cpp,
``perplexity()`` and ``kl_divergence()``): the corpus is tokenized once, cut into chunks of ``n_ctx``
tokens, each chunk is evaluated from an empty cache, and only the second half of each chunk is scored
(so every scored token has at least ``n_ctx/2`` tokens of context). Perplexity is
``exp(mean(-log p(next token)))``; the KL divergence is ``mean over positions of
sum_v p_ref(v) * (log p_ref(v) - log p_q(v))`` against the reference model's distribution at the same
position; "top-1 agreement" is how often both models' most likely next token is the same.

The corpus ships with Python itself: the Python Language Reference topics in the standard library's
``pydoc_data.topics`` (about 465 kB of English prose and grammar), taken in sorted-key order, so every
machine with the same Python version scores the same text.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from v100lab.models import zoo
from v100lab.base.errors import V100labError
from v100lab.facts.results import Observation
from v100lab.models.worker import call_isolated
from v100lab.models.zoo import quant_of

log = logging.getLogger(__name__)

CORPUS_NAME = "pydoc_data.topics (Python Language Reference topics, ships with CPython)"


def corpus_text() -> str:
    """The evaluation corpus: CPython's ``pydoc_data.topics``, sorted by topic name."""
    from pydoc_data.topics import topics  # heavy: a ~800 kB module of text, loaded only for an evaluation

    return "\n\n".join(topics[k] for k in sorted(topics))


@dataclass(frozen=True)
class QualityResult:
    model: str
    reference: str | None
    n_ctx: int
    n_chunks: int
    n_scored: int               # tokens scored (second half of each chunk)
    ppl: float
    ppl_stderr: float           # standard error of the perplexity (delta method on mean NLL)
    kld_mean: float | None      # mean KL(reference || model) in nats; None without a reference
    top1_agreement: float | None  # share of positions where both models' argmax agree


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _load(path: Path, n_ctx: int, n_threads: int):
    import llama_cpp  # heavy: loaded only in the worker process that evaluates

    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512),
                           n_threads=n_threads, n_threads_batch=n_threads, logits_all=True,
                           n_gpu_layers=0, verbose=False)


def _chunk_logprobs(llm, tokens: list[int]) -> np.ndarray:
    """Log-probabilities (n_tokens × n_vocab) for one chunk, evaluated from an empty cache."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(tokens)
    return _log_softmax(np.asarray(llm.scores[: len(tokens)], dtype=np.float32))


def evaluate(model: str | Path, reference: str | Path | None = None, *, n_ctx: int = 256,
             n_chunks: int = 4, n_threads: int | None = None) -> QualityResult:
    """Perplexity of ``model`` on the corpus, and its KL divergence from ``reference`` when given.

    Both models must share a tokenizer (a quant ladder does). Cost: ``n_chunks × n_ctx`` tokens of
    prompt processing per model.
    """
    if n_ctx < 16 or n_ctx % 2:
        raise V100labError(f"n_ctx for quality evaluation must be an even number >= 16, got {n_ctx}")
    if n_chunks < 1:
        raise V100labError(f"n_chunks must be >= 1, got {n_chunks}")
    threads = n_threads or os.cpu_count() or 1
    mpath = zoo.model_path(model)
    rpath = zoo.model_path(reference) if reference is not None else None

    return call_isolated(_evaluate_here, str(model), mpath, None if reference is None else str(reference), rpath,
                         n_ctx, n_chunks, threads, what=f"scoring {mpath.name}")


def _evaluate_here(model: str, mpath: Path, reference: str | None, rpath: Path | None, n_ctx: int, n_chunks: int,
                   threads: int) -> QualityResult:
    """:func:`evaluate` in this process (the worker's side): both models loaded, every chunk scored."""
    llm = _load(mpath, n_ctx, threads)
    tokens = llm.tokenize(corpus_text().encode("utf-8"), add_bos=False, special=False)
    if len(tokens) < n_ctx * n_chunks:
        raise V100labError(f"corpus has {len(tokens)} tokens, fewer than n_ctx × n_chunks = {n_ctx * n_chunks}")
    ref = _load(rpath, n_ctx, threads) if rpath else None
    if ref is not None and ref.n_vocab() != llm.n_vocab():
        raise V100labError(f"reference {rpath.name} has a different vocabulary ({ref.n_vocab()} vs {llm.n_vocab()})")
    first = n_ctx // 2
    nll: list[float] = []
    kld: list[float] = []
    agree = 0
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        lp = _chunk_logprobs(llm, chunk)
        # position i predicts token i+1 (perplexity.cpp scores logits[first .. n_ctx-2])
        pos = np.arange(first, n_ctx - 1)
        nxt = np.asarray(chunk[first + 1:n_ctx])
        nll.extend((-lp[pos, nxt]).tolist())
        if ref is not None:
            rlp = _chunk_logprobs(ref, chunk)
            p = np.exp(rlp[pos])
            kld.extend((p * (rlp[pos] - lp[pos])).sum(axis=-1).tolist())
            agree += int((rlp[pos].argmax(-1) == lp[pos].argmax(-1)).sum())
        log.info("quality: chunk %d/%d of %s", c + 1, n_chunks, mpath.name)
    nll_arr = np.asarray(nll)
    mean = float(nll_arr.mean())
    se = float(nll_arr.std(ddof=1) / math.sqrt(len(nll_arr))) if len(nll_arr) > 1 else float("nan")
    ppl = math.exp(mean)
    return QualityResult(
        model=model, reference=reference, n_ctx=n_ctx,
        n_chunks=n_chunks, n_scored=len(nll_arr), ppl=ppl, ppl_stderr=ppl * se,
        kld_mean=float(np.mean(kld)) if kld else None,
        top1_agreement=agree / len(nll_arr) if ref is not None else None)


def ladder_observations(results: list[QualityResult], model_label: str, device: str = "host"):
    """Quality results as tidy-table rows (lever "quant", source "measured")."""
    rows = []
    for r in results:
        quant = quant_of(r.model)
        rows.append(Observation(model_label, quant, device, "quant", quant, "perplexity", r.ppl, "ppl",
                                "measured", note=f"± {r.ppl_stderr:.3g}; {r.n_scored} tokens of {CORPUS_NAME}"))
        if r.kld_mean is not None:
            rows.append(Observation(model_label, quant, device, "quant", quant, "kl_divergence", r.kld_mean,
                                    "nats", "measured", note=f"vs {r.reference}"))
            rows.append(Observation(model_label, quant, device, "quant", quant, "top1_agreement",
                                    r.top1_agreement, "fraction", "measured", note=f"vs {r.reference}"))
    return rows
