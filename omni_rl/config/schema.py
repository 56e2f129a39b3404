"""The configuration schema: typed dataclasses that hold every default.

YAML recipes and command-line overrides only change these values; no code elsewhere keeps a
default of its own. A component's own knobs are its options dataclass (`omni_rl.config.options`), set in its block:
a mapping in the recipe that `omni_rl.compose` binds once at load and replaces with the instance.
Every block is named `<kind>_options`, kind being the kind of component it configures (docs/recipes.md).
Batch sizes name their unit (`prompts_per_step` prompts x `samples_per_prompt`, mini-batches
and micro-batches of samples). Cross-field rules live in `omni_rl/config/validate.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omni_rl.option import ComponentOptions


@dataclass
class LoraConfig(ComponentOptions):
    """LoRA (PEFT) on the trainable module; `enabled: false` trains every parameter. An options
    block too where a component nests one (a prompt writer's `lora`)."""

    enabled: bool = True
    rank: int = 8
    alpha: float = 16.0
    # Module names to adapt; null takes the adapter's own default (attention projections).
    target_modules: Optional[list[str]] = None
    # "gaussian" (diffusers' training scripts) or "default" (Kaiming A, zero B): both start at
    # a zero delta, so step 0 is the base model.
    init: str = "gaussian"


@dataclass
class ModelConfig:
    """Which model to load and how."""

    # Registered adapter name: the diffusers pipeline / transformers architecture class name.
    adapter: str = "StableDiffusion3Pipeline"
    # For models with several stages (an omni model's `thinker`), the one to train.
    stage: Optional[str] = None
    # A local folder, a hub id, or `tiny:NAME` (a tiny random-weight model built once, saved
    # with save_pretrained and then loaded back through the same code as real weights).
    path: str = "tiny:sd3"
    revision: Optional[str] = None
    # Weights' dtype for the forward passes; the SDE step maths always runs in float32.
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    # The adapter's own options (its `options_class`: LTX-2's guidance terms, BAGEL's
    # cfg_interval, an editing model's condition_image_size, ...), checked at load;
    # `python main_omni.py --options model.adapter=NAME` lists them.
    adapter_options: dict[str, Any] = field(default_factory=dict)
    lora: LoraConfig = field(default_factory=LoraConfig)
    # Compilation of the trained modules for rollout and training (`omni_rl.models.compile.CompileOptions`:
    # enabled, backend, mode, regional, dynamic, cache_dir), checked at load; off by default.
    compile_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutConfig:
    """How samples are generated (the behaviour policy)."""

    backend: str = "native"
    # How the model family samples (its `Sampling` options, `omni_rl.families.sampling`): a diffusion
    # model's height, width, num_steps, guidance_scale, kernel, SDE window...; a text model's
    # temperature, top_p, max_new_tokens, stop_token_ids. Bound at load to the adapter's family's
    # class; `python main_omni.py --options model.family=NAME` lists them.
    sampling_options: dict[str, Any] = field(default_factory=dict)
    # Request-level batching: at most this many samples per transformer forward.
    max_num_seqs: int = 32
    # A rollout that takes longer than this fails the step instead of hanging.
    timeout_s: float = 1800.0
    # The backend's own options (native's max_wait_ms and trajectory_device, server's python and timeouts, vLLM's
    # gpu_memory_utilization, ...), checked at load; `--options rollout.backend=NAME` lists them.
    backend_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class AlgoConfig:
    """Advantage estimator, policy loss, and what every run's update reads. The estimator's,
    the loss's and the model family's own knobs are theirs, set in their blocks and checked at
    load (`python main_omni.py --options algo.policy_loss=NAME` lists a loss's)."""

    advantage: str = "grpo"
    # The estimator's options (`algos.advantages.AdvantageOptions`: std_mode, eps).
    advantage_options: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "flow_grpo"
    # The loss's options (its `Options` dataclass: clip ranges, adv_clip_max, flow_dppo's
    # kl_threshold, the token losses' loss_agg_mode / kl_estimator / ..., DiffusionNFT's beta).
    policy_loss_options: dict[str, Any] = field(default_factory=dict)
    # The model family's options (its `Options`: diffusion's timestep_fraction, kl_form,
    # same_noise_in_group, val_num_steps and forward-process draws; think_draw's plan_policy_loss,
    # plan_loss_options, plan_loss_weight; autoregressive's max_prompt_tokens, overlong_prompts,
    # routing_replay, teachers, agent_options). How a family samples is rollout.sampling_options.
    family_options: dict[str, Any] = field(default_factory=dict)
    # KL to the reference policy (the base model: LoRA disabled); 0 skips the reference forward.
    kl_coef: float = 0.0
    ppo_epochs: int = 1
    # Where the ratio's old log-probs come from. "auto": the rollout's own where they are the
    # actor's (same model in this process, fp32, current weights: bit for bit in the same batch
    # shapes, else within float32 rounding, as BLAS rounds by shape and CPU), otherwise a
    # recompute by the actor before the update; "recompute": always the actor's (ratio exactly 1
    # on the first mini-batch); "bypass": always the rollout's (skips that forward, accepts the
    # numerical gap of another engine). Losses that read the old transition means still get them.
    old_logprob_mode: str = "auto"
    # Every this many steps (from step 1) the actor scores the whole batch even when the rollout's
    # log-probs are used, and rollout_corr/* covers every sample; 0 = never (the update still
    # measures the gap on its first mini-batch: actor/first_minibatch_logprob_abs_diff_*).
    logprob_check_every: int = 10
    # Rollout correction (truncated importance sampling, TIS; Yao et al. 2025): each action's policy
    # loss weighed by min(exp(old_logp - rollout_logp), cap); its options
    # (`algos.rollout_correction.RolloutCorrectionOptions`: level, cap, mode), checked at load.
    rollout_correction_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardItemConfig:
    """One named reward and its weight in the total."""

    name: str = "jpeg_compressibility"
    weight: float = 1.0
    # A required reward that fails fails the step; an optional one is logged and skipped.
    required: bool = True
    reward_options: dict[str, Any] = field(default_factory=dict)
    # An image reward on video scores this many evenly spaced frames of each video (first and
    # last included) and averages them; null = not given video. Not for rewards that score
    # video themselves.
    video_frames: Optional[int] = None


@dataclass
class RewardConfig:
    rewards: list[RewardItemConfig] = field(default_factory=lambda: [RewardItemConfig()])
    # Validation scores with these instead; null = the training rewards. For a shaped training
    # reward judged by the metric it stands for: train on partial credit, validate on success.
    # Scored in the trainer process (never on reward workers).
    val_rewards: Optional[list[RewardItemConfig]] = None
    # Score samples in micro-batches while the rollout engine is still producing the rest (true),
    # or each batch after its rollout, in the thread that waited for it (false). null: false in a
    # one-process on-policy CPU run with the native engine (one computing thread), else true
    # (omni_rl/trainer/reward_overlap.py says why).
    overlap_rollout: Optional[bool] = None
    # Micro-batches: at most this many samples per reward call ...
    max_batch_size: int = 32
    # ... and how long a partial micro-batch waits for more samples.
    max_wait_ms: float = 20.0
    # Scoring that takes longer than this fails the step instead of hanging.
    timeout_s: float = 1800.0
    # Reward workers on Ray (`omni_rl.workers.reward_worker.RewardWorkerOptions`: num_workers,
    # 0 = score in the trainer process; num_cpus, num_gpus each), checked at load.
    worker_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """Training and validation prompts: inline lists or a file (.txt one per line, .jsonl)."""

    prompts: Optional[list[str]] = None
    prompt_file: Optional[str] = None
    val_prompts: Optional[list[str]] = None
    val_prompt_file: Optional[str] = None
    # Offline Diffusion-DPO: a JSONL file of preference pairs, one a row: {"prompt", "chosen",
    # "rejected"} with image paths relative to the file (omni_rl/data/preference_file.py). Each
    # step then trains trainer.prompts_per_step of its pairs (trainer.samples_per_prompt 1) instead
    # of a rollout; needs trainer.pipeline=offline_pairs, algo.policy_loss=diffusion_dpo, and data.prompts / prompt_file null
    # (the pairs' prompts are the training prompts, and validation's unless data.val_* is set).
    preference_file: Optional[str] = None
    # Image and audio paths inside prompt and preference files stay inside the file's folder
    # (no absolute paths, `..` or symlinks out: rewards may upload images to other machines);
    # true reads them anywhere, said once at load (omni_rl/data/dataset_folder.py).
    allow_paths_outside: bool = False
    shuffle: bool = True


@dataclass
class OptimConfig:
    lr: float = 3.0e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 1.0e-4
    eps: float = 1.0e-8
    max_grad_norm: float = 1.0


@dataclass
class TrainerConfig:
    """The loop: sizes, schedule, outputs."""

    total_steps: int = 40
    prompts_per_step: int = 4
    samples_per_prompt: int = 8
    mini_batch_size: int = 16
    micro_batch_size: int = 8
    seed: int = 42
    # The run's folder, held by one run at a time (a lock file, dropped when the process ends).
    # A folder that holds another run (metrics.jsonl, checkpoints/, lora/ or model/) is refused
    # unless trainer.resume continues it or trainer.overwrite is true.
    output_dir: str = "outputs/run"
    # Start afresh in an output_dir that holds another run: its outputs are first moved to a
    # sibling folder OUTPUT.replaced-DATE-TIME (moved, not deleted; remove it when not needed).
    overwrite: bool = False
    # "auto" picks cuda, then npu, then cpu.
    device: str = "auto"
    # The ActorGroup (a registered backend): "local", one process; "ray", a group of Ray workers
    # (one hybrid worker per device: actor + rollout + reference), the batch split across ranks.
    backend: str = "local"
    # The training engine: "local" (one process) or "fsdp2" (sharded); null = the backend's own
    # (local for backend=local, fsdp2 for backend=ray).
    engine: Optional[str] = None
    # The backend's own options (ray: nnodes, devices_per_node, ray_address, worker timeouts)
    # and the engine's (fsdp2: param_offload, optimizer_offload), checked at load;
    # `--options trainer.backend=NAME` / `trainer.engine=NAME` lists them.
    backend_options: dict[str, Any] = field(default_factory=dict)
    engine_options: dict[str, Any] = field(default_factory=dict)
    # Full-weight sync to the rollout engine moves tensors in buckets of at most this many MiB.
    weight_sync_bucket_mb: int = 512
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    log_every: int = 1
    # The sinks', the progress bar's and the held-out alarm's options (`logging.sinks.LoggerOptions`:
    # progress_bar, wandb_project, alarm_*), checked at load.
    logger_options: dict[str, Any] = field(default_factory=dict)
    # Validation: deterministic samples (a diffusion model's: ODE, noise 0, the diffusion family's
    # `val_num_steps`), a PNG grid each time.
    val_every: int = 10
    val_num_prompts: int = 4
    val_samples_per_prompt: int = 2
    val_seed: int = 1234
    # Full checkpoints (weights, optimizer, RNG, step); 0 = only at the end.
    save_every: int = 0
    keep_last_checkpoints: int = 2
    # A checkpoint folder (or an output_dir, meaning its latest checkpoint) to continue from.
    resume: Optional[str] = None
    # How rollouts overlap updates (`omni_rl/trainer/pipeline.py`): "on_policy" (each step samples
    # with the weights it then updates), "one_step_off" (step t+1's rollout runs while step t
    # updates), "async" (a background producer keeps up to max_staleness steps of groups ready;
    # each update takes the oldest), "offline_pairs" (no rollout: data.preference_file's pairs).
    pipeline: str = "on_policy"
    # The pipeline's own options (one_step_off / async: max_staleness, stale_policy), checked at
    # load; `--options trainer.pipeline=NAME` lists them.
    pipeline_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class OmniConfig:
    """The whole job. `recipe` is filled with the recipe's name when it is loaded."""

    # The recipe when none is named in code (`load_config`); the command line's default is the
    # demo (`omni_rl.cli.DEMO_RECIPE`).
    recipe: str = "tiny_sd3_flowgrpo"
    # Extra modules to import so that their adapters / rewards register themselves.
    plugins: list[str] = field(default_factory=list)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
