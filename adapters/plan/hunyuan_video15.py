"""The planner's view of `adapters/hunyuan_video15.py` (`omni_rl.plan.spec`): its network built
without weights; no forward is traced."""
from __future__ import annotations

from omni_rl.plan.spec import PlanSpec, register_plan_spec


def _plan_load_trained(adapter) -> None:
    from diffusers import HunyuanVideo15Transformer3DModel

    adapter.transformer = adapter.load_pretrained(HunyuanVideo15Transformer3DModel, "transformer")


# No forward is traced: the transformer gathers each sample's valid text tokens with boolean masks
# and branches on `all(image_embeds == 0)`, values a fake-tensor trace does not have. The plan
# counts the transformer's weights, gradients and optimizer state, and says it traced nothing.
register_plan_spec("HunyuanVideo15Pipeline", PlanSpec(_plan_load_trained, None))
