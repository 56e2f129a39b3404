"""Tests for omni_rl.algos.advantages: hand values, the vectorised forms against plain loops, checks."""
import math

import pytest
import torch

from omni_rl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    STD_MODES,
    AdvantageInput,
    get_advantage_estimator,
    needs_group,
    register_advantage_estimator,
)
from omni_rl.registry import RegistryError

EPS = 1e-4
# Three prompts with ids 7, 3, 9 (not contiguous, not sorted); prompt 9 has a single sample.
REWARDS = torch.tensor([1.0, 3.0, 0.0, 4.0, 8.0, 5.0])
GROUPS = torch.tensor([7, 7, 3, 3, 3, 9])


def _adv(name, std_mode="group", rewards=REWARDS, groups=GROUPS):
    return get_advantage_estimator(name)(AdvantageInput(rewards, groups, std_mode, EPS))


def test_grpo_group_std_hand_values():
    # group 7: mean 2, population std 1          -> [-1, 1] / (1 + 1e-4)
    # group 3: mean 4, std sqrt((16 + 0 + 16) / 3) = 3.2659863 -> [-4, 0, 4] / (3.2659863 + 1e-4)
    # group 9: one sample                          -> 0
    s3 = math.sqrt(32 / 3)
    expected = torch.tensor([-1 / (1 + EPS), 1 / (1 + EPS), -4 / (s3 + EPS), 0.0, 4 / (s3 + EPS), 0.0])
    torch.testing.assert_close(_adv("grpo", "group"), expected)


def test_grpo_global_std_hand_values():
    # Batch mean 21 / 6 = 3.5; squared deviations 6.25, 0.25, 12.25, 0.25, 20.25, 2.25 sum to 41.5,
    # population std sqrt(41.5 / 6) = 2.6299556. Means stay per group.
    s = math.sqrt(41.5 / 6)
    expected = torch.tensor([-1.0, 1.0, -4.0, 0.0, 4.0, 0.0]) / (s + EPS)
    torch.testing.assert_close(_adv("grpo", "global"), expected)


def test_grpo_none_and_dr_grpo_only_centre():
    centred = torch.tensor([-1.0, 1.0, -4.0, 0.0, 4.0, 0.0])
    torch.testing.assert_close(_adv("grpo", "none"), centred)
    for mode in STD_MODES:  # dr_grpo ignores std_mode
        torch.testing.assert_close(_adv("dr_grpo", mode), centred)


def test_rloo_hand_values():
    # group 7: 1 - 3 = -2, 3 - 1 = 2; group 3: 0 - (4+8)/2 = -6, 4 - (0+8)/2 = 0, 8 - (0+4)/2 = 6;
    # group 9: size 1 -> 0.
    torch.testing.assert_close(_adv("rloo"), torch.tensor([-2.0, 2.0, -6.0, 0.0, 6.0, 0.0]))
    # Identity: A_rloo = n / (n - 1) * (r - mean_group) for n > 1.
    n = torch.tensor([2.0, 2.0, 3.0, 3.0, 3.0, 1.0])
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    torch.testing.assert_close(_adv("rloo"), scale * _adv("dr_grpo"))


def _loop_reference(name, rewards, groups, std_mode, eps=EPS):
    """Plain python over groups, one sample at a time."""
    r, g = rewards.tolist(), groups.tolist()
    all_mean = sum(r) / len(r)
    global_std = math.sqrt(sum((x - all_mean) ** 2 for x in r) / len(r))
    out = []
    for i, gi in enumerate(g):
        members = [r[j] for j in range(len(r)) if g[j] == gi]
        n, mean = len(members), sum(members) / len(members)
        if name == "rloo":
            out.append(r[i] - (sum(members) - r[i]) / (n - 1) if n > 1 else 0.0)
            continue
        centred = r[i] - mean
        if name == "dr_grpo" or std_mode == "none":
            out.append(centred)
        elif std_mode == "global":
            out.append(centred / (global_std + eps))
        else:
            out.append(centred / (math.sqrt(sum((x - mean) ** 2 for x in members) / n) + eps))
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("std_mode", STD_MODES)
def test_vectorised_matches_plain_loop(name, std_mode):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(40, generator=gen, dtype=torch.float64) * 3 + 1
    groups = torch.randint(0, 9, (40,), generator=gen) * 5 - 11  # sparse, negative ids too
    ours = _adv(name, std_mode, rewards, groups)
    assert ours.dtype == torch.float32 and ours.shape == (40,)
    torch.testing.assert_close(ours, _loop_reference(name, rewards, groups, std_mode), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_singleton_and_constant_groups_are_zero(name):
    rewards = torch.tensor([2.0, 2.0, 2.0, 7.0])
    groups = torch.tensor([0, 0, 0, 1])
    for mode in STD_MODES:
        assert _adv(name, mode, rewards, groups).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_empty_batch():
    out = _adv("grpo", "global", torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)


def test_nan_reward_names_the_sample():
    rewards = torch.tensor([1.0, 2.0, float("nan"), 0.0])
    with pytest.raises(ValueError, match="reward of sample 2 is nan"):
        AdvantageInput(rewards, torch.tensor([0, 0, 1, 1]), "group")


def test_input_checks():
    with pytest.raises(ValueError, match="std_mode='batch' is not one of group, global, none"):
        AdvantageInput(REWARDS, GROUPS, "batch")
    with pytest.raises(ValueError, match="rewards has 6 entries but group_index has 5"):
        AdvantageInput(REWARDS, GROUPS[:5], "group")
    with pytest.raises(TypeError, match="group_index has dtype torch.float32"):
        AdvantageInput(REWARDS, GROUPS.float(), "group")
    with pytest.raises(ValueError, match="must both be 1-D"):
        AdvantageInput(REWARDS[:, None], GROUPS, "group")
    with pytest.raises(ValueError, match="eps=0"):
        AdvantageInput(REWARDS, GROUPS, "group", eps=0)


def test_registry():
    assert ADVANTAGE_ESTIMATORS.names() == ["dr_grpo", "grpo", "rloo"]
    with pytest.raises(RegistryError, match="dr_grpo, grpo, rloo"):
        get_advantage_estimator("ppo")


# ------------------------------------------------------------------ all-equal groups are exactly 0


@pytest.mark.parametrize("eps", [1e-4, 1e-6])
@pytest.mark.parametrize("value", [0.1, 0.3, 0.7, 0.9])
def test_all_equal_groups_are_exactly_zero_in_float32(value, eps):
    # In float32 0.9 is 0.89999998 and sixteen of them added one by one make 14.399998, so a plain
    # group mean is 0.89999986: r - mean = 1.2e-7 for every sample and the population std is 1.2e-7
    # too, so before the fix A = 1.2e-7 / (1.2e-7 + eps) came out at 1.2e-3 (eps 1e-4) or 0.107
    # (eps 1e-6) instead of 0; groups of 32 reached 2.4e-3 and 0.225.
    # Groups of 2..32 equal rewards next to a mixed group, in every std mode, must give exactly 0.
    sizes = [2, 3, 8, 16, 24, 32]
    rewards = torch.cat([torch.full((n,), value) for n in sizes] + [torch.tensor([0.0, 1.0])])
    groups = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)] + [torch.tensor([99, 99])])
    equal = groups != 99
    for name in ("grpo", "dr_grpo", "rloo"):
        for mode in STD_MODES:
            out = get_advantage_estimator(name)(AdvantageInput(rewards, groups, mode, eps))
            assert bool((out[equal] == 0.0).all()), (name, mode, out[equal].abs().max().item())
            assert bool((out[~equal] != 0).all())  # the mixed group {0, 1} still learns


def test_the_mmk12_case_from_the_issue():
    # 0.9 accuracy + 0.1 format: 16 samples all right and formatted score 0.9 + 0.1 = 1.0 each, all
    # wrong but formatted 0.1, all right but unformatted 0.9; with eps 1e-6 grpo/group used to give
    # those three groups 0, -0.015 and 0.107 (1.0 is exact in float32, 0.1 and 0.9 are not).
    rewards = torch.tensor([0.9 * 1 + 0.1 * 1] * 16 + [0.9 * 0 + 0.1 * 1] * 16 + [0.9 * 1 + 0.1 * 0] * 16)
    groups = torch.arange(3).repeat_interleave(16)
    out = get_advantage_estimator("grpo")(AdvantageInput(rewards, groups, "group", 1e-6))
    assert out.tolist() == [0.0] * 48


def test_mixed_groups_match_float64_to_1e6():
    # Zeroing uniform groups leaves the others as computed before: rewards in [0, 1] (MMK12-like, tenths)
    # agree with a float64 computation to 1e-6 (|A| is at most ~4 here).
    gen = torch.Generator().manual_seed(5)
    rewards = torch.randint(0, 11, (256,), generator=gen).float() / 10
    groups = torch.randint(0, 16, (256,), generator=gen)
    for name in ("grpo", "dr_grpo", "rloo"):
        for mode in STD_MODES:
            ours = _adv(name, mode, rewards, groups).double()
            exact = _loop_reference(name, rewards.double(), groups, mode).double()
            torch.testing.assert_close(ours, exact, atol=1e-6, rtol=0)


# ------------------------------------------------------------------ needs_group


def test_every_shipped_estimator_needs_a_group():
    # grpo (every std mode) and dr_grpo subtract the group mean, rloo the mean of the others:
    # in a group of one all three give A = 0, so training would do nothing.
    for name in ADVANTAGE_ESTIMATORS.names():
        assert needs_group(name) is True, name


def test_needs_group_is_declared_at_registration(monkeypatch):
    def batch_baseline(inp):  # a baseline from the whole batch: groups of one are fine
        rewards = inp.rewards.to(torch.float32)
        return rewards - rewards.mean()

    def undeclared(inp):
        return inp.rewards.to(torch.float32)

    # Registered into the real registry, restored afterwards.
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_entries", dict(ADVANTAGE_ESTIMATORS._entries))
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_specs", dict(ADVANTAGE_ESTIMATORS._specs))
    register_advantage_estimator("test_batch_baseline", needs_group=False)(batch_baseline)
    ADVANTAGE_ESTIMATORS.register("test_undeclared", undeclared)
    assert needs_group("test_batch_baseline") is False
    assert needs_group("test_undeclared") is True  # this module's contract is group-relative
    with pytest.raises(RegistryError, match="unknown advantage estimator 'ppo'"):
        needs_group("ppo")
