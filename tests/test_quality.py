"""Quality per quant: perplexity and KL divergence on the default model's real ladder."""

from __future__ import annotations

import math

import pytest

from v100lab.measure import quality
from v100lab.models import zoo
from v100lab.base.errors import V100labError


def test_corpus_ships_with_python():
    text = quality.corpus_text()
    assert len(text) > 100_000
    assert "Assignment statements" in text


@pytest.mark.slow
def test_reference_against_itself_has_zero_divergence():
    r = quality.evaluate("default:F16", "default:F16", n_ctx=64, n_chunks=1)
    assert r.kld_mean == pytest.approx(0.0, abs=1e-6)
    assert r.top1_agreement == 1.0
    assert 1.0 < r.ppl < 1e4 and math.isfinite(r.ppl_stderr)


@pytest.mark.slow
def test_fewer_bits_diverge_more():
    q8 = quality.evaluate("default:Q8_0", "default:F16", n_ctx=128, n_chunks=2)
    q2 = quality.evaluate("default:Q2_K", "default:F16", n_ctx=128, n_chunks=2)
    assert q8.kld_mean < q2.kld_mean
    assert q8.top1_agreement > q2.top1_agreement
    rows = quality.ladder_observations([q8, q2], "SmolLM2-135M")
    assert {r.metric for r in rows} == {"perplexity", "kl_divergence", "top1_agreement"}
    assert {r.quant for r in rows} == {"Q8_0", "Q2_K"}


def test_bad_arguments_are_named():
    with pytest.raises(V100labError, match="n_ctx"):
        quality.evaluate("default", n_ctx=7)
    with pytest.raises(V100labError, match="n_chunks"):
        quality.evaluate("default", n_chunks=0)


def test_default_ladder_aliases_resolve_without_building():
    with pytest.raises(V100labError):
        zoo.model_path("default:Q9_Z")
    assert zoo.quant_of("default:q4_0") == "Q4_0"
