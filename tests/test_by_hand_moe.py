"""The by-hand cells' weight count for a MoE model (02, 09, 10): a token multiplies only its top-k experts,
so the by-hand arithmetic subtracts the unused share of ``by_hand.expert_tensors`` and agrees with the speed
model (``work.decode_work``) within the notebooks' 1 %. No model file is read: skeletons of the synthetic
presets."""

import pytest

from v100lab.models import synth
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.workbook.levers.by_hand import expert_tensors, not_multiplied
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.predict.work import Placed, decode_work


def _by_hand(spec):
    multiplied = spec.n_params - sum(t.n_elements for t in not_multiplied(spec))
    experts = expert_tensors(spec)
    if experts:
        multiplied -= (1 - spec.expert_used_count / spec.expert_count) * sum(t.n_elements for t in experts)
    return 2 * multiplied


@pytest.mark.parametrize("alias, moe", [("synth-qwen3moe-500m", True), ("synth-qwen35moe-tiny", True),
                                        ("synth-qwen35-500m", False), ("synth-gemma3-500m", False)])
def test_by_hand_flops_agree_with_the_speed_model(alias, moe):
    spec = skeleton_spec(synth.arch_spec_of(synth.ARCH_PRESETS[alias]), "Q4_K_M")
    assert bool(expert_tensors(spec)) is moe
    dev = get_device("v100-16gb")
    placed = {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}
    package = sum(w.flops for w in decode_work(spec, placed, RunConfig(), 0).values())
    assert _by_hand(spec) == pytest.approx(package, rel=0.01)
