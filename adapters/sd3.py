"""Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`): the adapter.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained` from a local
folder or a hub snapshot: the MMDiT transformer (trained, LoRA on the attention projections), the
16-channel VAE, the two CLIP text encoders and, when the checkpoint has it, T5. Prompt encoding
is the pipeline's own `encode_prompt`, so embeddings match diffusers exactly; CFG is the standard
`v_uncond + g (v_cond - v_uncond)` and runs in this one method for rollout and training alike.

diffusers and transformers are imported inside the methods: registering the adapter (which
every process does through the plugin entry points) stays cheap.

Its tiny models are in `adapters/tiny/sd3.py`, its view for the planner in `adapters/plan/sd3.py`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_image_only, check_multiple
from omni_rl.models.limits import check_positions


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
        check_multiple("rollout.sampling_options.height", height, factor, "VAE factor x patch size")
        check_multiple("rollout.sampling_options.width", width, factor, "VAE factor x patch size")
        _check_embedding(height, width, factor, self.transformer.config.pos_embed_max_size)
        return (self.transformer.config.in_channels, height // self.vae_scale, width // self.vae_scale)

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        transformer, vae = configs.get("transformer"), configs.get("vae")
        if not transformer:
            return
        scale = 2 ** (len(vae["block_out_channels"]) - 1) if vae and vae.get("block_out_channels") else 8
        factor = scale * int(transformer.get("patch_size", 2))
        _check_embedding(cfg.rollout.sampling_options.height, cfg.rollout.sampling_options.width, factor, transformer.get("pos_embed_max_size"))

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


def _check_embedding(height: int, width: int, factor: int, pos_embed_max_size) -> None:
    """Sizes within the learned position embedding: `pos_embed_max_size` patches of `factor` px a side."""
    if pos_embed_max_size is None:  # no cap: the embedding is computed for any size
        return
    what = "StableDiffusion3Pipeline's position embedding (its transformer's pos_embed_max_size)"
    for key, value in (("rollout.sampling_options.height", height), ("rollout.sampling_options.width", width)):
        check_positions(key, value, factor, int(pos_embed_max_size), what)
