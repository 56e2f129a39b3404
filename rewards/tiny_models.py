"""Tiny random-weight versions of the reward models, for tests and CPU demos.

Each builder writes into a folder exactly what a user would point the reward at for the real
model, in the real format, so the reward's ordinary loading code reads it back:

    build_tiny_clip(folder)        CLIPModel + CLIPProcessor (`save_pretrained`)  -> pickscore, clip_score, aesthetic
    write_aesthetic_head(path, d)  a random LAION-aesthetic MLP head (.pth or .safetensors) -> aesthetic
    build_tiny_clap(folder)        ClapModel + ClapProcessor (`save_pretrained`)   -> clap
    build_tiny_open_clip(folder)   an open_clip model config JSON + an HPS-style checkpoint -> hpsv2
    build_tiny_imagebind(folder)   an ImageBind state dict + a CLIP tokenizer + the sizes -> imagebind

Tokenizers use a byte-level vocabulary without merges (every byte is a token), so any prompt
tokenises without unknowns and nothing has to be downloaded. Weights are seeded: a builder
writes the same model every time.

`tiny:clip-reward` and `tiny:clap-reward` are registered as tiny models, so
`build_reward("pickscore", model="tiny:clip-reward", processor="tiny:clip-reward")` runs a
demo without any download.
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


@register_tiny_model("clip-reward")
def _tiny_clip_reward(folder: Path) -> None:
    build_tiny_clip(folder)


@register_tiny_model("clap-reward")
def _tiny_clap_reward(folder: Path) -> None:
    build_tiny_clap(folder)
