"""RewardManager: weighting, required/optional failures, validation, metrics."""
import logging
import math

import numpy as np
import pytest
import torch

from omni_rl.reward import (
    RewardConfigError,
    RewardError,
    RewardInputError,
    RewardManager,
    RewardOutput,
    RewardSpec,
    register_reward,
)


@register_reward("tests.manager.fixed")
def fixed(*, scores, as_tensor=False):
    """Returns the given scores whatever the images (as a list, or a float tensor)."""
    def score(images, prompts, metadata):
        return torch.tensor(scores, dtype=torch.float64) if as_tensor else list(scores)
    return score


@register_reward("tests.manager.fixed_b")
def fixed_b(*, scores):
    return lambda images, prompts, metadata: list(scores)


@register_reward("tests.manager.raises")
def raises(*, message="scorer exploded"):
    def score(images, prompts, metadata):
        raise ConnectionError(message)
    return score


@register_reward("tests.manager.metadata_echo")
def metadata_echo():
    return lambda images, prompts, metadata: [float(m.get("v", 0.0)) for m in metadata]


IMAGES = torch.zeros(3, 4, 4, 3, dtype=torch.uint8)
PROMPTS = ["a", "b", "c"]
META = [{}, {}, {}]


def _spec(name, scores=None, **kw):
    kwargs = {"scores": scores} if scores is not None else {}
    kwargs.update(kw.pop("kwargs", {}))
    return RewardSpec(name, kwargs=kwargs, **kw)


def test_weighted_sum_and_metrics():
    # total = 2 * [1, 2, 3] + 0.5 * [4, 0, -4] = [4, 4, 4]
    manager = RewardManager([
        _spec("tests.manager.fixed", [1.0, 2.0, 3.0], weight=2.0),
        _spec("tests.manager.fixed_b", [4.0, 0.0, -4.0], weight=0.5),
    ])
    out = manager.score(IMAGES, PROMPTS, META)
    assert isinstance(out, RewardOutput)
    assert out.total.dtype == torch.float32 and out.total.shape == (3,)
    torch.testing.assert_close(out.total, torch.tensor([4.0, 4.0, 4.0]))
    torch.testing.assert_close(out.per_reward["tests.manager.fixed"], torch.tensor([1.0, 2.0, 3.0]))
    assert out.per_reward["tests.manager.fixed_b"].dtype == torch.float32
    m = out.metrics
    assert m["reward/tests.manager.fixed/mean"] == pytest.approx(2.0)
    assert m["reward/tests.manager.fixed/std"] == pytest.approx(math.sqrt(2 / 3))  # population std
    assert m["reward/tests.manager.fixed_b/mean"] == pytest.approx(0.0)
    assert m["reward/total/mean"] == pytest.approx(4.0)
    assert m["reward/total/std"] == pytest.approx(0.0)
    assert all(isinstance(v, float) for v in m.values())
    assert out.failed == []
    # only optional rewards report a failed flag
    assert not any(key.endswith("/failed") for key in m)


def test_tensor_scores_are_accepted():
    out = RewardManager([_spec("tests.manager.fixed", [0.5, 1.5, 2.5], kwargs={"as_tensor": True})]).score(
        IMAGES, PROMPTS, META
    )
    torch.testing.assert_close(out.total, torch.tensor([0.5, 1.5, 2.5]))


def test_metadata_defaults_to_empty_dicts_and_reaches_the_scorer():
    manager = RewardManager([RewardSpec("tests.manager.metadata_echo")])
    torch.testing.assert_close(manager.score(IMAGES, PROMPTS).total, torch.zeros(3))
    out = manager.score(IMAGES, PROMPTS, [{"v": 1}, {"v": 2}, {}])
    torch.testing.assert_close(out.total, torch.tensor([1.0, 2.0, 0.0]))


def test_specs_may_be_mappings():
    manager = RewardManager([{"name": "tests.manager.fixed", "weight": 3.0, "kwargs": {"scores": [1, 1, 1]}}])
    torch.testing.assert_close(manager.score(IMAGES, PROMPTS, META).total, torch.full((3,), 3.0))
    with pytest.raises(RewardConfigError, match=r"unknown key\(s\) \['scale'\].*kwargs"):
        RewardManager([{"name": "jpeg_compressibility", "scale": 0.002}])


def test_required_reward_that_raises_names_the_reward():
    manager = RewardManager([_spec("tests.manager.fixed", [1, 2, 3]), RewardSpec("tests.manager.raises")])
    pattern = r"reward 'tests.manager.raises' raised ConnectionError: scorer exploded"
    with pytest.raises(RewardError, match=pattern) as info:
        manager.score(IMAGES, PROMPTS, META)
    assert isinstance(info.value.__cause__, ConnectionError)


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), -float("inf"), 1e300])
def test_non_finite_score_names_reward_and_index(bad_value):
    manager = RewardManager([_spec("tests.manager.fixed", [0.0, bad_value, 1.0])])
    with pytest.raises(RewardError, match=r"'tests.manager.fixed' returned non-finite scores at sample index 1 "):
        manager.score(IMAGES, PROMPTS, META)


@pytest.mark.parametrize("scores", [[1.0, 2.0], [1.0, 2.0, 3.0, 4.0], [[1.0], [2.0], [3.0]]])
def test_wrong_number_of_scores(scores):
    manager = RewardManager([_spec("tests.manager.fixed", scores)])
    with pytest.raises(RewardError, match=r"'tests.manager.fixed' returned scores of shape .* for 3 images"):
        manager.score(IMAGES, PROMPTS, META)


def test_non_numeric_scores():
    manager = RewardManager([_spec("tests.manager.fixed", ["good", "bad", "ugly"])])
    with pytest.raises(RewardError, match="'tests.manager.fixed' returned a list that is not a list of numbers"):
        manager.score(IMAGES, PROMPTS, META)


def test_optional_failure_is_logged_and_weights_renormalised(caplog):
    # weights 1 (ok), 3 (ok), 4 (fails): the survivors are rescaled by 8 / 4 = 2,
    # so total = 2 * (1 * [1, 1, 1] + 3 * [2, 0, 1]) = [14, 2, 8]
    manager = RewardManager([
        _spec("tests.manager.fixed", [1, 1, 1], weight=1.0),
        _spec("tests.manager.fixed_b", [2, 0, 1], weight=3.0, required=False),
        RewardSpec("tests.manager.raises", weight=4.0, required=False),
    ])
    with caplog.at_level(logging.WARNING, logger="omni_rl.reward.manager"):
        out = manager.score(IMAGES, PROMPTS, META)
    torch.testing.assert_close(out.total, torch.tensor([14.0, 2.0, 8.0]))
    assert out.failed == ["tests.manager.raises"]
    assert "tests.manager.raises" not in out.per_reward
    assert out.metrics["reward/tests.manager.raises/failed"] == 1.0
    assert out.metrics["reward/tests.manager.fixed_b/failed"] == 0.0
    assert "reward/tests.manager.raises/mean" not in out.metrics
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("tests.manager.raises" in w and "scorer exploded" in w for w in warnings)


def test_optional_invalid_output_is_also_dropped(caplog):
    manager = RewardManager([
        _spec("tests.manager.fixed", [1, 2, 3], weight=1.0),
        _spec("tests.manager.fixed_b", [0, float("nan"), 0], weight=1.0, required=False),
    ])
    with caplog.at_level(logging.WARNING):
        out = manager.score(IMAGES, PROMPTS, META)
    torch.testing.assert_close(out.total, torch.tensor([2.0, 4.0, 6.0]))  # rescaled by 2 / 1
    assert out.metrics["reward/tests.manager.fixed_b/failed"] == 1.0
    assert "sample index 1" in caplog.text


def test_all_rewards_failing_is_an_error():
    manager = RewardManager([RewardSpec("tests.manager.raises", required=False)])
    with pytest.raises(RewardError, match="no reward signal"):
        manager.score(IMAGES, PROMPTS, META)


def test_zero_weight_reward_is_logged_but_not_summed():
    manager = RewardManager([
        _spec("tests.manager.fixed", [1, 2, 3], weight=1.0),
        _spec("tests.manager.fixed_b", [100, 100, 100], weight=0.0),
    ])
    out = manager.score(IMAGES, PROMPTS, META)
    torch.testing.assert_close(out.total, torch.tensor([1.0, 2.0, 3.0]))
    assert out.metrics["reward/tests.manager.fixed_b/mean"] == 100.0


def test_metrics_only_rewards_may_all_weigh_zero_and_report_a_zero_total():
    # Pure on-policy distillation: the teachers train, the rewards only report.
    manager = RewardManager([_spec("tests.manager.fixed", [1, 2, 3], weight=0.0),
                             RewardSpec("tests.manager.raises", weight=0.0, required=False)], metrics_only=True)
    out = manager.score(IMAGES, PROMPTS, META)
    assert out.total.tolist() == [0.0, 0.0, 0.0]
    assert out.metrics["reward/tests.manager.fixed/mean"] == 2.0 and out.metrics["reward/tests.manager.raises/failed"] == 1.0


def test_input_errors_are_raised_before_any_reward_runs():
    manager = RewardManager([RewardSpec("tests.manager.raises")])
    with pytest.raises(RewardInputError, match="3 images but 2 prompts"):
        manager.score(IMAGES, PROMPTS[:2], META)


@pytest.mark.parametrize(
    "specs, pattern",
    [
        ([], "reward list is empty"),
        ([RewardSpec("brightness"), RewardSpec("brightness", weight=2.0)], "'brightness' appears more than once"),
        ([RewardSpec("brightness", weight=0.0)], "every reward weight is 0"),
        (["brightness"], "entry 0 has type str"),
        ([{"weight": 1.0}], "entry 0 has no 'name'"),
    ],
)
def test_bad_spec_lists(specs, pattern):
    with pytest.raises(RewardConfigError, match=pattern):
        RewardManager(specs)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), "1.0", True])
def test_weights_must_be_finite_numbers(weight):
    with pytest.raises(RewardConfigError, match=r"reward 'brightness': weight"):
        RewardSpec("brightness", weight=weight)


def test_numpy_weight_is_accepted():
    assert RewardSpec("brightness", weight=np.float32(0.5)).weight == 0.5


def test_reward_named_total_is_refused():
    with pytest.raises(RewardConfigError, match="may not be named 'total'"):
        RewardManager([RewardSpec("total")])


def test_build_errors_fail_at_construction_even_when_optional():
    with pytest.raises(RewardConfigError, match="'scael'"):
        RewardManager([RewardSpec("jpeg_compressibility", required=False, kwargs={"scael": 1.0})])


def test_end_to_end_with_builtin_rewards():
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8))
    images[0] = 128  # flat grey compresses far better than noise
    manager = RewardManager([
        RewardSpec("jpeg_compressibility", kwargs={"scale": 0.002}),
        RewardSpec("brightness", weight=0.5, required=False),
    ])
    out = manager.score(images, ["p", "p"], [{}, {}])
    assert out.per_reward["jpeg_compressibility"][0] > out.per_reward["jpeg_compressibility"][1]
    expected = out.per_reward["jpeg_compressibility"] + 0.5 * out.per_reward["brightness"]
    torch.testing.assert_close(out.total, expected)
    assert "RewardManager([jpeg_compressibility(w=1), brightness(w=0.5, optional)])" == repr(manager)


@pytest.mark.parametrize("bad_value", [3e38, -3e38, 2e15])
def test_a_score_too_large_to_train_on_names_the_reward_and_sample(bad_value):
    # 3e38 is a finite float32, but the advantage's squares of it overflow: caught here, by name.
    manager = RewardManager([_spec("tests.manager.fixed", [0.0, bad_value, 1.0])])
    with pytest.raises(RewardError, match=r"'tests.manager.fixed' returned scores too large to train on at sample "
                                          r"index 1 \(.*\): with its weight 1, \|weight \* score\| must be at most 1e\+15"):
        manager.score(IMAGES, PROMPTS, META)


def test_the_bound_applies_to_weight_times_score():
    # 1e16 x 0.01 = 1e14 is fine; 1e15 x 2 = 2e15 is not; a weight of 0 only logs the reward.
    ok = RewardManager([_spec("tests.manager.fixed", [1e16, 0.0, 0.0], weight=0.01),
                        _spec("tests.manager.fixed_b", [3e38, 0.0, 0.0], weight=0.0)])
    out = ok.score(IMAGES, PROMPTS, META)
    assert out.total[0].item() == pytest.approx(1e14)
    assert out.metrics["reward/tests.manager.fixed_b/mean"] == pytest.approx(1e38)
    with pytest.raises(RewardError, match=r"with its weight 2, \|weight \* score\|"):
        RewardManager([_spec("tests.manager.fixed", [1e15, 0.0, 0.0], weight=2.0)]).score(IMAGES, PROMPTS, META)


def test_a_total_too_large_names_the_sample_and_each_rewards_share():
    # 8e14 + 7e14 = 1.5e15 at sample 2: each reward alone is within the bound, the sum is not.
    manager = RewardManager([_spec("tests.manager.fixed", [0.0, 0.0, 7e14]), _spec("tests.manager.fixed_b", [0.0, 1.0, 8e14])])
    with pytest.raises(RewardError) as info:
        manager.score(IMAGES, PROMPTS, META)
    assert str(info.value).startswith(
        "the weighted reward total at sample index 2 is 1.5e+15, beyond +-1e+15, where the float32 advantage "
        "overflows and the loss becomes NaN; the rewards' shares: 'tests.manager.fixed_b' 8e+14 (score 8e+14 x "
        "weight 1), 'tests.manager.fixed' 7e+14 (score 7e+14 x weight 1)."
    )


def test_an_optional_reward_too_large_is_left_out(caplog):
    manager = RewardManager([_spec("tests.manager.fixed", [1, 2, 3]),
                             _spec("tests.manager.fixed_b", [0.0, -3e38, 0.0], required=False)])
    with caplog.at_level(logging.WARNING):
        out = manager.score(IMAGES, PROMPTS, META)
    assert out.failed == ["tests.manager.fixed_b"] and "too large to train on at sample index 1" in caplog.text
    torch.testing.assert_close(out.total, torch.tensor([2.0, 4.0, 6.0]))


def test_totals_within_the_bound_keep_the_float32_advantage_finite():
    # The reason for the bound: grpo's float32 group statistics of +-1e15 are finite, of +-3e38 not.
    from omni_rl.algos.advantages import AdvantageInput, grpo_advantage

    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    for std_mode in ("group", "global"):
        fine = torch.tensor([1e15, -1e15] * 4)
        assert torch.isfinite(grpo_advantage(AdvantageInput(fine, groups, std_mode, 1e-4))).all()
        huge = torch.tensor([3e38, 2e38] * 4)  # the group sums overflow
        assert not torch.isfinite(grpo_advantage(AdvantageInput(huge, groups, std_mode, 1e-4))).all()
