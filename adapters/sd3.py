"""Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`): the adapter and its tiny model.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained` from a local
folder or a hub snapshot: the MMDiT transformer (trained, LoRA on the attention projections), the
16-channel VAE, the two CLIP text encoders and, when the checkpoint has it, T5. Prompt encoding
is the pipeline's own `encode_prompt`, so embeddings match diffusers exactly; CFG is the standard
`v_uncond + g (v_cond - v_uncond)` and runs in this one method for rollout and training alike.

diffusers and transformers are imported inside the methods: registering the adapter (which
every process does through the plugin entry points) stays cheap.

`tiny:sd3` builds a ~100k-parameter random-weight SD3 (two MMDiT blocks, a one-block VAE, two tiny
CLIP encoders with a byte-level vocabulary, no T5) for tests and the CPU demo.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter, register_tiny_model
from omni_rl.models.diffusion import PromptLengthOptions, check_image_only, check_multiple
from omni_rl.models.limits import check_positions
from omni_rl.models.tiny_vocab import bpe_files, clip_byte_vocab, with_whole_words
from omni_rl.plan.spec import PlanSpec, register_plan_spec


@register_adapter("StableDiffusion3Pipeline")
class StableDiffusion3Adapter(DiffusionModelBase):
    options_class = PromptLengthOptions
    # Attention projections of the joint (image + text) attention in every MMDiT block.
    default_lora_targets = (
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    )

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

        super().__init__(cfg, path, device)
        root = Path(path)

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        self.transformer = load(SD3Transformer2DModel, "transformer")
        self.vae = load(AutoencoderKL, "vae")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
        has_t5 = (root / "text_encoder_3").is_dir()
        self.pipeline = StableDiffusion3Pipeline(
            transformer=self.transformer,
            scheduler=self.scheduler,
            vae=self.vae,
            text_encoder=load(CLIPTextModelWithProjection, "text_encoder"),
            tokenizer=CLIPTokenizer.from_pretrained(path, subfolder="tokenizer"),
            text_encoder_2=load(CLIPTextModelWithProjection, "text_encoder_2"),
            tokenizer_2=CLIPTokenizer.from_pretrained(path, subfolder="tokenizer_2"),
            text_encoder_3=load(T5EncoderModel, "text_encoder_3") if has_t5 else None,
            tokenizer_3=T5TokenizerFast.from_pretrained(path, subfolder="tokenizer_3") if has_t5 else None,
        )
        self.pipeline.set_progress_bar_config(disable=True)
        self.vae_scale = self.pipeline.vae_scale_factor
        self.setup_trainable()

    # --- contract ------------------------------------------------------------------------
    def trainable_module(self):
        return self.transformer

    def frozen_modules(self):
        p = self.pipeline
        return [m for m in (self.vae, p.text_encoder, p.text_encoder_2, p.text_encoder_3) if m is not None]

    def fsdp_wrap_classes(self):
        from diffusers.models.attention import JointTransformerBlock

        return (JointTransformerBlock,)

    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        check_image_only("StableDiffusion3Pipeline", num_frames)
        factor = self.vae_scale * self.transformer.config.patch_size
        check_multiple("rollout.height", height, factor, "VAE factor x patch size")
        check_multiple("rollout.width", width, factor, "VAE factor x patch size")
        _check_embedding(height, width, factor, self.transformer.config.pos_embed_max_size)
        return (self.transformer.config.in_channels, height // self.vae_scale, width // self.vae_scale)

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        transformer, vae = configs.get("transformer"), configs.get("vae")
        if not transformer:
            return
        scale = 2 ** (len(vae["block_out_channels"]) - 1) if vae and vae.get("block_out_channels") else 8
        factor = scale * int(transformer.get("patch_size", 2))
        _check_embedding(cfg.rollout.height, cfg.rollout.width, factor, transformer.get("pos_embed_max_size"))

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        pos, neg, pooled, neg_pooled = self.pipeline.encode_prompt(
            prompt=list(prompts),
            prompt_2=None,
            prompt_3=None,
            negative_prompt=[negative_prompt] * len(prompts),
            do_classifier_free_guidance=True,
            device=self.device,
            max_sequence_length=self.options.max_sequence_length,
        )
        return Conditioning(
            {"prompt_embeds": pos, "pooled": pooled, "negative_prompt_embeds": neg, "negative_pooled": neg_pooled}
        )

    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        # SD3 is conditioned on timestep = sigma * 1000 (the scheduler's num_train_timesteps).
        timestep = (sigma.to(torch.float32) * self.scheduler.config.num_train_timesteps).to(self.device)
        x = latents.to(self.device, self.dtype)
        cond = conditioning.to(self.device)
        if guidance_scale > 1.0:
            # One forward over [uncond; cond], as diffusers' pipeline does it.
            out = self.transformer(
                hidden_states=torch.cat([x, x]),
                timestep=torch.cat([timestep, timestep]),
                encoder_hidden_states=torch.cat([cond["negative_prompt_embeds"], cond["prompt_embeds"]]),
                pooled_projections=torch.cat([cond["negative_pooled"], cond["pooled"]]),
                return_dict=False,
            )[0].to(torch.float32)
            uncond, text = out.chunk(2)
            return uncond + guidance_scale * (text - uncond)
        out = self.transformer(
            hidden_states=x,
            timestep=timestep,
            encoder_hidden_states=cond["prompt_embeds"],
            pooled_projections=cond["pooled"],
            return_dict=False,
        )[0]
        return out.to(torch.float32)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        config = self.vae.config
        z = latents.to(self.device, self.vae.dtype) / config.scaling_factor + config.shift_factor
        image = self.vae.decode(z, return_dict=False)[0]
        image = (image.float() / 2 + 0.5).clamp(0, 1)
        return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """`decode`'s inverse: pixels in [-1, 1] through the VAE encoder (its mode), then the
        latents' shift and scale."""
        config = self.vae.config
        pixels = images.permute(0, 3, 1, 2).to(self.device, torch.float32) / 127.5 - 1.0
        z = self.vae.encode(pixels.to(self.vae.dtype)).latent_dist.mode()
        return ((z.float() - config.shift_factor) * config.scaling_factor).cpu()

    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format, with the adapter config (rank, alpha, targets) in the file's
        metadata: `pipe.load_lora_weights(folder)` loads it at the scale it was trained with
        (without the metadata diffusers would assume alpha = rank)."""
        from diffusers import StableDiffusion3Pipeline
        from peft.utils import get_peft_model_state_dict

        layers = get_peft_model_state_dict(self.transformer)
        StableDiffusion3Pipeline.save_lora_weights(
            folder, transformer_lora_layers=layers,
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


# --- the tiny model ---------------------------------------------------------------------
def tiny_text_encoders(words: Sequence[str] = (), max_length: int = 77):
    """(tokenizer, text encoder) x 2 of the tiny SD3s: byte-level CLIP tokenizers and two-layer
    CLIP text encoders (hidden 32, projection 32), seeded by the caller; no T5. `words` become
    whole tokens (`with_whole_words`: the shape model's closed caption vocabulary) and every
    prompt is padded to `max_length` tokens."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    vocab, merges = with_whole_words(clip_byte_vocab(), list(words)) if words else (clip_byte_vocab(), [])
    with bpe_files(vocab, merges) as (vocab_file, merges_file):
        tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=max_length)
    text_config = CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_hidden_layers=2, projection_dim=32, max_position_embeddings=max_length,
        bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"],
    )
    return dict(
        text_encoder=CLIPTextModelWithProjection(text_config), tokenizer=tokenizer,
        text_encoder_2=CLIPTextModelWithProjection(text_config), tokenizer_2=tokenizer,
        text_encoder_3=None, tokenizer_3=None,
    )


@register_tiny_model("sd3")
def build_tiny_sd3(folder: Path) -> None:
    """Write a tiny random-weight SD3 with `save_pretrained` (seeded: the same weights every time)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    folder = Path(folder)
    torch.manual_seed(0)
    encoders = tiny_text_encoders()
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=64,
        caption_projection_dim=32, pooled_projection_dim=64, pos_embed_max_size=32,
    )
    # One decoder block (no upsampling) and a single normalisation group: the decoder's
    # GroupNorms then keep each latent channel's offset relative to the others, so colour and
    # brightness respond to the latents. With several groups a random decoder normalises almost
    # all latent information away and no reward could be learned from its images.
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1, norm_num_groups=1,
        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(16,), use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0609, scaling_factor=1.5305,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, **encoders,
    )
    pipe.save_pretrained(folder)


def _check_embedding(height: int, width: int, factor: int, pos_embed_max_size) -> None:
    """Sizes within the learned position embedding: `pos_embed_max_size` patches of `factor` px a side."""
    if pos_embed_max_size is None:  # no cap: the embedding is computed for any size
        return
    what = "StableDiffusion3Pipeline's position embedding (its transformer's pos_embed_max_size)"
    for key, value in (("rollout.height", height), ("rollout.width", width)):
        check_positions(key, value, factor, int(pos_embed_max_size), what)


# --- the planner's view (omni_rl.plan.spec) ---------------------------------------------------
# CLIP-L/G's 77 tokens are concatenated with T5's `max_sequence_length` (diffusers' encode_prompt).
_CLIP_TOKENS = 77


def _plan_load_trained(adapter) -> None:
    from diffusers import SD3Transformer2DModel

    adapter.transformer = adapter.load_pretrained(SD3Transformer2DModel, "transformer")
    # The SD3 VAE's factor (2 ** (4 blocks - 1)), read from its config when the folder has one.
    vae = Path(adapter.path) / "vae" / "config.json"
    adapter.vae_scale = 2 ** (len(json.loads(vae.read_text())["block_out_channels"]) - 1) if vae.is_file() else 8


def _plan_forward_inputs(adapter, cfg, batch: int) -> dict:
    from omni_rl.plan.spec import prompt_tokens

    c = adapter.transformer.config
    h, w = cfg.rollout.height // adapter.vae_scale, cfg.rollout.width // adapter.vae_scale
    return {"transformer": dict(
        hidden_states=torch.empty(batch, c.in_channels, h, w, dtype=adapter.dtype),
        timestep=torch.empty(batch),
        encoder_hidden_states=torch.empty(batch, _CLIP_TOKENS + prompt_tokens(cfg), c.joint_attention_dim, dtype=adapter.dtype),
        pooled_projections=torch.empty(batch, c.pooled_projection_dim, dtype=adapter.dtype),
        return_dict=False,
    )}


register_plan_spec("StableDiffusion3Pipeline", PlanSpec(_plan_load_trained, _plan_forward_inputs))
