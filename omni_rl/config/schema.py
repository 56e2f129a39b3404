"""The configuration schema: typed dataclasses that hold every default.

YAML recipes and command-line overrides only change these values; no code elsewhere keeps a
default of its own (`cfg.get("x", default)` is not used). Batch sizes name their unit:
`prompts_per_step` prompts, each sampled `samples_per_prompt` times, trained in mini-batches
of `mini_batch_size` samples (one optimizer step each) made of forwards of
`micro_batch_size` samples.

Cross-field rules (an SDE window inside the step count, batch sizes that divide) live in
`omni_rl/config/validate.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class LoraConfig:
    """LoRA (PEFT) on the trainable module; `enabled: false` trains every parameter."""

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
    # Text tokens from the T5 encoder (SD3 family; diffusers' `max_sequence_length`). Without a
    # T5 encoder these are zero padding, so tiny models use a short one.
    max_sequence_length: int = 256
    gradient_checkpointing: bool = False
    # Wan2.2 A14B: the CFG scale of the low-noise expert (diffusers' `guidance_scale_2`); null =
    # rollout.guidance_scale. Rollout and training apply the same.
    guidance_scale_2: Optional[float] = None
    # LTX-2: the CFG scale of the audio stream (null = rollout.guidance_scale) and the
    # guidance rescale factor phi (0 = plain CFG). Rollout and training apply the same.
    audio_guidance_scale: Optional[float] = None
    guidance_rescale: float = 0.0
    # LTX-2: the pipeline's optional guidance terms, each one more transformer forward per step
    # (all off by default: plain CFG). Rollout and training apply the same.
    # Spatio-temporal guidance (STG, arXiv 2411.18664) scale of the video stream: x0 moves away
    # from a forward whose self-attention in `stg_blocks` is skipped (0 = off).
    stg_scale: float = 0.0
    # STG scale of the audio stream; null = stg_scale (0 turns it off for audio alone, where the
    # pipeline's call would read 0 as "unset").
    audio_stg_scale: Optional[float] = None
    # Zero-based transformer block indices whose self-attention STG perturbs; required when a STG
    # scale is > 0 (the pipeline suggests [28] for LTX-2.3, [29] for LTX-2.0).
    stg_blocks: list[int] = field(default_factory=list)
    # Modality-isolation guidance scale of the video stream: x0 moves away from a forward with
    # the audio<->video cross-attention switched off (1 = off).
    modality_scale: float = 1.0
    # Its audio stream scale; null = modality_scale.
    audio_modality_scale: Optional[float] = None
    # The guidance rescale factor of the audio stream; null = guidance_rescale.
    audio_guidance_rescale: Optional[float] = None
    # Editing models (Qwen-Image-Edit): the [height, width] in px the source image is resized
    # to and encoded at (through the VAE and the vision-language encoder); null = the output's
    # size (rollout.height, rollout.width). Rollout and training see the same encoding.
    condition_image_size: Optional[list[int]] = None
    # BAGEL: the shift s of its schedule t' = s t / (1 + (s - 1) t) (the official inferencer's 3.0).
    timestep_shift: float = 3.0
    # BAGEL: text CFG applies to the samples whose sigma lies in (lo, hi]; the others take the
    # conditional velocity (the official `cfg_interval`, [0.4, 1.0] there); null = every step.
    cfg_interval: Optional[list[float]] = None
    # BAGEL: the guided velocity is rescaled per sample to the conditional one's norm, the scale
    # clamped to [cfg_renorm_min, 1] (the official "global" renorm; 1.0 turns it off).
    cfg_renorm_min: float = 0.0
    # Image CFG of editing models (BAGEL's `cfg_img_scale`); 1 = off. Text-to-image refuses > 1.
    image_guidance_scale: float = 1.0
    # Omni models: keep the vision / audio encoders frozen (LoRA or not).
    freeze_vision_tower: bool = True
    freeze_audio_tower: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RolloutConfig:
    """How samples are generated (the behaviour policy)."""

    backend: str = "native"
    height: int = 32
    width: int = 32
    num_steps: int = 6
    guidance_scale: float = 4.5
    negative_prompt: str = ""
    # Frames per sample: 1 = an image; a video model takes its own counts (Wan2.2: 4k+1), and
    # image rewards then need `reward.rewards[i].video_frames`.
    num_frames: int = 1
    # Playback rate of the frames: the saved videos', and the model's where it is conditioned on it.
    fps: float = 16.0
    # Step kernel used inside the SDE window: sde | cps | dance_sde | ode.
    kernel: str = "sde"
    noise_level: float = 0.7
    # Steps that are stochastic (and trained) per sample; 0 = every step (Flow-GRPO).
    sde_window_size: int = 0
    # [lo, hi): the window's first step is drawn per sample from lo .. hi - sde_window_size.
    # null = [0, num_steps).
    sde_window_range: Optional[list[int]] = None
    # How the window moves over training (`omni_rl/rollout/sde_window.py`; MixGRPO): "fixed"
    # (each sample draws its start from its seed, in sde_window_range), "progressive" (one
    # window per training step, sliding from lo by sde_window_shift steps every sde_window_tau
    # training steps up to hi - size), "random" (one window per training step, drawn from
    # (trainer.seed, step)), "decay" (one per step at lo, its size shrinking by one every
    # sde_window_tau training steps down to sde_window_min_size). Needs sde_window_size > 0
    # unless fixed.
    sde_window_schedule: str = "fixed"
    sde_window_shift: int = 1  # progressive only
    sde_window_tau: int = 1  # progressive and decay
    sde_window_min_size: int = 1  # decay only
    # Share the initial noise within a prompt's group (DanceGRPO).
    same_noise_in_group: bool = False
    # Request-level batching: at most this many samples per transformer forward ...
    max_num_seqs: int = 32
    # ... and how long an idle engine waits for more requests before it starts a batch.
    max_wait_ms: float = 5.0
    # A rollout that takes longer than this fails the step instead of hanging.
    timeout_s: float = 1800.0
    # --- rollout.backend=server: the native engine in a process (and Python) of its own ---
    # The interpreter that runs the server; null = this one (sys.executable). With
    # rollout.backend=vllm_omni or vllm, a Python named here runs that engine behind the server
    # (the CUDA image: /opt/vllm-omni/bin/python); null runs it in this process.
    python: Optional[str] = None
    # A server call (or, while sampling, its health check) that gets no answer within this long
    # fails the step with an error naming the server; so does a server that exits.
    server_timeout_s: float = 60.0
    # How long the server may take to build its model and answer its first health check.
    server_startup_timeout_s: float = 600.0
    # --- rollout.backend=vllm_omni (diffusion) / vllm (text): GPU engines, CUDA only ---
    # Share of the GPU's memory vLLM may take for weights and its KV cache (text); leave room
    # for the trainer when both share the GPU.
    vllm_gpu_memory_utilization: float = 0.5
    # No CUDA graphs / torch.compile: slower sampling, quicker start.
    vllm_enforce_eager: bool = False
    # Start with vLLM's sleep-mode allocator, so the engine's sleep() / wake() can free the GPU.
    vllm_sleep_mode: bool = True
    # --- text / omni models (autoregressive) ---
    temperature: float = 1.0
    top_p: float = 1.0
    # Longer responses are truncated and counted in response/clip_ratio.
    max_new_tokens: int = 256
    # Extra stop tokens besides the tokenizer's end-of-turn token(s).
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class AlgoConfig:
    """Advantage estimator, policy loss and their coefficients."""

    advantage: str = "grpo"
    # grpo's normaliser: "group" (per-prompt std), "global" (batch std; Flow-GRPO) or "none".
    std_mode: str = "global"
    adv_eps: float = 1.0e-4
    policy_loss: str = "flow_grpo"
    clip_range: float = 1.0e-4
    # Upper clip; null = clip_range (symmetric).
    clip_range_high: Optional[float] = None
    adv_clip_max: float = 5.0
    # Flow-DPPO's divergence threshold tau.
    kl_threshold: float = 1.0e-5
    # KL to the reference policy (the base model: LoRA disabled); 0 skips the reference forward.
    kl_coef: float = 0.0
    # "flow_grpo_code" (Flow-GRPO's code) or "exact" (the per-step Gaussian KL).
    kl_form: str = "flow_grpo_code"
    ppo_epochs: int = 1
    # DanceGRPO: each sample trains a random subset of this fraction of its stochastic steps
    # (at least one), drawn from the sample's own seed so a resumed run draws the same; 1 = all.
    timestep_fraction: float = 1.0
    # Token losses: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    # (Dr.GRPO: the sum over every valid token / (sequences * loss_scale_factor)).
    loss_agg_mode: str = "token-mean"
    # The constant of seq-mean-token-sum-norm; null = rollout.max_new_tokens (Dr.GRPO divides by
    # the response length budget). Set only with that mode.
    loss_scale_factor: Optional[float] = None
    # Dual-clip PPO for ppo_clip / dapo: a token with a negative advantage A loses at most
    # -A * clip_ratio_c (> 1). null = off; verl always applies it, with 3.0 (its DAPO scripts: 10).
    clip_ratio_c: Optional[float] = None
    # Token KL to the reference: k1 (log-ratio) or k3 (Schulman's unbiased, non-negative).
    kl_estimator: str = "k3"
    # Clamp each token's KL estimate to [-kl_clamp, kl_clamp]; null = no clamp (verl clamps k3 at 10).
    kl_clamp: Optional[float] = None
    # SAPO's gate temperatures for positive / negative advantages.
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    # Where the ratio's old log-probs come from. "auto": the rollout's own where they are the
    # actor's bit for bit (same model in this process, fp32, current weights), otherwise a
    # recompute by the actor before the update; "recompute": always the actor's (ratio exactly 1
    # on the first mini-batch); "bypass": always the rollout's (skips that forward, accepts the
    # numerical gap of another engine). Losses that read the old transition means still get them.
    old_logprob_mode: str = "auto"
    # Every this many steps (from step 1) the actor scores the whole batch even when the rollout's
    # log-probs are used, and rollout_corr/* covers every sample; 0 = never (the update still
    # measures the gap on its first mini-batch).
    logprob_check_every: int = 10
    # Rollout correction (truncated importance sampling, TIS; Yao et al. 2025): each action's policy
    # loss is multiplied by w = min(exp(old_logp - rollout_logp), rollout_is_cap), the gap between
    # the trainer's old log-probs and the rollout engine's (other kernels and precision: vLLM, a
    # rollout server, Ray workers' copies). "none" = off; text: "token" (per token) or "sequence"
    # (the response's product of ratios); diffusion: "step" (per denoising step) or "sequence" (over
    # the sample's trained steps). Needs the trainer's own old log-probs (old_logprob_mode auto or
    # recompute); where they are the rollout's (auto, the native in-process engine) w is exactly 1
    # and nothing is computed. Metrics: rollout_corr/is_weight_mean, _max, is_clipped_fraction.
    rollout_is: str = "none"
    # C, >= 1 (Yao et al.: 2).
    rollout_is_cap: float = 2.0
    # "truncate" clamps w at C; "mask" sets w to 0 where it exceeds C (the action leaves the loss).
    rollout_is_mode: str = "truncate"
    # --- think-then-draw models (family think_draw: a written plan, then the image) ---
    # The token loss of the plan's tokens (a TOKEN_LOSSES name); algo.policy_loss trains the
    # image's denoising steps. Both from the one reward, in the same update.
    plan_policy_loss: str = "ppo_clip"
    # The plan tokens' ratio clip, [1 - c, 1 + c] (PPO's 0.2; the image steps keep clip_range).
    plan_clip_range: float = 0.2
    # The plan's loss is this times its token loss, one chunk beside the K image-step chunks
    # (each chunk weighs 1 / (1 + K) in a micro-batch's gradient).
    plan_loss_weight: float = 1.0
    # --- forward-process losses (policy_loss diffusion_nft / diffusion_dpo) ---
    # They train on the rollout's final clean latents noised again (any rollout.kernel, ode
    # included; no log-probs): each sample (each pair) draws this many (t, eps), one backward
    # each, seeded by the sample's seed and the draw's index.
    forward_num_timesteps: int = 2
    # How t is drawn: "uniform" in (0, 1) or "logit_normal" (sigmoid of a standard normal, SD3's
    # training distribution); both kept in [1e-3, 1 - 1e-3].
    forward_timestep_sampling: str = "uniform"
    # DiffusionNFT (arXiv 2509.16117): the guidance strength b of the implicit policies
    # v+ = b v + (1 - b) v_old, v- = (1 + b) v_old - b v (the paper: 1).
    nft_beta: float = 1.0
    # The old policy v_old is an EMA of the trainable weights, ema <- d ema + (1 - d) theta after
    # every optimizer step; d in [0, 1) (0: v_old is the weights as of the last optimizer step).
    nft_ema_decay: float = 0.9
    # "velocity": mean_d (v+- - u)^2; "adaptive_x0": the x0-space error of x_t - t v+-, divided
    # per sample by the current policy's mean |x0 error| (no gradient through it).
    nft_weighting: str = "velocity"
    # Diffusion-DPO (arXiv 2311.12908) on flow targets: beta of -log sigmoid(-beta/2 [...]), with
    # per-dimension mean errors (Wallace et al. use 5000 for SD1.5 with theirs).
    dpo_beta: float = 5000.0


@dataclass
class RewardItemConfig:
    """One named reward and its weight in the total."""

    name: str = "jpeg_compressibility"
    weight: float = 1.0
    # A required reward that fails fails the step; an optional one is logged and skipped.
    required: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)
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
    # Score samples in micro-batches while the rollout engine is still producing the rest.
    overlap_rollout: bool = True
    # Micro-batches: at most this many samples per reward call ...
    max_batch_size: int = 32
    # ... and how long a partial micro-batch waits for more samples.
    max_wait_ms: float = 20.0
    # Scoring that takes longer than this fails the step instead of hanging.
    timeout_s: float = 1800.0
    # Reward workers on Ray (0 = score in the trainer process): each holds the reward models;
    # micro-batches go to them round robin, several at once.
    num_workers: int = 0
    worker_num_cpus: float = 1.0
    worker_num_gpus: float = 0.0


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
    # of a rollout; needs algo.policy_loss=diffusion_dpo, and data.prompts / prompt_file null
    # (the pairs' prompts are the training prompts, and validation's unless data.val_* is set).
    preference_file: Optional[str] = None
    # Image and audio paths inside prompt and preference files stay inside the file's folder
    # (no absolute paths, `..` or symlinks out: rewards may upload images to other machines);
    # true reads them anywhere, said once at load (omni_rl/data/dataset_folder.py).
    allow_paths_outside: bool = False
    shuffle: bool = True
    # Text models: the longest prompt in tokens, chat template included. null = the model's
    # context (its config's max_position_embeddings, else the tokenizer's model_max_length) less
    # rollout.max_new_tokens; no check when the model states neither. Every model: a prompt's
    # characters are bounded before any tokenizer sees it, by 256 x this, or 200,000 characters
    # when null (omni_rl/data/prompt_chars.py).
    max_prompt_tokens: Optional[int] = None
    # A prompt over that limit (or the character bound), found when the prompts load: "error"
    # stops the run naming it; "truncate" cuts the start of its last user message (its end and
    # the template stay); "drop" leaves it out. Truncated and dropped prompts are counted in one
    # warning line.
    overlong_prompts: str = "error"


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
    # Ray resource pool: nnodes x devices_per_node workers (GPUs / NPUs, or CPUs on a CPU machine).
    nnodes: int = 1
    devices_per_node: int = 1
    # null starts a local Ray; an address ("auto", "ray://host:10001", "host:6379") joins a cluster.
    ray_address: Optional[str] = None
    # A worker call (a rollout shard, an update) that takes longer than this fails the run with
    # the worker named, instead of hanging; a dead worker fails it at once.
    worker_timeout_s: float = 600.0
    # Starting the workers (placement, process start, imports, the process group) has its own
    # deadline: on a busy machine or a cold cluster it takes far longer than one call.
    worker_startup_timeout_s: float = 300.0
    # FSDP2 CPUOffloadPolicy: sharded parameters (and their gradients) live in host memory.
    param_offload: bool = False
    # Keep the optimizer's state in host memory between steps (moved to the device to step).
    optimizer_offload: bool = False
    # Full-weight sync to the rollout engine moves tensors in buckets of at most this many MiB.
    weight_sync_bucket_mb: int = 512
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    log_every: int = 1
    progress_bar: bool = True
    # Validation: deterministic sampling (noise 0) with more steps, a PNG grid each time.
    val_every: int = 10
    val_num_steps: int = 12
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
    # updates), "async" (a background producer keeps up to trainer.max_staleness steps of groups
    # ready; each update takes the oldest).
    pipeline: str = "on_policy"
    # The most weight versions a sample may lag the weights it trains (0 = on-policy). Checked on
    # every sample before the loss; one_step_off needs >= 1 (its samples are one version old).
    max_staleness: int = 1
    # What happens to a group staler than trainer.max_staleness: "drop" (counted, the next ready
    # groups take its place) or "reroll" (counted, sampled again with the current weights).
    stale_policy: str = "drop"
    wandb_project: str = "omni-rl"


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
