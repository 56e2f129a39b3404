"""The override lists that the trainer tests share: a tiny run that takes seconds, writes its
metrics to metrics.jsonl only and does not validate.

    load_config([*TINY_SD3, f"trainer.output_dir={tmp_path}", "trainer.total_steps=3"])

A test adds its own overrides after these; a later `key=value` wins over an earlier one.
"""

# No validation, no progress bar, metrics only to metrics.jsonl.
QUIET = ["trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]"]

# The default recipe (tiny_sd3_flowgrpo: FlowGRPO LoRA on the random tiny SD3) cut down:
# 2 prompts x 4 samples a step, 4 denoising steps of which 2 in [0, 3] are trained,
# mini-batches of 4 in micro-batches of 2.
TINY_SD3 = [
    "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2", "rollout.sampling_options.num_steps=4", "rollout.sampling_options.sde_window_size=2",
    "rollout.sampling_options.sde_window_range=[0,3]", *QUIET,
]

# GRPO on the tiny Qwen3 with its recipe's sizes.
TINY_QWEN3 = ["recipe=tiny_qwen3_grpo", *QUIET]

# The tiny talker recipe (tiny:qwen3_omni_talker speaking for audio_loudness) cut down: 2 prompts
# x 4 samples, utterances of at most 6 frames, one mini- and micro-batch of 8.
TINY_TALKER = [
    "recipe=tiny_qwen3_omni_talker_grpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4",
    "trainer.mini_batch_size=8", "trainer.micro_batch_size=8", "rollout.sampling_options.max_frames=6", *QUIET,
]
