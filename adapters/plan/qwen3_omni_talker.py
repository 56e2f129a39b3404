"""The planner's view of `adapters/qwen3_omni_talker.py` (`omni_rl.plan.spec`): its network built
without weights, and the inputs of one traced forward."""
from __future__ import annotations

from omni_rl.models.registry import adapter_key
from omni_rl.plan.spec import PlanSpec, register_plan_spec

from adapters.plan.qwen3_omni import _plan_load_trained as _plan_load_thinker


def _plan_load_talker(adapter) -> None:
    """The talker (with its code predictor) alone from the checkpoint's `talker_config`: the
    trained module of `model.stage=talker` (the frozen thinker and code2wav: `_plan_frozen_talker`)."""
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerForConditionalGeneration

    from omni_rl.device import weightless_device

    config = AutoConfig.from_pretrained(adapter.path).talker_config
    config.spatial_merge_size = getattr(config, "spatial_merge_size", 2)
    with weightless_device():
        talker = Qwen3OmniMoeTalkerForConditionalGeneration(config)
    adapter.talker = adapter.model = talker.to(adapter.dtype)
    adapter.options = adapter.cfg.adapter_options


def _plan_code2wav(adapter):
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omni_rl.device import weightless_device

    with weightless_device():
        code2wav = Qwen3OmniMoeCode2Wav(AutoConfig.from_pretrained(adapter.path).code2wav_config)
    return code2wav.to(adapter.dtype)


def _plan_frozen_talker(adapter) -> list:
    """The talker stage's frozen networks: the whole thinker (it writes the answer the talker
    speaks) and code2wav, as `frozen_modules()` lists them."""
    talker = adapter.model
    _plan_load_thinker(adapter)  # sets adapter.model too: the trained module stays the talker
    adapter.model = talker
    return [adapter.thinker, _plan_code2wav(adapter)]


# Weights only: the frame-by-frame speech decoding (talker, then the code predictor's residual
# codebooks) has no traced forward yet; the planner traces modality "text" through forward_logits.
register_plan_spec(adapter_key("Qwen3OmniMoeForConditionalGeneration", "talker"),
                   PlanSpec(_plan_load_talker, modality="speech", load_frozen=_plan_frozen_talker))


def _plan_load_thinker_talker(adapter) -> None:
    """Both trained modules of `model.stage=thinker_talker`: the thinker (from `thinker_config`) and the talker."""
    _plan_load_thinker(adapter)
    adapter.thinker_trained = adapter.thinker
    _plan_load_talker(adapter)


register_plan_spec(adapter_key("Qwen3OmniMoeForConditionalGeneration", "thinker_talker"),
                   PlanSpec(_plan_load_thinker_talker, modality="speech", load_frozen=lambda adapter: [_plan_code2wav(adapter)]))
