"""Tiny random-weight versions of the reward models, for tests and CPU demos.

Each builder (`build_tiny_clip`, `write_aesthetic_head`, `build_tiny_clap`, `build_tiny_open_clip`,
`build_tiny_imagebind`, `build_tiny_whisper`, `build_tiny_wavlm_sv`, `build_tiny_mask2former`)
writes, seeded, what a user would point the reward at for the real model, in the real format, so
the reward's own loading reads it; tokenizers are byte-level, so nothing is downloaded.

    build_reward("pickscore", model="tiny:clip-reward", processor="tiny:clip-reward")
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from omni_rl.models import register_tiny_model
from omni_rl.models.tiny_vocab import bpe_files, byte_chars, clip_byte_vocab


def build_tiny_clip_tokenizer():
    """A `CLIPTokenizer` over `clip_byte_vocab()` (514 tokens, 77 positions)."""
    from transformers import CLIPTokenizer

    with bpe_files(clip_byte_vocab()) as (vocab, merges):
        return CLIPTokenizer(str(vocab), str(merges), model_max_length=77)


def build_tiny_clip(folder: Path, *, projection_dim: int = 16, image_size: int = 32) -> None:
    """A 2-layer CLIP (width 32, `projection_dim` output, 8x8 patches) + its processor."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    folder = Path(folder)
    torch.manual_seed(0)
    tokenizer = build_tiny_clip_tokenizer()
    vocab = tokenizer.get_vocab()
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_hidden_layers=2, max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"],
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
            image_size=image_size, patch_size=8,
        ),
        projection_dim=projection_dim,
    )
    CLIPModel(config).eval().save_pretrained(folder)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)


def write_aesthetic_head(path: Path, in_features: int, *, seed: int = 0) -> None:
    """A random LAION aesthetic-predictor head, saved with the real file's keys
    (`layers.0.weight` ... `layers.7.bias`): `.safetensors` by suffix, else `torch.save`."""
    from rewards.aesthetic import AestheticHead

    torch.manual_seed(seed)
    state = AestheticHead(in_features).state_dict()
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)


def build_tiny_clap_tokenizer():
    """A `RobertaTokenizer` over the 256 byte characters plus RoBERTa's special tokens."""
    from transformers import RobertaTokenizer

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: 4 + i for i, c in enumerate(byte_chars())})
    vocab["<mask>"] = len(vocab)
    with bpe_files(vocab) as (vocab_file, merges_file):
        return RobertaTokenizer(str(vocab_file), str(merges_file), model_max_length=77)


def build_tiny_clap(folder: Path, *, max_length_s: int = 1) -> None:
    """A CLAP with a one-block-per-stage HTSAT audio tower (96 -> 16 wide) and a 2-layer RoBERTa,
    + its processor (48 kHz, 64 mel bins, `max_length_s`-second windows)."""
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, ClapProcessor

    folder = Path(folder)
    torch.manual_seed(0)
    tokenizer = build_tiny_clap_tokenizer()
    config = ClapConfig(
        text_config=dict(
            vocab_size=len(tokenizer.get_vocab()), hidden_size=32, intermediate_size=64,
            num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=80,
            projection_dim=16, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        ),
        audio_config=dict(
            spec_size=256, num_mel_bins=64, patch_size=4, patch_stride=(4, 4), window_size=8,
            patch_embeds_hidden_size=16, hidden_size=32, depths=[1, 1], num_attention_heads=[2, 2],
            projection_dim=16,
        ),
        projection_dim=16,
    )
    ClapModel(config).eval().save_pretrained(folder)
    feature_extractor = ClapFeatureExtractor(
        feature_size=64, sampling_rate=48000, hop_length=480, max_length_s=max_length_s,
        fft_window_size=1024, truncation="rand_trunc", padding="repeatpad",
    )
    ClapProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(folder)


# A 2-layer open_clip model with open_clip's own BPE tokenizer (49408 tokens, bundled with it).
TINY_OPEN_CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 8, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2},
}


def build_tiny_open_clip(folder: Path, *, name: str = "tiny-hps-test") -> tuple[Path, Path]:
    """Write `folder/NAME.json` (an open_clip model config) and `folder/hps_checkpoint.pt`
    (`{"state_dict": ...}`, the layout of the HPS checkpoints). Returns (config, checkpoint)."""
    import open_clip

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / f"{name}.json"
    config_path.write_text(json.dumps(TINY_OPEN_CLIP_CONFIG))
    open_clip.add_model_config(config_path)
    torch.manual_seed(0)
    model = open_clip.create_model(name, pretrained=None)
    checkpoint = folder / "hps_checkpoint.pt"
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    return config_path, checkpoint


# The sizes of a tiny ImageBind: 2 blocks of width 32 per modality, 28x28 frames in 14x14
# patches, the real audio front end (128 mel bins, 204 frames, 16x16 patches, stride 10).
TINY_IMAGEBIND_CONFIG: dict[str, Any] = {
    "out_embed_dim": 16,
    "vision_embed_dim": 32, "vision_num_blocks": 2, "vision_num_heads": 4, "image_size": 28,
    "text_embed_dim": 32, "text_num_blocks": 2, "text_num_heads": 4, "vocab_size": 514,
    "audio_embed_dim": 32, "audio_num_blocks": 2, "audio_num_heads": 4,
}


def build_tiny_imagebind(folder: Path) -> dict[str, Any]:
    """Write `folder/imagebind.pth` (a state dict with ImageBind's key layout) and a CLIP
    tokenizer in `folder/tokenizer`; return the config dict to pass as `config=`."""
    from rewards.imagebind import ImageBindConfig, ImageBindModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_clip_tokenizer().save_pretrained(folder / "tokenizer")
    torch.manual_seed(0)
    model = ImageBindModel(ImageBindConfig(**TINY_IMAGEBIND_CONFIG))
    # Random pos-embeds and cls tokens (zeros at init) so every part of the stem matters.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("pos_embed", "cls_token")):
                param.normal_(std=0.02)
    torch.save(model.state_dict(), folder / "imagebind.pth")
    return dict(TINY_IMAGEBIND_CONFIG)


# Whisper's special tokens, in the order of the real vocabulary (after the text tokens), with a
# few of its language tokens: enough for `generate(language=..., task="transcribe")`.
WHISPER_LANGUAGES = ("en", "zh", "ja")
WHISPER_SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", *(f"<|{lang}|>" for lang in WHISPER_LANGUAGES),
                    "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                    "<|notimestamps|>")
# The English normaliser's spelling map (the real checkpoints ship ~1700 British -> American pairs
# in normalizer.json); a few, so that `normalizer: whisper_english` runs on the tiny model.
TINY_ENGLISH_SPELLINGS = {"colour": "color", "favourite": "favorite", "grey": "gray"}


def build_tiny_whisper(folder: Path, *, window_s: int = 1) -> None:
    """A Whisper with one encoder and one decoder layer (width 16) over 80 mel bins and a
    `window_s`-second window (the real one is 30 s), a byte-level `WhisperTokenizer` with
    Whisper's special tokens and a spelling map, and a generation config that knows its language
    and task tokens; saved with `save_pretrained` as a real checkpoint is."""
    from transformers import (
        GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor,
        WhisperTokenizer,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    # normalizer.json sits beside the tokenizer, as in the real checkpoints (save_pretrained
    # writes tokenizer.json only; from_pretrained reads this file back).
    spellings = folder / "normalizer.json"
    spellings.write_text(json.dumps(TINY_ENGLISH_SPELLINGS))
    with bpe_files({c: i for i, c in enumerate(byte_chars())}) as (vocab, merges):
        tokenizer = WhisperTokenizer(
            str(vocab), str(merges), normalizer_file=str(spellings), unk_token="<|endoftext|>",
            bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        )
    tokenizer.add_special_tokens({"additional_special_tokens": list(WHISPER_SPECIALS[1:])})
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in WHISPER_SPECIALS}
    end, start = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    frames = window_s * 100  # 10 ms hops
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_source_positions=frames // 2, max_target_positions=448, pad_token_id=end, bos_token_id=end,
        eos_token_id=end, decoder_start_token_id=start,
    )
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=start, bos_token_id=end, eos_token_id=end, pad_token_id=end, max_length=448,
        is_multilingual=True, no_timestamps_token_id=ids["<|notimestamps|>"],
        lang_to_id={f"<|{lang}|>": ids[f"<|{lang}|>"] for lang in WHISPER_LANGUAGES},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
    )
    model.save_pretrained(folder)
    extractor = WhisperFeatureExtractor(
        feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=window_s, n_fft=400,
    )
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(folder)


def build_tiny_wavlm_sv(folder: Path) -> None:
    """A `WavLMForXVector` with one transformer layer (width 32), WavLM's real 7-layer
    convolutional front end (16 channels; 20 ms frames) and x-vector TDNN (kernels 5, 3, 3, 1, 1,
    dilations 1, 2, 3, 1, 1), 16-dim embeddings, + a 16 kHz feature extractor; `save_pretrained`."""
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    folder = Path(folder)
    torch.manual_seed(0)
    config = WavLMConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(16,) * 7,
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, num_buckets=32, max_bucket_distance=64,
        tdnn_dim=(32, 32, 32, 32, 64), tdnn_kernel=(5, 3, 3, 1, 1), tdnn_dilation=(1, 2, 3, 1, 1),
        xvector_output_dim=16, num_labels=2,
    )
    WavLMForXVector(config).eval().save_pretrained(folder)
    Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=True,
    ).save_pretrained(folder)


def build_tiny_mask2former(folder: Path, *, image_size: int = 64) -> None:
    """A Mask2Former for COCO instance segmentation: a one-block-per-stage Swin (width 16, 4x4
    windows) as the backbone, a one-layer pixel decoder and a two-layer transformer decoder of
    width 32 with 10 queries, COCO's 80 classes as id2label (GenEval's names), + a
    `Mask2FormerImageProcessor` resizing to `image_size` squared."""
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor, SwinConfig

    from omni_rl.eval.geneval_rules import COCO_CLASSES

    folder = Path(folder)
    torch.manual_seed(0)
    backbone = SwinConfig(
        image_size=image_size, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = Mask2FormerConfig(
        backbone_config=backbone, use_pretrained_backbone=False, num_labels=len(COCO_CLASSES),
        id2label=dict(enumerate(COCO_CLASSES)), label2id={name: i for i, name in enumerate(COCO_CLASSES)},
        hidden_dim=32, mask_feature_size=32, feature_size=32, encoder_layers=1, decoder_layers=2,
        num_attention_heads=2, encoder_feedforward_dim=64, dim_feedforward=64, num_queries=10, common_stride=4,
    )
    Mask2FormerForUniversalSegmentation(config).eval().save_pretrained(folder)
    Mask2FormerImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(folder)


@register_tiny_model("clip-reward")
def _tiny_clip_reward(folder: Path) -> None:
    build_tiny_clip(folder)


@register_tiny_model("clap-reward")
def _tiny_clap_reward(folder: Path) -> None:
    build_tiny_clap(folder)


@register_tiny_model("whisper-reward")
def _tiny_whisper_reward(folder: Path) -> None:
    build_tiny_whisper(folder)


@register_tiny_model("wavlm-sv-reward")
def _tiny_wavlm_sv_reward(folder: Path) -> None:
    build_tiny_wavlm_sv(folder)


@register_tiny_model("mask2former-coco")
def _tiny_mask2former_coco(folder: Path) -> None:
    build_tiny_mask2former(folder)
