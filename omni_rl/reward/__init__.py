"""Rewards: the registry of scorers and the manager that combines them.

Re-exports the registry, `RewardManager`, `MediaSamples`, `RewardScores`, `AsyncRewardScorer`
and the input checks. The rewards themselves live in `rewards/` and plugins (`omni_rl.plugins`).
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
