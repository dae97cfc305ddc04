"""Speculative decoding: how a verification pass yields more than one token, predicted.

A draft (a smaller model, an MTP layer, or an n-gram lookup in the text so far) proposes ``n`` tokens; the
target model checks all of them in one pass over ``n + 1`` positions and keeps the drafted tokens up to the
first one it disagrees with, plus one token of its own. With a per-token acceptance probability ``α``
(token i is accepted only if tokens 1..i-1 were), the tokens a pass yields are::

    E(α, n) = 1 + α + α² + … + αⁿ = (1 − α^(n+1)) / (1 − α)        (α = 1: n + 1)

llama-server counts ``draft_n`` (tokens drafted) and ``draft_n_accepted``; their ratio ``r`` is the mean
share of a draft kept, ``r = (α + … + αⁿ) / n``, so ``E = 1 + n·r`` and :func:`alpha_from_rate` recovers α.

A pass costs the target on ``n + 1`` tokens of one sequence (its weights are read once; the extra columns are
matmul work — :func:`v100lab.predict.serving.predict_batch` on a GPU, the measured batched-decode curve on a CPU) plus
``n`` draft steps: a draft model's own decode, an MTP layer and the output head (bytes in proportion to the
target's), or ~0 for n-gram lookup. Speed = E / t_pass. The ceiling for speculative decode is the plain
ceiling (bandwidth / bytes per token) × E: a pass reads the weights once and yields E tokens.

Not modelled: sampling and the server's per-pass bookkeeping; passes where an n-gram lookup finds nothing
(they decode one token at the plain cost); a draft model's own prompt processing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from v100lab.predict import serving, speed
from v100lab.facts.config import SPEC_TYPES, RunConfig
from v100lab.base.errors import ConfigError
from v100lab.facts.spec import ModelSpec
from v100lab.base.safeio import json_number

# n-gram self-speculation looks drafts up in the tokens so far: no model pass (common/ngram-*.cpp)
NGRAM_TYPES = tuple(t for t in SPEC_TYPES if t.startswith("ngram"))
# Per-token acceptance assumed when none is measured or given. ASSUMPTIONS, said on every output that uses
# them: an MTP head or a same-family draft agrees with the target on most tokens of ordinary text; an n-gram
# lookup only where the text repeats itself (code edits, quoting), so less on average.
ASSUMED_ALPHA = {"draft": 0.7, "ngram": 0.5}
MAX_DRAFT = 64


def assumed_alpha(spec_type: str) -> float:
    """The per-token acceptance assumed for a draft kind when none is measured (:data:`ASSUMED_ALPHA`)."""
    return ASSUMED_ALPHA["ngram" if spec_type in NGRAM_TYPES else "draft"]


def _check(alpha: float, n: int) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"acceptance α must be a number in [0, 1], got {alpha!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"draft length must be a whole number >= 0, got {n!r}")


def tokens_per_pass(alpha: float, n: int) -> float:
    """E(α, n) = (1 − α^(n+1)) / (1 − α): tokens one verification pass yields (1 at α = 0, n + 1 at α = 1)."""
    _check(alpha, n)
    if alpha >= 1.0 - 1e-12:
        return float(n + 1)
    return (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def acceptance_rate(alpha: float, n: int) -> float:
    """The share of drafted tokens accepted, ``draft_n_accepted / draft_n``, for per-token α: (E − 1) / n."""
    _check(alpha, n)
    if n == 0:
        raise ConfigError("acceptance rate: no tokens are drafted at draft length 0")
    return (tokens_per_pass(alpha, n) - 1.0) / n


def alpha_from_rate(rate: float, n: int) -> float:
    """Per-token α whose :func:`acceptance_rate` at draft length ``n`` is ``rate`` (bisection; monotone in α)."""
    _check(rate, n)
    if n == 0:
        raise ConfigError("acceptance rate: no tokens are drafted at draft length 0")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if acceptance_rate(mid, n) < rate else (lo, mid)
    return (lo + hi) / 2


def tps_from_counts(n_gen: int, draft_n: int, accepted: int, n_draft: int,
                    verify_s: Callable[[int], float]) -> float:
    """tok/s of a generation llama-server reports as ``n_gen`` tokens with ``draft_n`` drafted and ``accepted``
    kept: each pass yields 1 + its accepted tokens, so ``n_gen − 1 − accepted`` passes (the first token comes
    from the prompt's step); ``draft_n / n_draft`` of them verified a full draft (``verify_s(n_draft + 1)``),
    the rest found nothing to draft (``verify_s(1)``). Every pass drafting gives E / verify_s(n + 1) again."""
    for name, v in (("n_gen", n_gen), ("draft_n", draft_n), ("accepted", accepted), ("n_draft", n_draft)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{name} must be a whole number >= 0, got {v!r}")
    if accepted > draft_n or n_gen < 2 or n_draft < 1:
        raise ConfigError(f"counts do not add up: {n_gen} generated, {draft_n} drafted, {accepted} accepted, "
                          f"draft length {n_draft}")
    passes = max(1.0, n_gen - 1 - accepted)
    drafting = min(passes, draft_n / n_draft)
    return n_gen / (drafting * verify_s(n_draft + 1) + (passes - drafting) * verify_s(1))


def speculative_ceiling(plain_ceiling_tps: float, alpha: float, n: int) -> float:
    """The ceiling for speculative decode: the plain ceiling × E(α, n) (weights read once per pass)."""
    if not (plain_ceiling_tps and plain_ceiling_tps > 0):
        raise ConfigError(f"plain ceiling must be positive, got {plain_ceiling_tps!r}")
    return plain_ceiling_tps * tokens_per_pass(alpha, n)


def speed_tps(alpha: float, n: int, t_verify_s: float, t_draft_s: float) -> float:
    """tok/s of speculative decode: E(α, n) / (t_verify(n + 1) + n × t_draft)."""
    t_pass = t_verify_s + n * t_draft_s
    if not (t_pass > 0):
        raise ConfigError(f"a verification pass must take some time, got {t_pass!r} s")
    return tokens_per_pass(alpha, n) / t_pass


def best_draft(alpha: float, verify_s: Callable[[int], float], t_draft_s: float,
               n_max: int = 16) -> tuple[int, float]:
    """(n, tok/s) with the highest predicted speed for draft lengths 0..n_max; ``verify_s(k)`` is the
    target's time for one pass over k tokens (n = 0 is plain decode)."""
    if isinstance(n_max, bool) or not isinstance(n_max, int) or not 0 <= n_max <= MAX_DRAFT:
        raise ConfigError(f"n_max must be a whole number in 0..{MAX_DRAFT}, got {n_max!r}")
    scores = [(speed_tps(alpha, n, verify_s(n + 1), t_draft_s), -n) for n in range(n_max + 1)]
    tps, neg_n = max(scores)
    return -neg_n, tps


# ------------------------------------------------------------------------------------------------
# cost of a pass on a device, from the speed model
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpecPrediction:
    """Speculative decode of one stream: ``n`` drafted per pass at per-token acceptance ``alpha``."""

    spec_type: str
    alpha: float
    alpha_source: str                # "assumed", "given" or "measured"
    n_draft: int
    tokens_per_pass: float
    t_verify_s: float                # the target on n + 1 tokens
    t_draft_s: float                 # one draft step
    plain_tps: float                 # no speculation, same configuration
    plain_ceiling_tps: float         # bandwidth / weight bytes (the seed's plain ceiling)
    best_n: int
    best_tps: float
    notes: tuple[str, ...] = ()

    @property
    def t_pass_s(self) -> float:
        return self.t_verify_s + self.n_draft * self.t_draft_s

    @property
    def tps(self) -> float:
        return self.tokens_per_pass / self.t_pass_s

    @property
    def speedup(self) -> float:
        return self.tps / self.plain_tps

    @property
    def ceiling_tps(self) -> float:
        return self.plain_ceiling_tps * self.tokens_per_pass

    def as_dict(self) -> dict[str, Any]:
        r = json_number
        return {"spec_type": self.spec_type, "alpha": r(self.alpha), "alpha_source": self.alpha_source,
                "draft_max": self.n_draft, "tokens_per_pass": r(self.tokens_per_pass),
                "t_verify_ms": r(self.t_verify_s * 1e3, 4), "t_draft_ms": r(self.t_draft_s * 1e3, 4),
                "tps": r(self.tps), "plain_tps": r(self.plain_tps), "speedup": r(self.speedup),
                "ceiling_tps": r(self.ceiling_tps), "plain_ceiling_tps": r(self.plain_ceiling_tps),
                "best_draft_max": self.best_n, "best_tps": r(self.best_tps), "notes": list(self.notes)}


def verify_time(spec: ModelSpec, devices, cfg: RunConfig, k: int, depth: int = 0,
                profile: Mapping[str, Any] | None = None, batching: Mapping[str, Any] | None = None) -> float:
    """The target's time for one pass over ``k`` tokens of one sequence: a batched step of k columns
    (:func:`v100lab.predict.serving.predict_batch`), with the KV cache read once — the k tokens share one sequence."""
    b = serving.predict_batch(spec, devices, cfg, batch=k, depth=depth, profile=profile, batching=batching)
    return b.t_step_s - b.t_kv_s * (k - 1) / k


def mtp_bytes(spec: ModelSpec) -> int:
    """Bytes one MTP draft step reads: the model's next-token-prediction layers (or, for a model without
    them, one average layer) plus the output head (``output.weight``, else the tied ``token_embd``)."""
    lb = spec.layer_bytes
    n_mtp = spec.nextn_layers or 0
    layers = sum(lb[spec.n_layer - n_mtp:]) if n_mtp else (sum(lb) / max(1, spec.n_layer))
    head = spec.tensor("output.weight") or spec.tensor("token_embd.weight")
    return int(layers + (head.n_bytes if head else 0))


def draft_step_time(spec_type: str, spec: ModelSpec, devices, cfg: RunConfig, plain: speed.Prediction,
                    draft_spec: ModelSpec | None = None, depth: int = 0,
                    profile: Mapping[str, Any] | None = None) -> tuple[float, str]:
    """(seconds per drafted token, how it was costed) for a draft kind (see the module docstring)."""
    if spec_type in NGRAM_TYPES:
        return 0.0, "n-gram lookup: no model pass per drafted token"
    if spec_type == "draft-simple":
        if draft_spec is None:
            raise ConfigError("spec type draft-simple needs a draft model (-md/--spec-draft-model)")
        d = speed.predict(draft_spec, devices, cfg, depth=depth, profile=profile)
        return 1.0 / d.tg_tps, f"draft model {draft_spec.name or draft_spec.architecture}: its own decode"
    # draft-mtp (and eagle3, dflash, dspark: a head of about that size): one layer and the output head, read
    # at the target's bandwidth like its own decode
    read = max(1, spec.weight_bytes - sum(spec.layer_bytes[spec.n_layer - (spec.nextn_layers or 0):]))
    share = mtp_bytes(spec) / read
    return share / plain.tg_tps, f"{spec_type}: a layer and the output head, {share:.1%} of a token's bytes"


def predict(spec: ModelSpec, devices, cfg: RunConfig | None = None, spec_type: str = "ngram-simple",
            n_draft: int = 4, alpha: float | None = None, draft_spec: ModelSpec | None = None,
            depth: int = 0, profile: Mapping[str, Any] | None = None,
            batching: Mapping[str, Any] | None = None, n_max: int = 16,
            alpha_source: str | None = None) -> SpecPrediction:
    """Predict speculative decode for ``spec`` on ``devices``: ``spec_type`` (llama-server's --spec-type),
    ``n_draft`` (--draft-max), ``alpha`` per-token acceptance (None: :func:`assumed_alpha`)."""
    if spec_type not in SPEC_TYPES or spec_type == "none":
        raise ConfigError(f"spec type must be one of {', '.join(t for t in SPEC_TYPES if t != 'none')}, "
                          f"got {spec_type!r}")
    cfg = cfg or RunConfig()
    src = alpha_source or ("assumed" if alpha is None else "given")
    alpha = assumed_alpha(spec_type) if alpha is None else alpha
    _check(alpha, n_draft)
    plain = speed.predict(spec, devices, cfg, depth=depth, profile=profile)
    t_draft, how = draft_step_time(spec_type, spec, devices, cfg, plain, draft_spec, depth, profile)
    cache: dict[int, float] = {}

    def vt(k: int) -> float:
        if k not in cache:
            cache[k] = verify_time(spec, devices, cfg, k, depth, profile, batching)
        return cache[k]

    best_n, best_tps = best_draft(alpha, vt, t_draft, max(n_max, n_draft) if n_draft <= MAX_DRAFT else n_max)
    notes = [f"α {alpha:.2f} ({src})", how]
    if spec.nextn_layers == 0 and spec_type == "draft-mtp":
        notes.append("this description has no MTP layers (nextn_predict_layers): one average layer costed; "
                     "llama-server's draft-mtp needs a GGUF that holds them")
    return SpecPrediction(spec_type=spec_type, alpha=float(alpha), alpha_source=src, n_draft=n_draft,
                          tokens_per_pass=tokens_per_pass(alpha, n_draft), t_verify_s=vt(n_draft + 1),
                          t_draft_s=t_draft, plain_tps=1.0 / vt(1), plain_ceiling_tps=plain.weights_ceiling_tg_tps,
                          best_n=best_n, best_tps=best_tps, notes=tuple(notes))
