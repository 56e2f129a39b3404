"""`tiny:qwen3_omni` builds a random-weight Qwen3-Omni: a 2-layer MoE thinker (hidden 32, 4
experts, top-2) with a 2-block vision tower (patch 8) and a 1-layer audio tower (16 mel bins),
plus a 1-layer talker, code predictor and code2wav (so stripping is exercised), and a processor:
Qwen2-VL image/video processors, a Whisper feature extractor and the byte-level tokenizer of
`adapters/qwen3.py` with the image/audio/video placeholder and start/end tokens. Its output layer
is drawn wider than transformers' init (std 0.5) so the random policy has preferences RL can move.
The builder of the adapter in `adapters/qwen3_omni.py`."""
from __future__ import annotations

from pathlib import Path

import torch

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files

from adapters.tiny.qwen3 import TOOL_CALLS_AND_END, TOOLS_SYSTEM_TURN, byte_level_vocab


# ChatML with content parts (an image or audio part is the processor's placeholder run), and
# Qwen3's tool format as the real Qwen3-Omni template has it: the tools' JSON schemas in a system
# turn, an assistant's `tool_calls` as <tool_call> JSON, consecutive tool answers in one user turn
# each inside <tool_response></tool_response> (a tool answer's image parts included). Without
# tools or tool turns it renders what it rendered before they were added.
_TINY_CONTENT = (
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
)
TINY_CHAT_TEMPLATE = (
    TOOLS_SYSTEM_TURN +
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and tools %}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n" + _TINY_CONTENT + "\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n" + _TINY_CONTENT +
    TOOL_CALLS_AND_END +
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The processor reads these tokenizer attributes (Qwen3-Omni's own token strings).
TINY_MEDIA_TOKENS = {
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
}


@register_tiny_model("qwen3_omni")
def build_tiny_qwen3_omni(folder: Path) -> None:
    build_tiny_omni(folder)


def build_tiny_omni(folder: Path, talker_changes: dict | None = None, code2wav_changes: dict | None = None,
                    tts_tokens: dict | None = None, finish=None) -> None:
    """Write a tiny random Qwen3-Omni into `folder`: the thinker of `tiny:qwen3_omni`, its talker
    and code2wav configs updated with `*_changes` (top-level keys replaced), the tts_* token ids
    of `tts_tokens` ({"tts_bos_token_id": "<|audio_start|>", ...}: tokens of the tiny tokenizer;
    default: the pad token for all three), and `finish(model)` run on the built model before it
    is saved (after the thinker's wider output layer is drawn). With no changes it is
    `tiny:qwen3_omni`, draw for draw."""
    from transformers import (
        Qwen2Tokenizer, Qwen2VLImageProcessor, Qwen2VLVideoProcessor, Qwen3OmniMoeConfig,
        Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor, WhisperFeatureExtractor,
    )

    folder = Path(folder)
    torch.manual_seed(0)
    with bpe_files(byte_level_vocab()) as (vocab, merges):
        tokenizer = Qwen2Tokenizer(
            str(vocab), str(merges), unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
            extra_special_tokens=dict(TINY_MEDIA_TOKENS),
        )
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|im_start|>", *TINY_MEDIA_TOKENS.values()]}, replace_extra_special_tokens=False
    )
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in TINY_MEDIA_TOKENS.items()}
    # Images of 32..64 px: patch 8, merged 2x2, so a 32 px square is 4 tokens.
    image_kwargs = dict(
        patch_size=8, temporal_patch_size=2, merge_size=2, size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64}
    )
    processor = Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(**image_kwargs),
        video_processor=Qwen2VLVideoProcessor(**image_kwargs),
        feature_extractor=WhisperFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=160, chunk_length=2),
        tokenizer=tokenizer,
        chat_template=TINY_CHAT_TEMPLATE,
    )
    hidden = 32
    media_ids = dict(
        audio_token_id=ids["audio_token"], image_token_id=ids["image_token"], video_token_id=ids["video_token"],
        audio_start_token_id=ids["audio_bos_token"], vision_start_token_id=ids["vision_bos_token"],
    )
    thinker = dict(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=4,
            num_experts_per_tok=2, max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            # head_dim 8 -> 4 rotary frequencies: 2 for time, 1 for height, 1 for width.
            rope_parameters={"rope_type": "default", "rope_theta": 1.0e6, "mrope_section": [2, 1, 1]},
        ),
        vision_config=dict(
            depth=2, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=8, spatial_merge_size=2,
            temporal_patch_size=2, out_hidden_size=hidden, num_position_embeddings=16, deepstack_visual_indexes=[0],
        ),
        audio_config=dict(
            num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
            output_dim=hidden, downsample_hidden_size=8, max_source_positions=200, n_window=50, n_window_infer=100,
        ),
        position_id_per_seconds=25,
        **media_ids,
    )
    talker = dict(
        text_config=dict(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1,
            # Read by the talker's shared expert but missing from its config class.
            shared_expert_intermediate_size=16,
        ),
        code_predictor_config=dict(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, num_code_groups=2,
        ),
        num_code_groups=2, thinker_hidden_size=hidden, accept_hidden_layer=1, codec_eos_token_id=62,
        codec_nothink_id=59, codec_think_bos_id=58, codec_think_eos_id=57, codec_pad_id=60, codec_bos_id=61,
        speaker_id={"tiny": 0}, spatial_merge_size=2,  # the talker reads spatial_merge_size too
        **media_ids,
    )
    code2wav = dict(
        codebook_size=64, hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
        intermediate_size=32, num_quantizers=2, upsample_rates=[2, 2], upsampling_ratios=[2], decoder_dim=16,
        sliding_window=8, max_position_embeddings=64,
    )
    talker.update(talker_changes or {})
    code2wav.update(code2wav_changes or {})
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    tts = dict.fromkeys(("tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id"), tokenizer.pad_token_id)
    tts.update({key: tokenizer.convert_tokens_to_ids(token) for key, token in (tts_tokens or {}).items()})
    config = Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True,
        im_start_token_id=im_start, im_end_token_id=tokenizer.eos_token_id, **tts,
        architectures=["Qwen3OmniMoeForConditionalGeneration"],
    )
    model = Qwen3OmniMoeForConditionalGeneration(config)
    # transformers' init (std 0.02) leaves a 32-wide random model's logits within about +-0.5: a
    # near-uniform policy that LoRA on attention can hardly move. A wider output layer gives the
    # tiny policy preferences for RL to shift, as a trained model has.
    with torch.no_grad():
        model.thinker.lm_head.weight.normal_(0.0, 0.5)
    if finish is not None:
        finish(model)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
