"""Pure tensor maths of the RL algorithms: flow SDE step kernels, advantages, policy losses, KL.

Nothing here imports the rest of omni_rl except `omni_rl.registry`; each family is a registry
with one call signature, looked up by name from the config:

- `STEP_KERNELS` (`sde`, `cps`, `dance_sde`, `ode`): one denoising step, sampled or scored.
- `ADVANTAGE_ESTIMATORS` (`grpo`, `dr_grpo`, `rloo`): rewards -> per-sample advantages; each
  declares whether it needs groups of >= 2 samples (`needs_group`); their options
  (`AdvantageOptions`: std_mode, eps) are the recipe's `algo.advantage_options`.
- `DIFFUSION_LOSSES` (`flow_grpo`, `flow_dppo`, `grpo_guard`, in `policy_losses`) and
  `TOKEN_LOSSES` (`ppo_clip`, `dapo`, `gspo`, `cispo`, `sapo`, in `token_losses`): loss classes,
  each built once from its options (`Loss.Options`, a dataclass checked at construction; the
  recipe's `algo.loss_options`) and called with tensors only (`StepLossInput`, `TokenLossInput`)
  for (loss, metrics). Two registries, because a loss scores one kind of action (a denoising
  step, a token): each model family takes its losses from one (`ModelFamily.losses`), so a loss
  of the other kind fails at config load.
- `DIFFUSION_KL` (`flow_grpo_code`, `exact`): per-step KL to the reference policy.
- `distill`: on-policy distillation against a frozen teacher: the per-step Gaussian KL of a
  diffusion step (and `DISTILL_LOSSES`' `distill_kl`, the diffusion loss that is only that KL), and the token
  estimators (reward-style advantages, a direct loss, the exact chunked full-vocabulary KL).
- `FORWARD_LOSSES` (`diffusion_nft`, `diffusion_dpo`, in `forward_losses`): loss classes on
  clean latents noised again (no log-probs), called with a `ForwardLossInput`; the diffusion
  family accepts an `algo.policy_loss` of either registry and hands a forward-process loss to
  its variant, the `forward_process` family.

What a loss reads beyond the common tensors is a declared class attribute: `StepLoss.reads_old_mean`,
`ForwardLoss.reads` and `ForwardLoss.pairwise`.

`rollout_correction` (no registry) gives the truncated importance weights between the trainer's
old log-probs and the rollout engine's (`algo.rollout_correction.level`), which every policy loss applies.

`latent_streams` is the latents' type: a tensor, or `LatentStreams` for models that denoise
several latents (video and audio) in one forward, which the kernels step as one action.
"""
from omni_rl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    STD_MODES,
    AdvantageEstimator,
    AdvantageInput,
    dr_grpo_advantage,
    get_advantage_estimator,
    grpo_advantage,
    needs_group,
    register_advantage_estimator,
    rloo_advantage,
)
from omni_rl.algos.distill import (
    DISTILL_LOSSES,
    DistillKLLoss,
    diffusion_distill_kl,
    direct_distill_loss,
    distill_advantages,
    full_vocab_reverse_kl,
    token_reverse_kl,
)
from omni_rl.algos.flow_sde import (
    STEP_KERNELS,
    StepKernel,
    StepOutput,
    cps_step,
    dance_sde_step,
    expand_per_sample,
    gaussian_log_prob,
    get_step_kernel,
    mean_over_sample_dims,
    ode_step,
    per_sample,
    sde_step,
)
from omni_rl.algos.forward_losses import (
    FORWARD_LOSSES,
    DiffusionDPOLoss,
    DiffusionNFTLoss,
    ForwardLoss,
    ForwardLossInput,
    nft_optimality,
)
from omni_rl.algos.policy_losses import (
    DIFFUSION_KL,
    DIFFUSION_LOSSES,
    DiffusionKL,
    FlowDPPOLoss,
    FlowGRPOLoss,
    GRPOGuardLoss,
    PolicyLoss,
    StepLoss,
    StepLossInput,
    exact_kl,
    flow_grpo_code_kl,
    get_diffusion_kl,
    get_diffusion_loss,
    guard_log_ratio,
)
from omni_rl.algos.token_losses import (
    ALL_LOSS_AGG_MODES,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    SUM_NORM_MODE,
    TOKEN_LOSSES,
    CISPOLoss,
    DAPOLoss,
    GSPOLoss,
    PPOClipLoss,
    SAPOLoss,
    TokenLoss,
    TokenLossInput,
    aggregate,
    get_token_loss,
    sapo_gate,
    token_kl,
)

__all__ = [
    # flow_sde
    "StepOutput",
    "StepKernel",
    "STEP_KERNELS",
    "get_step_kernel",
    "sde_step",
    "cps_step",
    "dance_sde_step",
    "ode_step",
    "per_sample",
    "expand_per_sample",
    "mean_over_sample_dims",
    "gaussian_log_prob",
    # advantages
    "AdvantageInput",
    "AdvantageEstimator",
    "ADVANTAGE_ESTIMATORS",
    "STD_MODES",
    "get_advantage_estimator",
    "register_advantage_estimator",
    "needs_group",
    "grpo_advantage",
    "dr_grpo_advantage",
    "rloo_advantage",
    # policy losses and KL
    "PolicyLoss",
    "StepLoss",
    "StepLossInput",
    "DIFFUSION_LOSSES",
    "get_diffusion_loss",
    "FlowGRPOLoss",
    "FlowDPPOLoss",
    "GRPOGuardLoss",
    "guard_log_ratio",
    "DiffusionKL",
    "DIFFUSION_KL",
    "get_diffusion_kl",
    "flow_grpo_code_kl",
    "exact_kl",
    # on-policy distillation
    "DISTILL_LOSSES",
    "DistillKLLoss",
    "diffusion_distill_kl",
    "token_reverse_kl",
    "distill_advantages",
    "direct_distill_loss",
    "full_vocab_reverse_kl",
    # forward-process losses
    "ForwardLossInput",
    "ForwardLoss",
    "FORWARD_LOSSES",
    "DiffusionNFTLoss",
    "DiffusionDPOLoss",
    "nft_optimality",
    # token losses
    "TokenLoss",
    "TokenLossInput",
    "TOKEN_LOSSES",
    "get_token_loss",
    "LOSS_AGG_MODES",
    "SUM_NORM_MODE",
    "ALL_LOSS_AGG_MODES",
    "KL_ESTIMATORS",
    "aggregate",
    "token_kl",
    "sapo_gate",
    "PPOClipLoss",
    "DAPOLoss",
    "GSPOLoss",
    "CISPOLoss",
    "SAPOLoss",
]
