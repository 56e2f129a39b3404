"""Tests for omni_rl.families.preference_pairs: best vs worst per group, ties skipped, the pair batch."""
import torch

from omni_rl.families.preference_pairs import PairBatch, best_worst_pairs
from omni_rl.models.conditioning import Conditioning


def test_best_and_worst_of_each_group_in_group_order():
    rewards = torch.tensor([0.1, 0.9, 0.5, 3.0, 1.0, 2.0])
    groups = torch.tensor([1, 1, 1, 0, 0, 0])
    winners, losers = best_worst_pairs(rewards, groups)
    assert winners.tolist() == [3, 1] and losers.tolist() == [4, 0]


def test_groups_whose_rewards_all_tie_are_skipped_and_equal_ones_take_the_first():
    rewards = torch.tensor([0.5, 0.5, 0.5, 1.0, 2.0, 2.0, 1.0, 7.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2])  # group 2 has one sample: nothing to compare
    winners, losers = best_worst_pairs(rewards, groups)
    assert winners.tolist() == [4] and losers.tolist() == [3]


def test_no_pairs_at_all():
    winners, losers = best_worst_pairs(torch.ones(4), torch.tensor([0, 0, 1, 1]))
    assert winners.numel() == 0 and losers.numel() == 0


def test_pair_batch_select_keeps_the_pairs_together():
    chosen = torch.arange(3.0).reshape(3, 1, 1, 1)
    pairs = PairBatch(chosen=chosen, rejected=-chosen, conditioning=Conditioning({"emb": torch.arange(3.0)[:, None]}),
                      seeds=torch.tensor([10, 11, 12]), guidance_scale=4.5, prompts=["a", "b", "c"])
    picked = pairs.select([2, 0])
    assert len(picked) == 2 and picked.prompts == ["c", "a"] and picked.seeds.tolist() == [12, 10]
    assert picked.chosen.flatten().tolist() == [2.0, 0.0] and picked.rejected.flatten().tolist() == [-2.0, -0.0]
    assert picked.conditioning["emb"].flatten().tolist() == [2.0, 0.0]
