"""Rewards: the registry of scorers and the manager that combines them.

- `register_reward(name)` / `build_reward(name, **options)` / `REWARDS`: the registry of
  scorer factories (`omni_rl.reward.registry` states the scorer contract).
- `RewardManager(specs).score(samples, prompts, metadata) -> RewardOutput`: weighted sum,
  required/optional handling, metrics (`omni_rl.reward.manager`); samples are images (a list
  of PIL images or uint8 [B, H, W, C]) or generated texts (a list of str).
- `MediaSamples(video=, fps=, audio=, sample_rate=)`: the typed batch of a video or
  audio(-video) generator (`omni_rl.reward.media`); `register_reward(name, modalities=...)`
  declares what a reward scores, `reward_modalities(name, options)` answers it;
  `reward_metadata_needs(name, options)` the metadata keys each sample must carry for it.
- `RewardScores(scores, groups)`: what a scorer returns to break its scores down by a group per
  sample, reported as `reward/<group>` means (`omni_rl.reward.scores`).
- `AsyncRewardScorer`: micro-batched scoring of samples as a rollout finishes them
  (`omni_rl.reward.async_scorer`).
- `to_uint8_numpy`, `to_pil_list`, `to_text_list`, `check_batch`, `ground_truths`: input checks
  and conversions every scorer uses (`omni_rl.reward.inputs`).

The rewards themselves live outside the core, in the top-level `rewards/` package (and in
users' packages), and are found through `omni_rl.plugins`.
"""
from omni_rl.reward.inputs import (
    Images,
    RewardInputError,
    Samples,
    batch_size,
    check_batch,
    ground_truths,
    sample_kind,
    to_pil_list,
    to_text_list,
    to_uint8_numpy,
)
from omni_rl.reward.manager import RewardError, RewardManager, RewardOutput, RewardSpec
from omni_rl.reward.media import MediaSamples, frame_indices
from omni_rl.reward.scores import RewardScores
from omni_rl.reward.registry import (
    MODALITIES,
    REWARDS,
    RewardConfigError,
    RewardDeclaration,
    Scorer,
    build_reward,
    register_reward,
    reward_declaration,
    reward_metadata_needs,
    reward_modalities,
)

__all__ = [
    "MODALITIES",
    "REWARDS",
    "Images",
    "MediaSamples",
    "RewardConfigError",
    "RewardDeclaration",
    "RewardError",
    "RewardInputError",
    "RewardManager",
    "RewardOutput",
    "RewardScores",
    "RewardSpec",
    "Samples",
    "Scorer",
    "batch_size",
    "build_reward",
    "check_batch",
    "frame_indices",
    "ground_truths",
    "register_reward",
    "reward_declaration",
    "reward_metadata_needs",
    "reward_modalities",
    "sample_kind",
    "to_pil_list",
    "to_text_list",
    "to_uint8_numpy",
]
