"""`rollout_corr/logprob_abs_diff_*` has one producer, the trainer: the update files the loss's
first-mini-batch gap under its own name (`actor/first_minibatch_logprob_abs_diff_*`), and the
trainer's `rollout_corr_metrics` uses it only where its old-policy pass scored no sample."""
from types import SimpleNamespace

import torch

from omni_rl.families.update import FIRST_GAP_MAX_KEY, FIRST_GAP_MEAN_KEY, GAP_MAX_KEY, GAP_MEAN_KEY, run_update
from omni_rl.trainer.ppo_trainer import GAP_KEYS, rollout_corr_metrics


class Items:
    """Four items; `select` keeps their indices."""

    def __init__(self, index=range(4)):
        self.index = list(index)

    def __len__(self):
        return len(self.index)

    def select(self, index):
        return Items([self.index[i] for i in index])


class GapFamily:
    """A family whose loss reports a gap of 0.1 * (1 + optimizer steps so far) on every chunk."""

    def __init__(self):
        self.steps = 0

    def num_chunks(self, batch):
        return 1

    def train_items(self, batch):
        return batch

    def loss(self, micro, j):
        gap = 0.1 * (1 + self.steps)
        return None, {GAP_MAX_KEY: gap, GAP_MEAN_KEY: gap / 2, "loss/ratio_max_abs_dev": 0.0}

    def after_optimizer_step(self):
        self.steps += 1


class Engine:
    def forward_backward(self, micro, loss_fn, loss_scale):
        return dict(loss_fn(micro)[1])

    def optimizer_step(self):
        return {"actor/grad_norm": 1.0}


def test_the_update_keeps_the_first_mini_batch_gap_under_its_own_name():
    cfg = SimpleNamespace(trainer=SimpleNamespace(mini_batch_size=2, micro_batch_size=1, seed=0),
                          algo=SimpleNamespace(ppo_epochs=1))
    out = run_update(Engine(), GapFamily(), Items(), cfg, step=1)
    # Two mini-batches: the second one's gap (0.2) is after an optimizer step and is not kept.
    assert out["maxima"][FIRST_GAP_MAX_KEY] == 0.1
    assert out["sums"][FIRST_GAP_MEAN_KEY] / out["counts"][FIRST_GAP_MEAN_KEY] == 0.05
    every_key = set(out["sums"]) | set(out["maxima"])
    assert not any(k.startswith("rollout_corr/") for k in every_key) and GAP_MAX_KEY not in every_key


def test_the_trainer_check_wins_where_it_scored_every_sample():
    checked = {GAP_KEYS[0]: 0.5, GAP_KEYS[1]: 0.25, "rollout_corr/checked_fraction": 1.0}
    update = {FIRST_GAP_MAX_KEY: 0.1, FIRST_GAP_MEAN_KEY: 0.05}
    assert rollout_corr_metrics(checked, update) == checked


def test_the_first_mini_batch_gap_stands_in_where_the_trainer_checked_none():
    partial = {"rollout_corr/checked_fraction": 0.5}
    update = {FIRST_GAP_MAX_KEY: 0.1, FIRST_GAP_MEAN_KEY: 0.05, "actor/grad_norm": torch.tensor(1.0).item()}
    assert rollout_corr_metrics(partial, update) == {**partial, GAP_KEYS[0]: 0.1, GAP_KEYS[1]: 0.05}
    # A loss that reports no gap (the forward-process losses) leaves the key out.
    assert rollout_corr_metrics(partial, {}) == partial
