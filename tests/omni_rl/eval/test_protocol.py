"""`Protocol`: overrides, seeds as a function of the row and the sample, and differences."""
import pytest

from omni_rl.eval.protocol import Protocol, ProtocolError, ScorerSpec, differences

BASE = Protocol(samples_per_prompt=4, seed=0, num_steps=40, guidance_scale=4.5, height=512, width=512,
                scorers=(ScorerSpec("geneval", (("score", "correct"),)),))


def test_seeds_depend_on_the_row_and_the_sample_only():
    seeds = {(i, k): BASE.sample_seed(i, k) for i in range(3) for k in range(4)}
    assert len(set(seeds.values())) == 12
    assert Protocol(samples_per_prompt=1, seed=0).sample_seed(2, 3) == seeds[(2, 3)]
    assert Protocol(samples_per_prompt=4, seed=1).sample_seed(2, 3) != seeds[(2, 3)]


def test_overrides_change_fields_and_scorer_options_and_round_trip():
    p = BASE.with_overrides(["num_steps=10", "geneval.detector=tiny:x", "samples_per_prompt=1"])
    assert (p.num_steps, p.samples_per_prompt) == (10, 1)
    assert dict(p.scorers[0].kwargs) == {"score": "correct", "detector": "tiny:x"}
    assert Protocol.from_dict(p.to_dict()) == p
    assert differences(BASE.to_dict(), p.to_dict()) == [
        "num_steps: 40 vs 10", "samples_per_prompt: 4 vs 1",
        'scorers: [{"kwargs": {"score": "correct"}, "reward": "geneval"}] vs '
        '[{"kwargs": {"detector": "tiny:x", "score": "correct"}, "reward": "geneval"}]']


@pytest.mark.parametrize("override, match", [
    ("steps=4", "no protocol field"), ("num_steps", "key=value"), ("num_steps=0", "int >= 1"),
    ("guidance_scale=.inf", "finite"), ("pickscore.scale=1", "no protocol field"),
])
def test_bad_overrides_name_the_key(override, match):
    with pytest.raises(ProtocolError, match=match):
        BASE.with_overrides([override])
