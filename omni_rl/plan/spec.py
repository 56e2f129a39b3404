"""What an adapter tells the planner: `PlanSpec`, registered per adapter in `PLAN_SPECS`.

The planner builds a recipe's model through the adapter's own weightless build when the
architecture folder holds every file that build reads (a tiny model, a user's snapshot). A
shipped `recipes/architectures/` folder holds only the configs that could be sourced (no
tokenizer vocabularies, not every encoder), so an adapter also says how to build its trained
network(s) alone (`load_trained`), and how to feed them one forward at the recipe's shapes
(`forward_inputs`; a text model is traced through its own `forward_logits` instead): that is all a trace needs, and neither step reads a tokenizer (prompt
lengths come from the recipe's options, not from tokenising text).

- `load_trained(adapter)`: set the adapter's trained module attributes (weightless, from
  `adapter.path`) on an adapter whose `__init__` did not run, so that its own
  `trainable_modules()` and `setup_trained_modules()` (LoRA, trainable selection, gradient
  checkpointing) apply to them exactly as in training;
- `forward_inputs(adapter, cfg, batch)`: {trained module name: keyword arguments} for one forward
  of `batch` rows (CFG doubling is the caller's: it passes twice the samples), tensors made in the
  current (fake) tensor mode;
- `modality`: "diffusion" (a denoiser), "text" (a decoder, traced through its `forward_logits`
  with a KV-cache step too) or another name (weights only without `forward_inputs`: speech);
- `text_positions(batch, length)`: for a text model, the `position_ids` its `forward_logits` takes
  for a plain text batch, where computing them from the tokens needs data-dependent shapes
  (multimodal rotary positions); None: the adapter computes them from the mask;
- `load_frozen(adapter)`: the frozen networks the stage holds beside what trains, built weightless
  from the folder's configs, where they can be (the Qwen3-Omni talker stage's thinker and
  code2wav); None: the plan lists the frozen encoders and decoders as not counted;
- `latent_numel(adapter, cfg)`: elements of one sample's latent, what a trajectory stores per
  denoising point; without it, the first tensor of a one-row forward (right where that tensor is
  the latent alone: not with condition tokens appended, or with two latent streams).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from omni_rl.registry import Registry


@dataclass(frozen=True)
class PlanSpec:
    load_trained: Callable[[Any], None]
    # None: the network is built and its weights planned, but no forward is traced (the plan says so).
    forward_inputs: Callable[[Any, Any, int], dict[str, dict[str, Any]]] | None = None
    modality: str = "diffusion"
    latent_numel: Callable[[Any, Any], int] | None = None
    text_positions: Callable[[int, int], Any] | None = None
    load_frozen: Callable[[Any], list] | None = None


PLAN_SPECS: Registry[PlanSpec] = Registry("plan spec")


def register_plan_spec(adapter: str, spec: PlanSpec) -> PlanSpec:
    return PLAN_SPECS.register(adapter, spec)


def prompt_tokens(cfg) -> int:
    """The prompt length the plan traces at: the adapter's `max_sequence_length` option (a
    fixed-length text encoding). One function so the option's home can move in one place."""
    return int(cfg.model.options.max_sequence_length)
