"""Rewards: the registry of scorers and the manager that combines them.

- `register_reward(name)` / `build_reward(name, **options)` / `REWARDS`: the registry of
  scorer factories (`omni_rl.reward.registry` states the scorer contract).
- `RewardManager(specs).score(images, prompts, metadata) -> RewardOutput`: weighted sum,
  required/optional handling, metrics (`omni_rl.reward.manager`).
- `to_uint8_numpy`, `to_pil_list`, `check_batch`: input checks and conversions every scorer
  uses (`omni_rl.reward.inputs`).

The rewards themselves live outside the core, in the top-level `rewards/` package (and in
users' packages), and are found through `omni_rl.plugins`.
"""
from omni_rl.reward.inputs import Images, RewardInputError, batch_size, check_batch, to_pil_list, to_uint8_numpy
from omni_rl.reward.manager import RewardError, RewardManager, RewardOutput, RewardSpec
from omni_rl.reward.registry import REWARDS, RewardConfigError, Scorer, build_reward, register_reward

__all__ = [
    "REWARDS",
    "Images",
    "RewardConfigError",
    "RewardError",
    "RewardInputError",
    "RewardManager",
    "RewardOutput",
    "RewardSpec",
    "Scorer",
    "batch_size",
    "build_reward",
    "check_batch",
    "register_reward",
    "to_pil_list",
    "to_uint8_numpy",
]
