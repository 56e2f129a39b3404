"""BAGEL text-to-image (`BagelForConditionalGeneration`, ByteDance-Seed/BAGEL-7B-MoT): the adapter.

Loads the official layout (adapters/bagel/checkpoint.py: `ema.safetensors` strictly, FLUX's VAE
from `ae.safetensors` with diffusers' converter, the Qwen2 tokenizer) into the plain-torch
network of adapters/bagel/network.py. The conventions, the same at rollout and in training
because both go through `predict_velocity`:

- **latents**: the VAE latent in BAGEL's space (`scale (z - shift)`, scale 0.3611, shift 0.1159),
  [16, H/8, W/8]; the network reads 2x2 patches (BAGEL's `chpwq -> hwpqc` order), 64 numbers a
  token, so a standard-normal draw is BAGEL's initial noise;
- **schedule**: `t_i = linspace(1, 0, N + 1)` shifted by `t' = s t / (1 + (s - 1) t)`
  (`model.adapter_options.timestep_shift`, the official 3.0): N steps from N + 1 points, as the official
  `generate_image` makes `num_timesteps - 1` steps of `num_timesteps` points; the network is
  conditioned on t itself (the time embedder reads sigma in [0, 1]);
- **prompt**: `<|im_start|> tokens(prompt) <|im_end|>` (the official `prepare_prompts`), at most
  `model.adapter_options.max_sequence_length` prompt tokens, carried as ids with a mask; the text runs through the
  understanding expert inside every forward (it is frozen, and cheap next to the image block);
- **text CFG**: the unconditional branch is the empty context (the official `cfg_text_precontext`
  for text-to-image; a non-empty `rollout.sampling_options.negative_prompt` becomes that context instead);
  `v = u + g (c - u)`, rescaled by `clamp(|c| / |v|, model.adapter_options.cfg_renorm_min, 1)`, the norms
  taken as `model.adapter_options.cfg_renorm_type` says (`guided_velocity`: the official "global", over all
  of one sample's numbers, which the official code computes over a batch of one; "channel" and
  "text_channel", per token); applied only to samples whose sigma is in `model.adapter_options.cfg_interval`
  (lo, hi], the others take c. Conditional and unconditional rows go through one forward.
- **a second guidance** (the official `cfg_img_scale`) toward what the conditional context holds
  beyond a second unconditional one: the source image when editing (adapters/bagel/edit.py,
  `model.adapter_options.image_guidance_scale`), the plan in think mode (adapters/bagel/think.py,
  `model.adapter_options.plan_guidance_scale`); the subclasses supply it through `image_cfg_rows`,
  `image_cfg_scale`, `image_cfg_text` and `source_image`. Text-to-image has neither and refuses
  both. Where the official inferencer applies `cfg_img_scale` s in text-to-image (its second
  context is then the prompt itself), the result is text CFG at scale `1 + s (g - 1)`: set
  `rollout.sampling_options.guidance_scale` so.

What trains: with LoRA, adapters on the generation expert's projections (verl-omni's targets);
without, the generation expert whole (every `*_moe_gen` tensor, the time embedder, `vae2llm`,
`llm2vae`) while the understanding expert, the embeddings and the LM head stay frozen. FSDP wraps
each decoder layer. Exports: `save_lora` (PEFT: adapter_model.safetensors + adapter_config.json,
`PeftModel.from_pretrained` loads it), `save_full` / `save_merged` (the official layout, a whole
checkpoint folder, LoRA merged in).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase, register_adapter
from omni_rl.models.diffusion import PromptLengthOptions, check_image_only, check_multiple

from adapters.bagel.checkpoint import LLM_CONFIG, VIT_CONFIG, WEIGHTS, load_vae, read_network, require_file, write_network
from adapters.bagel.network import (
    LATENT_CHANNELS, LATENT_PATCH, VAE_DOWNSAMPLE, BagelNetwork, LLMConfig, MoTDecoderLayer, SourceImage,
)

ARCHITECTURE = "BagelForConditionalGeneration"
# BAGEL's special tokens (the official `add_special_tokens`): prompt start / end, image start / end.
BOS, EOS, IMAGE_START, IMAGE_END = "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"
# The official inference's latent grid side (app.py, the eval scripts' `max_latent_size=64`), for
# a weightless view of a folder that says nothing else.
DEFAULT_MAX_LATENT_SIZE = 64
DEFAULT_VIT_SIDE = 70  # the official `vit_max_num_patch_per_side`
TEXT_MASKS = {"input_ids": "text_mask", "negative_input_ids": "negative_text_mask"}
# The generation side that full fine-tuning trains (besides every `*_moe_gen` tensor).
GENERATION_MODULES = ("time_embedder.", "vae2llm.", "llm2vae.")


def is_generation_parameter(name: str) -> bool:
    return "_moe_gen" in name or name.startswith(GENERATION_MODULES)


def bagel_schedule(num_steps: int, shift: float) -> torch.Tensor:
    """[num_steps + 1] fp32: `linspace(1, 0, num_steps + 1)` shifted by `s t / (1 + (s - 1) t)`."""
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps}: expected at least 1 denoising step")
    t = torch.linspace(1, 0, num_steps + 1)
    return shift * t / (1 + (shift - 1) * t)


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h p, w p] -> [B, h w, p p C] (BAGEL's `chpwq -> hwpqc`)."""
    b, c, hh, ww = latents.shape
    p = LATENT_PATCH
    x = latents.reshape(b, c, hh // p, p, ww // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (hh // p) * (ww // p), p * p * c)


def unpatchify(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The inverse of `patchify` for an h x w token grid."""
    b = tokens.shape[0]
    p = LATENT_PATCH
    x = tokens.reshape(b, h, w, p, p, -1).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(b, -1, h * p, w * p)


def padded(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, width] long and their mask [B, width] long."""
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"a row of {len(row)} tokens does not fit the width {width}")
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


RENORM_TYPES = ("global", "channel", "text_channel")


def guided_velocity(cond: torch.Tensor, uncond: torch.Tensor, scale: float, renorm_min: float,
                    image_uncond: torch.Tensor | None = None, image_scale: float = 1.0,
                    renorm_type: str = "global") -> torch.Tensor:
    """BAGEL's CFG (the official `_forward_flow`) on velocity tokens [B, L, D] (D: one token's
    numbers), each sample (dim 0) on its own. Text CFG `t = u + g (c - u)`; with the second
    unconditional velocity `ui` (editing's image-free one, think's plan-free one) `v = ui +
    g_img (t - ui)`. A rescale `r(x) = x clamp(|c| / |x|, renorm_min, 1)`:

    - "global": `r(v)`, the norms over all of a sample's numbers (the official code takes them
      over the whole packed batch, which it runs with one sample);
    - "channel": `r(v)`, the norms per token (over D);
    - "text_channel": `ui + g_img (r(t) - ui)`, the norms per token: the text-guided velocity is
      rescaled before the second guidance, which is not rescaled (the official edit demo's and
      GEdit / ImgEdit / KRIS evaluations' choice)."""
    if renorm_type not in RENORM_TYPES:
        raise ValueError(f"renorm_type={renorm_type!r}: expected one of {list(RENORM_TYPES)}")

    def rescale(x: torch.Tensor, dims) -> torch.Tensor:
        ratio = cond.norm(dim=dims, keepdim=True) / (x.norm(dim=dims, keepdim=True) + 1e-8)
        return x * ratio.clamp(min=renorm_min, max=1.0)

    guided = uncond + scale * (cond - uncond)
    if renorm_type == "text_channel":
        guided = rescale(guided, -1)
        return guided if image_uncond is None else image_uncond + image_scale * (guided - image_uncond)
    if image_uncond is not None:
        guided = image_uncond + image_scale * (guided - image_uncond)
    return rescale(guided, tuple(range(1, cond.ndim)) if renorm_type == "global" else -1)


def grid_side(folder: Path, key: str, config_key: str, default: int) -> int:
    """The grid side of a position table (`latent_pos_embed`, `vit_pos_embed`): from the table's
    shape in `ema.safetensors` when it is there, else `config.json`'s `config_key`, else the
    official value `default` (a weightless view of a folder without weights)."""
    from safetensors import safe_open

    weights = folder / WEIGHTS
    if weights.is_file():
        with safe_open(str(weights), framework="pt") as f:
            if key in f.keys():
                rows = f.get_slice(key).get_shape()[0]
                side = math.isqrt(rows)
                if side * side != rows:
                    raise ValueError(f"{weights}: {key} has {rows} rows; expected a square grid")
                return side
    config = folder / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get(config_key, default))
    return default


@dataclass
class BagelOptions(PromptLengthOptions):
    """BAGEL's options (`model.adapter_options`), those of the official inferencer."""

    timestep_shift: float = option(3.0, "The shift s of the schedule t' = s t / (1 + (s - 1) t) (the official inferencer's 3.0).")
    cfg_interval: Optional[list[float]] = option(None, "Text CFG applies to the samples whose sigma lies in (lo, hi]; the others take the conditional velocity (the official cfg_interval, [0.4, 1.0] there); null = every step.")
    cfg_renorm_min: float = option(0.0, "The guided velocity is rescaled toward the conditional one's norm, the scale clamped to [cfg_renorm_min, 1] (the official cfg_renorm_min; 1.0 turns it off).")
    cfg_renorm_type: str = option("global", "Where the renorm takes its norms (the official cfg_renorm_type): global (all of a sample's numbers, after both guidances; the official default), channel (per token, after both), text_channel (per token, after text CFG only; the official editing's).")
    image_guidance_scale: float = option(1.0, "Image CFG of editing (model.stage=edit; BAGEL's cfg_img_scale); 1 = off. Text-to-image refuses > 1.")
    plan_guidance_scale: float = option(1.0, "Think mode's CFG toward the plan (model.stage=think; the official cfg_img_scale there, whose unconditional branch is the system prompt and the prompt); 1 = off. The other stages refuse > 1.")

    def check(self) -> None:
        super().check()
        if not (math.isfinite(self.timestep_shift) and self.timestep_shift > 0):
            raise ValueError(f"timestep_shift={self.timestep_shift}: expected a positive number (BAGEL uses 3.0)")
        interval = self.cfg_interval
        if interval is not None and not (len(interval) == 2 and 0.0 <= interval[0] < interval[1] <= 1.0):
            raise ValueError(f"cfg_interval={list(interval)}: expected [lo, hi] with 0 <= lo < hi <= 1, "
                             f"e.g. BAGEL's [0.4, 1.0], or null for every step")
        if not 0.0 <= self.cfg_renorm_min <= 1.0:
            raise ValueError(f"cfg_renorm_min={self.cfg_renorm_min}: expected a value in [0, 1] (1 turns the renorm off)")
        if self.cfg_renorm_type not in RENORM_TYPES:
            raise ValueError(f"cfg_renorm_type={self.cfg_renorm_type!r}: expected one of {list(RENORM_TYPES)} "
                             f"(BAGEL's text-to-image uses global, its editing text_channel)")
        if not (math.isfinite(self.plan_guidance_scale) and self.plan_guidance_scale >= 1.0):
            raise ValueError(f"plan_guidance_scale={self.plan_guidance_scale}: expected a number >= 1 (1 = off; "
                             f"BAGEL's think mode defaults to 1.5)")


@register_adapter(ARCHITECTURE)
class BagelAdapter(DiffusionModelBase):
    options_class: type = BagelOptions
    # VAE factor 8 x patch 2 (every BAGEL checkpoint).
    size_multiple = VAE_DOWNSAMPLE * LATENT_PATCH
    # verl-omni's BAGEL LoRA targets: the generation expert's attention and MLP projections.
    default_lora_targets = (
        "q_proj_moe_gen", "k_proj_moe_gen", "v_proj_moe_gen", "o_proj_moe_gen",
        "mlp_moe_gen.gate_proj", "mlp_moe_gen.up_proj", "mlp_moe_gen.down_proj",
    )
    editing_hint = "model.stage=edit (BAGEL's editing adapter, adapters/bagel/edit.py)"

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        super().__init__(cfg, path, device)
        self.load(Path(path))
        self.setup_trainable()

    def load(self, folder: Path) -> None:
        """The network, FLUX's VAE and the tokenizer of the folder (the edit adapter adds the
        SigLIP tower)."""
        from transformers import AutoTokenizer

        self.llm_config = LLMConfig.from_json(require_file(folder, LLM_CONFIG, "the decoder's Qwen2 config"))
        vit_file = folder / VIT_CONFIG
        vit_hidden = json.loads(vit_file.read_text())["hidden_size"] if vit_file.is_file() else None
        side = grid_side(folder, "latent_pos_embed.pos_embed", "max_latent_size", DEFAULT_MAX_LATENT_SIZE)
        vit_side = grid_side(folder, "vit_pos_embed.pos_embed", "vit_max_num_patch_per_side", DEFAULT_VIT_SIDE)
        with torch.device("meta"):
            self.network = BagelNetwork(self.llm_config, side, vit_hidden, vit_side)
        if self.weightless:
            self.network = self.network.to(self.dtype)
        else:
            read_network(self.network, folder, self.dtype)
            self.network.to(self.device)
        self.vae = load_vae(folder, self.dtype, weights=not self.weightless).to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.token_ids = {}
        for token in (BOS, EOS, IMAGE_START, IMAGE_END):
            index = self.tokenizer.convert_tokens_to_ids(token)
            if index is None or index == self.tokenizer.unk_token_id:
                raise ValueError(f"the tokenizer at {str(folder)!r} has no {token!r}; BAGEL's prompts need it "
                                 f"(the official add_special_tokens)")
            self.token_ids[token] = index
        self.markers = (self.token_ids[IMAGE_START], self.token_ids[IMAGE_END])

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        cls.check_image_guidance(cfg)
        cls.check_plan_guidance(cfg)

    @classmethod
    def check_plan_guidance(cls, cfg) -> None:
        """Only think mode writes a plan: `model.adapter_options.plan_guidance_scale` must be 1 elsewhere."""
        scale = cfg.model.adapter_options.plan_guidance_scale
        if scale != 1.0:
            raise ValueError(
                f"model.adapter_options.plan_guidance_scale={scale}: CFG toward the plan needs a plan, and {cfg.model.adapter} "
                f"with model.stage={cfg.model.stage!r} writes none; set it to 1.0, or use model.stage=think"
            )

    @classmethod
    def check_image_guidance(cls, cfg) -> None:
        """Text-to-image has no source image to guide by: `model.adapter_options.image_guidance_scale` must be 1."""
        scale = cfg.model.adapter_options.image_guidance_scale
        if scale != 1.0:
            raise ValueError(
                f"model.adapter_options.image_guidance_scale={scale}: image CFG needs a source image, and {cfg.model.adapter} "
                f"here makes images from text; set it to 1.0, or edit images with model.stage=edit (the official "
                f"inferencer's cfg_img_scale s without an image is text CFG at 1 + s (g - 1): set rollout.sampling_options.guidance_scale "
                f"so; in think mode it is model.adapter_options.plan_guidance_scale)"
            )

    # --- what trains ---------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        return self.network

    def frozen_modules(self) -> list[nn.Module]:
        return [self.vae]

    def fsdp_wrap_classes(self):
        return (MoTDecoderLayer,)

    def setup_trained_modules(self) -> None:
        """The base's freeze / LoRA; without LoRA only the generation side trains (module docstring)."""
        super().setup_trained_modules()
        if not self.cfg.lora.enabled:
            for name, p in self.network.named_parameters():
                p.requires_grad_(is_generation_parameter(name) and "pos_embed" not in name)

    # --- shapes and schedule -------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int = 1) -> tuple[int, ...]:
        """[16, height / 8, width / 8]: FLUX's VAE latent of one image."""
        check_image_only(ARCHITECTURE, num_frames)
        self.check_side("rollout.sampling_options.height", height)
        self.check_side("rollout.sampling_options.width", width)
        return (LATENT_CHANNELS, height // VAE_DOWNSAMPLE, width // VAE_DOWNSAMPLE)

    def check_side(self, key: str, value: int) -> None:
        """An image side (px) the network takes: a multiple of 16 that `latent_pos_embed` covers."""
        check_multiple(key, value, self.size_multiple, f"VAE factor {VAE_DOWNSAMPLE} x patch size {LATENT_PATCH}")
        side = self.network.max_latent_size
        biggest = side * self.size_multiple
        if value > biggest:
            raise ValueError(f"{key}={value}: this checkpoint's latent_pos_embed covers at most {biggest} px a side "
                             f"({side} tokens of {self.size_multiple} px)")

    def sigmas(self, num_steps: int, height: int | None = None, width: int | None = None,
               num_frames: int = 1) -> torch.Tensor:
        return bagel_schedule(num_steps, self.options.timestep_shift)

    # --- conditioning --------------------------------------------------------------------
    def piece(self, text: str, limit: int | None = None) -> list[int]:
        """`<|im_start|> text <|im_end|>` (the official `prepare_prompts`), the text cut to `limit` tokens."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [self.token_ids[BOS], *(ids if limit is None else ids[:limit]), self.token_ids[EOS]]

    def _ids(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.piece(text, self.options.max_sequence_length) for text in texts]
        return padded(rows, max(len(r) for r in rows))

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative_prompt: str = "") -> Conditioning:
        """Each prompt's token ids [B, L] with their mask, and the unconditional context's (an
        empty one, all mask 0, for `negative_prompt=""`: module docstring)."""
        ids, mask = self._ids(list(prompts))
        if negative_prompt:
            neg, neg_mask = self._ids([negative_prompt])
        else:
            neg, neg_mask = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)
        b = len(prompts)
        tensors = {"input_ids": ids, "text_mask": mask, "negative_input_ids": neg.expand(b, -1).contiguous(),
                   "negative_text_mask": neg_mask.expand(b, -1).contiguous()}
        return Conditioning({k: v.to(self.device) for k, v in tensors.items()}, dict(TEXT_MASKS))

    # --- forward -------------------------------------------------------------------------
    def cfg_rows(self, sigma: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """Indices of the samples that take text CFG at their sigma (`model.adapter_options.cfg_interval`)."""
        if guidance_scale <= 1.0:
            return torch.zeros(0, dtype=torch.long, device=sigma.device)
        interval = self.options.cfg_interval
        on = torch.ones_like(sigma, dtype=torch.bool) if interval is None else (sigma > interval[0]) & (sigma <= interval[1])
        return on.nonzero().flatten()

    def image_cfg_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Indices of the samples that also take the second guidance (module docstring): none in
        text-to-image (editing and think: `rows` when their scale is > 1)."""
        return rows[:0]

    def image_cfg_scale(self) -> float:
        """The second guidance's scale (editing: image_guidance_scale; think: plan_guidance_scale)."""
        return 1.0

    def image_cfg_text(self, cond: Conditioning) -> Conditioning:
        """The text ("e", mask "m") of the second unconditional rows: the conditional text itself
        (editing, whose second branch drops the source image; think overrides it)."""
        return Conditioning({"e": cond["input_ids"], "m": cond["text_mask"]}, {"e": "m"})

    def source_image(self, cond: Conditioning, branch: torch.Tensor, present: torch.Tensor) -> SourceImage | None:
        """What each forward row sees of its sample's source image (`branch`: the sample of each
        row; `present`: whether the row sees it): nothing in text-to-image."""
        return None

    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        """Velocity (fp32, [B, 16, h, w]) at per-sample sigma [B], CFG inside (module docstring).

        One forward takes every branch, each a row: the samples' conditional rows, the text-
        unconditional rows of the samples in `cfg_rows`, then (editing, think) their second
        unconditional rows: the instruction without the source image, or the prompt without the plan."""
        b, _, hh, ww = latents.shape
        sigma = sigma.to(torch.float32).reshape(-1).to(self.device)
        if sigma.shape[0] != b:
            raise ValueError(f"sigma has {sigma.shape[0]} values for a batch of {b} latents")
        tokens = patchify(latents.to(self.device, torch.float32))
        cond = conditioning.to(self.device)
        rows = self.cfg_rows(sigma, guidance_scale)
        image_rows = self.image_cfg_rows(rows)
        instruction = Conditioning({"e": cond["input_ids"], "m": cond["text_mask"]}, {"e": "m"})
        negative = Conditioning({"e": cond["negative_input_ids"], "m": cond["negative_text_mask"]}, {"e": "m"})
        parts = [instruction, negative.select(rows), self.image_cfg_text(cond).select(image_rows) if image_rows.numel() else None]
        text = Conditioning.cat([part for part in parts if part is not None and len(part)])  # an empty part would widen the padding
        branch = torch.cat([torch.arange(b, device=self.device), rows, image_rows])
        present = torch.arange(branch.shape[0], device=self.device) < b + rows.numel()
        grid = (hh // LATENT_PATCH, ww // LATENT_PATCH)
        out = self.network(text["e"], text["m"], tokens[branch], sigma[branch], grid, self.markers,
                           self.source_image(cond, branch, present))
        v = out[:b]
        if rows.numel():
            r = rows.numel()
            image_uncond = out[b + r :] if image_rows.numel() else None
            guided = guided_velocity(v[rows], out[b : b + r], guidance_scale, self.options.cfg_renorm_min,
                                     image_uncond, self.image_cfg_scale(), self.options.cfg_renorm_type)
            v = v.index_copy(0, rows, guided)
        return unpatchify(v, *grid)

    # --- decoding ------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, 16, h, w] -> uint8 images [B, 8h, 8w, 3] (the official `decode_image`)."""
        if latents.ndim != 4 or latents.shape[1] != LATENT_CHANNELS:
            raise ValueError(f"BAGEL latents are [B, {LATENT_CHANNELS}, h, w], got shape {tuple(latents.shape)}")
        config = self.vae.config
        z = latents.to(self.device, self.vae.dtype) / config.scaling_factor + config.shift_factor
        image = self.vae.decode(z, return_dict=False)[0]
        image = (image.float() * 0.5 + 0.5).clamp(0, 1) * 255
        return image.to(torch.uint8).permute(0, 2, 3, 1).cpu()

    # --- saving --------------------------------------------------------------------------
    def official_state(self) -> dict[str, torch.Tensor]:
        """The network's tensors under the official names, any LoRA merged into its base weight,
        in the model's dtype (the fixed sin-cos tables in fp32)."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        deltas = {}
        for name, module in self.network.named_modules():
            if isinstance(module, BaseTunerLayer) and "default" in getattr(module, "lora_A", {}):
                deltas[f"{name}.weight"] = module.get_delta_weight("default")
        state = {}
        for name, tensor in self.network.state_dict().items():
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            value = tensor.detach().float()
            if name in deltas:
                value = value + deltas[name].detach().float()
            state[name] = value if "pos_embed" in name else value.to(self.dtype)
        return state

    def save_full(self, folder: str) -> None:
        """A whole checkpoint folder in the official layout (`write_network`)."""
        write_network(self.official_state(), Path(self.path), Path(folder))

    def save_merged(self, folder: str) -> None:
        """The LoRA merged into the base weights, as a checkpoint folder in the official layout."""
        self.save_full(folder)

    def save_lora(self, folder: str) -> None:
        """PEFT's format: `adapter_model.safetensors` (keys as `PeftModel.save_pretrained` names
        them) and `adapter_config.json`; `PeftModel.from_pretrained(network, folder)` loads it."""
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        state = get_peft_model_state_dict(self.network)
        save_file({f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in state.items()},
                  str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
        self.network.peft_config["default"].save_pretrained(str(out))
