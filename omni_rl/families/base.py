"""`ModelFamily`: everything the PPO loop does that depends on the kind of model, in one object.

A family is registered under the name its adapters carry in `OmniModelBase.family`; its `Options`
(`algo.family_options`), its `Sampling` (`rollout.sampling_options`) and `check_config` run at load. Its rollout half (driver) makes requests,
batches, reward inputs and validation; its actor half replays a stored batch teacher-forced
(`behaviour_policy`, `loss`, `num_chunks`) with the adapter's own functions, so the rollout's
log-probs and the trainer's are one function.

Not here: the loop, where the weights live (`ActorGroup`), the optimizer, the maths.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

import torch

from omni_rl.algos.policy_losses import PolicyLoss
from omni_rl.config.options import NoOptions
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.data.prompt_length import PromptLimitOptions
from omni_rl.registry import Registry

# score(sample, prompt, metadata, future): hands one finished sample to the reward scorer.
ScoreFn = Callable[[Any, str, dict, Any], None]


@dataclass
class BehaviourPolicy:
    """The behaviour policy's view of a batch, scored under the current weights.

    log_probs: [N, W] (diffusion: per window step) or [N, R] (text: per response token), fp32.
    mask:      same shape; 1 where an entry counts (every step; the response tokens).
    means:     diffusion only, [N, W, *latent]: the transition means, for losses that read them.
    routes:    text under routing_replay=r2 only, [N, T, L, k]: the routed experts this forward
               used, which the update replays (the actor group puts them on the batch it updates).
    """

    log_probs: torch.Tensor
    mask: torch.Tensor
    means: Optional[torch.Tensor] = None
    routes: Optional[torch.Tensor] = None


class ModelFamily(ABC):
    # The trainer's batch type of this family (DiffusionBatch, TextBatch).
    batch_type: ClassVar[type]
    # The `algo.rollout_correction_options.level` levels its actions take besides "none" (`algos/rollout_correction.py`),
    # checked at config load.
    rollout_is_levels: ClassVar[tuple[str, ...]] = ()
    # The registry `algo.policy_loss` is looked up in: the losses of this family's actions
    # (`algos.DIFFUSION_LOSSES`, `algos.TOKEN_LOSSES`); checked at config load.
    losses: ClassVar[Registry[type[PolicyLoss]]]
    # The family's own options (a dataclass), set in `algo.family_options` and checked at load.
    Options: ClassVar[type] = NoOptions
    # How it samples (`omni_rl.families.sampling`: DiffusionSampling, TextSampling, ...), set in
    # `rollout.sampling_options` and bound at load by the composition root.
    Sampling: ClassVar[type] = NoOptions
    # What its rewards are handed (`reward_inputs`), a subset of the reward registry's modalities:
    # a reward that scores none of them is refused at load. None: it depends on the config (a
    # diffusion model's images or video, and audio), checked by the composition root's own rules.
    sample_modalities: ClassVar[Optional[frozenset[str]]] = None

    @classmethod
    def variant(cls, cfg: OmniConfig) -> type["ModelFamily"]:
        """The family class that trains this config (itself, or one of its variants chosen by
        the loss: the diffusion family's forward-process variant)."""
        return cls

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        """The family's own rules on the config, run at load for the adapter's family; a failure
        is a `ConfigError` naming the key (none by default)."""

    @classmethod
    def nested_option_blocks(cls, options) -> tuple[tuple[str, type, str, str], ...]:
        """The blocks inside the family's bound `options` that configure a component of their own
        (think_draw's plan loss): (attribute, options class, config key, owner) each, bound by the
        composition root after `check_config` (none by default)."""
        return ()

    def loss_options(self):
        """The bound options of `algo.policy_loss` (`algo.policy_loss_options.<loss>`, bound at load)."""
        return self.cfg.algo.policy_loss_options[self.cfg.algo.policy_loss]

    def build_policy_loss(self) -> PolicyLoss:
        """The configured loss, built once from its bound options."""
        return self.loss_class(self.loss_options())

    def __init__(self, cfg: OmniConfig, model, options=None, trains: bool = True):
        """`trains`: build the actor half (the loss and its state: an EMA, ...). Only where the
        weights are trained (an actor group, a Ray rank); the driver's family samples and scores
        (`build_family(..., trains=False)`) and holds no second copy of that state."""
        self.cfg = cfg
        self.model = model
        self.algo = cfg.algo
        self.trains = trains
        # A family built inside another (think_draw's image half) is handed the outer one's options.
        self.options = options if options is not None else cfg.algo.family_options
        # What the loss declares (reads_old_mean, pairwise) the rollout half may read; the loss itself
        # exists only in the actor half.
        self.loss_class = self.losses.get(cfg.algo.policy_loss)
        self.policy_loss = self.build_policy_loss() if trains else None

    # --- the rollout half -----------------------------------------------------------------
    def fit_prompts(self, items: list, what: str = "data.prompts") -> list:
        """The prompt items of `what` this family can run (all of them, unless the family has a
        length limit to enforce: the text family's `overlong_prompts` option)."""
        return list(items)

    @abstractmethod
    def rollout(self, engine, prompts: list, step: int, score: Optional[ScoreFn] = None) -> tuple[Any, list]:
        """The step's batch from `engine` and, with `score`, one reward future per sample
        (each sample handed to the scorer as soon as the engine completes it)."""

    @abstractmethod
    def reward_inputs(self, batch) -> tuple[Any, list[str], list[dict]]:
        """(samples, prompts, metadata): what the rewards score for a whole batch."""

    def rollout_metrics(self, batch) -> dict[str, float]:
        return {}

    @abstractmethod
    def validate(self, engine, items: list, step: int, rewards, output_dir: Path, logger) -> dict[str, float]:
        """Deterministic samples of `items`, scored, written to `output_dir/samples/`; `val/*` metrics."""

    # --- the actor half -------------------------------------------------------------------
    @property
    def reads_old_means(self) -> bool:
        """Whether the configured loss reads the behaviour policy's transition means, which only
        a forward under the behaviour weights gives (the rollout records log-probs only)."""
        return False

    @abstractmethod
    def num_chunks(self, batch) -> int:
        """Backward passes per micro-batch (a denoising step each; 1 for a whole response)."""

    @abstractmethod
    def behaviour_policy(self, batch, micro_batch_size: int) -> BehaviourPolicy:
        """Score `batch` under the current weights, without gradients."""

    @abstractmethod
    def loss(self, micro, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of chunk `chunk` of a micro-batch and its metrics (what the engine is handed)."""

    def train_items(self, batch):
        """What the update iterates over (`len`, `select`): the batch itself, or what the loss
        trains instead (the diffusion family's preference pairs for `diffusion_dpo`)."""
        return batch

    def after_optimizer_step(self) -> None:
        """Called after every optimizer step (the diffusion family's EMA for `diffusion_nft`)."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors of the actor half's own state that a checkpoint must carry (none by default)."""
        return {}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore `state_tensors` from a checkpoint (an empty dict: the checkpoint has none)."""


MODEL_FAMILIES: Registry[type[ModelFamily]] = Registry("model family")


def register_family(name: str):
    """Class decorator: register a `ModelFamily` for adapters whose `family` is `name`."""
    return MODEL_FAMILIES.register(name)


def build_family(cfg: OmniConfig, model, trains: bool = True) -> ModelFamily:
    """The family of `model`; `trains=False` builds the rollout half only (the driver's)."""
    return MODEL_FAMILIES.get(model.family).variant(cfg)(cfg, model, trains=trains)


def prompt_limits(cfg: OmniConfig) -> PromptLimitOptions:
    """How long the run's prompts may be: the model family's own limits where its options hold
    them (the text family's `max_prompt_tokens`, `overlong_prompts`), else the defaults (a
    diffusion model's prompts get the character bound only)."""
    options = cfg.algo.family_options
    return options if isinstance(options, PromptLimitOptions) else PromptLimitOptions()


def check_rollout_correction(cfg: OmniConfig) -> None:
    """`algo.rollout_correction_options` (bound at load): a level other than none needs the trainer's own
    old log-probs (a one-line ConfigError)."""
    options = cfg.algo.rollout_correction_options
    mode = cfg.algo.old_logprob_mode
    if options.level != "none" and mode == "bypass":
        raise ConfigError(
            f"algo.old_logprob_mode={mode!r}: expected auto or recompute with algo.rollout_correction_options.level="
            f"{options.level} (the correction weighs the trainer's recomputed old log-probs against the rollout's; "
            f"bypass uses the rollout's as the old ones, so every weight would be 1): set algo.old_logprob_mode=auto "
            f"or algo.rollout_correction_options.level=none")
