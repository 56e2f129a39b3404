"""What an adapter tells the planner: `PlanSpec`, registered per adapter in `PLAN_SPECS`.

A shipped `recipes/architectures/` folder holds only configs (no tokenizer vocabularies, not
every encoder), so an adapter says how to build its trained network(s) alone, weightless
(`load_trained`, after which its own `trainable_modules()` and `setup_trained_modules()` apply as
in training), and how to feed them one forward at the recipe's shapes (`forward_inputs`; a text
model is traced through its `forward_logits`, with `text_positions` where its positions need
data-dependent shapes). Optional: `load_frozen` (frozen networks to count beside), `latent_numel`
(one sample's latent size), `modality`. No step reads a tokenizer.
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
    return int(cfg.model.adapter_options.max_sequence_length)
