"""Qwen-Image text-to-image (`QwenImagePipeline`): the adapter.

Loads the pipeline's components with diffusers' and transformers' `from_pretrained` (through
`self.load_pretrained`): the MMDiT `QwenImageTransformer2DModel` (trained, LoRA on the attention
projections of both streams), the `AutoencoderKLQwenImage` VAE (Wan2.1's layout: 16 channels,
8 px per latent, a frame axis of length 1 for images) and the Qwen2.5-VL text encoder.

The conventions, the same at rollout and in training because both go through this one file:

- **latents**: the engine carries each sample as the VAE's latent, normalised as the pipeline
  denoises it ((z - latents_mean) / latents_std), shape [16, 1, H/8, W/8]; `predict_velocity`
  packs 2x2 latent pixels into the transformer's tokens [B, H/16 * W/16, 64] and unpacks its
  output, so a standard-normal draw is the pipeline's initial noise;
- **timestep**: Qwen-Image is conditioned on sigma itself (the pipeline's `t / 1000`), not on
  sigma x 1000 as SD3 is;
- **schedule**: the pipeline's `linspace(1, 1/N, N)` sigmas, shifted by the dynamic `mu` of the
  packed image token count (`schedule_mu`; diffusers' scheduler refuses to run without it);
- **true CFG with norm**: a conditional and an unconditional forward (one batched call over
  [uncond; cond], the text padded to the longer of the two with the padding masked), combined
  as `comb = neg + s (cond - neg)` and rescaled per token to the conditional prediction's norm;
- **prompt embeddings**: the last hidden state of Qwen2.5-VL on the pipeline's chat template,
  with the template's prefix (system prompt and the user turn's opening) dropped. The pipeline
  drops a fixed 34 tokens, right for the real tokenizer only; the adapter computes the count
  by tokenizing the prefix with the loaded tokenizer (`prompt_prefix_length`) and sets it on the
  pipeline it encodes with. Embeddings have each prompt's own length, so they travel in a
  `Conditioning` with masks; the core pads them to the longest when it packs samples, and the
  transformer's joint attention masks the padding out (the tests check that it is inert).

`decode` un-normalises, runs the VAE and returns uint8 [B, H, W, 3]. Sizes must be multiples of
16 (VAE factor 8 x patch size 2); another raises `ValueError` with the nearest valid values.

Its tiny models are in `adapters/tiny/qwen_image.py`,
its view for the planner in `adapters/plan/qwen_image.py`.
Qwen-Image-Edit (adapters/qwen_image_edit.py) builds on this adapter.
"""
from __future__ import annotations

import torch
from torch import nn

from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_image_only, check_multiple, linspace_to_one_over_n


_MASKS = {"prompt_embeds": "prompt_embeds_mask", "negative_prompt_embeds": "negative_prompt_embeds_mask"}
# The pipeline refuses longer text (its `max_sequence_length` check).
MAX_TEXT_TOKENS = 1024


def prompt_prefix_length(tokenizer, template: str, slot: str = "{}") -> int:
    """Tokens of `template` before `slot` (the prompt's `{}`, or the edit template's image slot):
    what the pipeline drops from the encoder's output.

    Raises if the prefix does not tokenize to a prefix of a filled template (a tokenizer whose
    pieces cross the slot's boundary would make the count meaningless)."""
    if template.count("{}") != 1:
        raise ValueError(f"prompt template {template!r}: expected exactly one '{{}}' slot for the prompt")
    if template.count(slot) != 1:
        raise ValueError(f"prompt template {template!r}: expected exactly one {slot!r}")
    prefix = template.split(slot)[0]
    ids = tokenizer(prefix)["input_ids"]
    full = tokenizer(template.format("a photo"))["input_ids"]
    if full[: len(ids)] != ids:
        raise ValueError(
            f"the tokenizer splits the prompt template's prefix differently inside a prompt ({ids[-3:]} vs "
            f"{full[len(ids) - 3 : len(ids)]}): the prefix length to drop is not defined"
        )
    return len(ids)


def pack_latents(latents: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, 1, h, w] -> tokens [B, (h / p) (w / p), C p p]: each token a p x p patch, channels
    outermost, in the order the transformer's `img_in` reads them."""
    b, c, frames, h, w = latents.shape
    if frames != 1:
        raise ValueError(f"Qwen-Image latents have 1 frame, got shape {tuple(latents.shape)}")
    x = latents.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpack_latents(tokens: torch.Tensor, h: int, w: int, patch: int) -> torch.Tensor:
    """The inverse of `pack_latents`: [B, (h / p) (w / p), C p p] -> [B, C, 1, h, w]."""
    b, _, d = tokens.shape
    c = d // (patch * patch)
    x = tokens.reshape(b, h // patch, w // patch, c, patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, 1, h, w)


def true_cfg_with_norm(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """`uncond + scale (cond - uncond)`, each token's vector rescaled to the norm of the
    conditional prediction's (the Qwen-Image pipeline's guidance), on packed [B, S, D]."""
    comb = uncond + scale * (cond - uncond)
    return comb * (cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))


@register_adapter("QwenImagePipeline")
class QwenImageAdapter(DiffusionModelBase):
    options_class = PromptLengthOptions
    # VAE factor 8 x patch size 2 (every Qwen-Image checkpoint; `latent_shape` checks the loaded one).
    size_multiple = 16
    # Attention projections of the joint attention in every block: image stream (to_*) and
    # text stream (add_*_proj, to_add_out), as SD3's MMDiT (PEFT matches name suffixes).
    default_lora_targets = (
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    )

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        super().__init__(cfg, path, device)
        if self.options.max_sequence_length > MAX_TEXT_TOKENS:
            raise ValueError(f"model.adapter_options.max_sequence_length={self.options.max_sequence_length}: Qwen-Image takes at "
                             f"most {MAX_TEXT_TOKENS}")

        def load(cls, sub):
            return self.load_pretrained(cls, sub).to(device)

        self.transformer = load(QwenImageTransformer2DModel, "transformer")
        self.vae = load(AutoencoderKLQwenImage, "vae")
        self.text_encoder = load(Qwen2_5_VLForConditionalGeneration, "text_encoder")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
        self._build_pipeline(path, dict(
            scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
            tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer"), transformer=self.transformer,
        ))
        self.pipeline.set_progress_bar_config(disable=True)
        # The pipeline reads this instance attribute when it drops the template's prefix.
        self.pipeline.prompt_template_encode_start_idx = self.prompt_prefix_length
        self.vae_scale = self.pipeline.vae_scale_factor
        self.patch = self.transformer.config.patch_size
        self.setup_trainable()

    def _build_pipeline(self, path: str, components: dict) -> None:
        """`self.pipeline` (what encodes prompts) on the loaded components, and
        `self.prompt_prefix_length`; the edit adapter builds its own pipeline here."""
        from diffusers import QwenImagePipeline

        self.pipeline = QwenImagePipeline(**components)
        self.prompt_prefix_length = prompt_prefix_length(self.pipeline.tokenizer, self.pipeline.prompt_template_encode)

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.transformer

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae, self.text_encoder]

    def fsdp_wrap_classes(self):
        from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

        return (QwenImageTransformerBlock,)

    # --- shapes and schedule -------------------------------------------------------------
    def _grid(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
        check_image_only("QwenImagePipeline", num_frames)
        factor = self.vae_scale * self.patch
        why = f"VAE factor {self.vae_scale} x patch size {self.patch}"
        check_multiple("rollout.sampling_options.height", height, factor, why)
        check_multiple("rollout.sampling_options.width", width, factor, why)
        return height // self.vae_scale, width // self.vae_scale

    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """[z_dim, 1, height / 8, width / 8]: the VAE's latent of one image."""
        h, w = self._grid(height, width, num_frames)
        return (self.vae.config.z_dim, 1, h, w)

    def schedule_mu(self, height: int, width: int, num_frames: int = 1) -> float:
        """The pipeline's shift: diffusers' `calculate_shift` of the packed image token count."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

        h, w = self._grid(height, width, num_frames)
        config = self.scheduler.config
        return float(calculate_shift(
            (h // self.patch) * (w // self.patch),
            config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        ))

    def base_sigmas(self, num_steps: int) -> list[float]:
        return linspace_to_one_over_n(num_steps)

    # --- conditioning --------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Each prompt's embeddings [B, L, D] (L: the longest prompt's tokens) with their mask, and
        the negative prompt's, through the pipeline's `encode_prompt` (prefix count from the
        loaded tokenizer, see the module docstring)."""
        tensors = {}
        for name, texts in (("prompt_embeds", list(prompts)), ("negative_prompt_embeds", [negative_prompt])):
            embeds, mask = self.pipeline.encode_prompt(
                prompt=texts, device=self.device, max_sequence_length=self.options.max_sequence_length,
            )
            if mask is None:  # the pipeline drops an all-ones mask
                mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            tensors[name], tensors[_MASKS[name]] = embeds, mask.to(torch.long)
        for name, mask in _MASKS.items():  # one negative for every prompt
            if tensors[name].shape[0] != len(prompts):
                tensors[name] = tensors[name].expand(len(prompts), -1, -1).contiguous()
                tensors[mask] = tensors[mask].expand(len(prompts), -1).contiguous()
        return Conditioning(tensors, dict(_MASKS))

    # --- forward -------------------------------------------------------------------------
    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, C, 1, h, w]) at per-sample sigma [B], with true CFG with norm
        when `guidance_scale` > 1 (module docstring)."""
        b, _, _, h, w = latents.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        x = pack_latents(latents.to(self.device, torch.float32), self.patch).to(self.dtype)
        cond = conditioning.to(self.device)
        guided = guidance_scale > 1.0
        parts = ("negative_prompt_embeds", "prompt_embeds") if guided else ("prompt_embeds",)
        # The two texts have their own lengths: pad to the longer, the padding masked out.
        text = Conditioning.cat([
            Conditioning({"e": cond[name], "m": cond[_MASKS[name]]}, {"e": "m"}) for name in parts
        ])
        copies = len(parts)
        out = self.transformer(
            hidden_states=torch.cat([x] * copies),
            timestep=torch.cat([sigma] * copies).to(self.dtype),
            encoder_hidden_states=text["e"].to(self.dtype),
            encoder_hidden_states_mask=text["m"],
            img_shapes=[[(1, h // self.patch, w // self.patch)]] * (b * copies),
            return_dict=False,
        )[0].to(torch.float32)
        if guided:
            uncond, cond_v = out.chunk(2)
            out = true_cfg_with_norm(cond_v, uncond, guidance_scale)
        return unpack_latents(out, h, w, self.patch)

    # --- decoding ------------------------------------------------------------------------
    def _raw_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The normalised latent -> the VAE's (the pipeline's `latents / (1 / std) + mean`)."""
        config = self.vae.config
        z = latents.to(self.device, self.vae.dtype)
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean, device=z.device, dtype=z.dtype).view(shape)
        std = torch.tensor(config.latents_std, device=z.device, dtype=z.dtype).view(shape)
        return z / (1.0 / std) + mean

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, 1, h, w] -> uint8 images [B, 8h, 8w, 3]."""
        if latents.ndim != 5 or latents.shape[2] != 1:
            raise ValueError(f"Qwen-Image latents are [B, C, 1, h, w], got shape {tuple(latents.shape)}")
        image = self.vae.decode(self._raw_latents(latents), return_dict=False)[0][:, :, 0]
        image = (image.float() / 2 + 0.5).clamp(0, 1)
        return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()

    # --- saving --------------------------------------------------------------------------
    def save_lora(self, folder: str) -> None:
        """diffusers' LoRA format with the adapter config (rank, alpha, targets) in the file's
        metadata: `QwenImagePipeline.load_lora_weights(folder)` loads it at the trained scale."""
        from diffusers import QwenImagePipeline
        from peft.utils import get_peft_model_state_dict

        QwenImagePipeline.save_lora_weights(
            folder, transformer_lora_layers=get_peft_model_state_dict(self.transformer),
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )
