"""Qwen3-Omni's thinker (`Qwen3OmniMoeForConditionalGeneration`, `model.stage=thinker`): RL on the
text the omni model writes about images, audio and text.

Loading. The whole checkpoint loads with transformers' `from_pretrained` from `self.path` (a real
snapshot or `tiny:qwen3_omni`), with its processor (`AutoProcessor`). `strip_for_training` then
deletes the speech side, the talker (with its code predictor) and code2wav, before anything is
moved to the device, wrapped or sharded: the trained module is the thinker alone
(`Qwen3OmniMoeThinkerForConditionalGeneration`; forward and input embeddings are its own). The
talker's weights are still read into host memory once (the 30B-A3B checkpoint is ~35B parameters).

What trains.
- LoRA (the default): adapters on the thinker's language-model attention projections q/k/v/o.
  `model.lora.target_modules` entries are module-name suffixes matched INSIDE the language model
  (`model.language_model`), because the audio tower has `q_proj`/`k_proj`/`v_proj` of its own;
  prefix an entry with `visual.` or `audio_tower.` to put LoRA in an encoder instead (e.g.
  `visual.attn.qkv`, `audio_tower.self_attn.q_proj`). The adapter hands PEFT one regex.
- `model.lora.enabled=false`: every thinker parameter trains, except frozen towers.
- `model.adapter_options.freeze_vision_tower` / `freeze_audio_tower` (default true): the tower gets no
  gradient at all (LoRA inside it included). An unfrozen tower trains fully without LoRA; with
  LoRA it only trains where a target names it (see above), like any base weight.
- `model.gradient_checkpointing`: transformers only checkpoints a layer whose module is in training
  mode, while this project runs models in eval mode (no dropout). The language-model decoder layers
  are therefore put in training mode, which changes nothing else in them as long as the
  checkpoint's attention dropout is 0 (checked at load); the encoders are not checkpointed.

Prompts. `encode_prompt(messages, media)` renders the processor's chat template and runs the
processor. `media` holds `"images"` (PIL images) and/or `"audio"` ((float32 mono array,
sample_rate) pairs; resampled to the feature extractor's rate by band-limited FFT resampling).
Messages may mark where each medium goes with `{"type": "image"}` / `{"type": "audio"}` content
parts (one per item, in order); without any, the media go before the text of the first user
message. Video is refused.

The prompt's media tensors, the same four keys for every prompt (empty when a prompt has no such
medium), so any prompts collate into one batch by concatenation along dim 0:

    pixel_values          [N_patches, C * T_patch * P * P]  the image processor's patches
    image_grid_thw        [N_images, 3] long                 each image's (t, h, w) patch grid
    audio_features        [N_frames, mel]                    log-mel frames of all clips, packed
    audio_feature_lengths [N_clips] long                     frames per clip

(Audio is packed frame-major instead of the processor's [clips, mel, frames] so prompts with clips
of different lengths still concatenate; `forward_logits` pads it back for the audio tower.)

Positions. Qwen3-Omni uses multimodal rotary positions, int64 [3, B, T] (time, height, width):
text and audio tokens advance all three by one; an image's tokens sit on its merged patch grid
(time * position_id_per_seconds, row, column) from the next free position, and the token after
it starts past the grid's largest position. `rope_positions` computes them from the attention
mask, so left padding never shifts them, and from image placeholder runs rather than the
start/end markers (a sampled marker in a response is just text). For cached decoding each row's
offset to the plain token count is kept in the cache (`ThinkerCache`), so `supports_kv_cache` is
True: a new token's position is its mask position plus that offset.

Logits are fp32. The image/video/audio placeholder tokens are never sampled: their logits are set
to -1e9, in rollout and training alike, because a placeholder in a response has no media feature
behind it and the next forward would fail. A real checkpoint gives them ~0 probability anyway.

Left out: video (and audio-in-video), speech output, LoRA on the MoE experts (fused 3-D
parameters, not `nn.Linear`), checkpointing the encoders.

Its tiny model is in `adapters/tiny/qwen3_omni.py`,
its view for the planner in `adapters/plan/qwen3_omni.py`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import numbers
import re
from typing import Any, ClassVar

import numpy as np
import torch

from omni_rl.option import ComponentOptions, option
from omni_rl.config.schema import ModelConfig
from omni_rl.models import register_adapter
from omni_rl.models.autoregressive import AutoregressiveModelBase, PromptInputs, positions_from_mask
from omni_rl.utils.audio import resample

MEDIA_KEYS = ("pixel_values", "image_grid_thw", "audio_features", "audio_feature_lengths")
# Logit given to placeholder tokens: exp() of it is exactly 0 in fp32, and it stays finite after
# division by any sampling temperature, so entropies and KLs over the full vocabulary stay finite.
BLOCKED_LOGIT = -1.0e9


@dataclasses.dataclass
class ThinkerCache:
    """The thinker's key/value cache and, after the prefill, each row's rope offset [B] (long):
    the multimodal position of a row's next token minus its plain token count."""

    kv: Any
    rope_deltas: torch.Tensor | None = None


def resample_audio(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """A mono clip from `rate` to `target` Hz, float32: `omni_rl.utils.audio.resample`'s "fft"
    method (the spectrum cut or zero-padded at the new Nyquist frequency; no aliasing)."""
    x = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float64))
    return resample(x, rate, target, method="fft").to(torch.float32).numpy()


@dataclasses.dataclass
class Qwen3OmniOptions(ComponentOptions):
    """The thinker's options (`model.adapter_options`)."""

    freeze_vision_tower: bool = option(True, "Keep the vision encoder frozen (LoRA or not).")
    freeze_audio_tower: bool = option(True, "Keep the audio encoder frozen (LoRA or not).")


@register_adapter("Qwen3OmniMoeForConditionalGeneration", stage="thinker")
class Qwen3OmniThinkerAdapter(AutoregressiveModelBase):
    options_class = Qwen3OmniOptions
    checkpoint_prefix = "thinker."
    # The talker stages say whether the thinker trains with them (`SpeechModelBase`); this one trains it.
    trains_thinker: ClassVar[bool] = True
    default_lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    supports_kv_cache = True
    # The chat template shows tools and tool turns, and a tool turn's image parts are fed as
    # images (`encode_media_text`, continued on the cache by `forward_logits`).
    takes_tools = True
    takes_images = True

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

        super().__init__(cfg, path, device)
        self._full = self.load_pretrained(Qwen3OmniMoeForConditionalGeneration)
        self.processor = AutoProcessor.from_pretrained(path)
        self.tokenizer = self.processor.tokenizer
        if getattr(self.processor, "chat_template", None) is None:
            raise ValueError(
                f"the processor at {path!r} has no chat template; use an instruct checkpoint of "
                f"Qwen3-Omni or save one with the processor"
            )
        self.strip_for_training()
        self.thinker.to(device)
        config = self.thinker.config
        self.image_token_id = config.image_token_id
        self.placeholder_token_ids = [config.image_token_id, config.video_token_id, config.audio_token_id]
        self.spatial_merge_size = config.vision_config.spatial_merge_size
        self.position_id_per_seconds = int(config.position_id_per_seconds)
        vision = config.vision_config
        self.patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        self.num_mel_bins = config.audio_config.num_mel_bins
        if cfg.gradient_checkpointing and config.text_config.attention_dropout:
            raise ValueError(
                f"model.gradient_checkpointing=true needs the decoder layers in training mode, which "
                f"would turn on this checkpoint's attention_dropout={config.text_config.attention_dropout}; "
                f"set model.gradient_checkpointing=false or a checkpoint config with attention_dropout 0"
            )
        self.setup_trainable()

    # --- modules --------------------------------------------------------------------------
    def strip_for_training(self) -> None:
        """Keep only the thinker: the talker (and its code predictor) and code2wav are deleted."""
        full = self._full
        for name in ("talker", "code2wav"):
            if hasattr(full, name):
                delattr(full, name)
        full.has_talker = False
        self.thinker = full.thinker
        self.model = self.thinker
        del self._full

    def trainable_module(self):
        return self.model

    def thinker_module(self):
        """The thinker as `forward_logits` runs it: the trained module (with its LoRA) here; the
        talker stage, which trains the talker, returns its frozen thinker."""
        return self.model

    def towers(self) -> dict[str, torch.nn.Module]:
        return {"visual": self.thinker.model.visual, "audio_tower": self.thinker.model.audio_tower}

    def fsdp_wrap_classes(self):
        inner = self.thinker.model
        return (type(inner.language_model.layers[0]), type(inner.visual.blocks[0]), type(inner.audio_tower.layers[0]))

    def lora_targets(self) -> str:
        """One regex (PEFT full-matches it against module names) that scopes each configured
        suffix to the language model, or to the tower its `visual.` / `audio_tower.` prefix names."""
        patterns = []
        for name in self.cfg.lora.target_modules or self.default_lora_targets:
            scope, suffix = "language_model", name
            if name.startswith(("visual.", "audio_tower.")):
                scope, _, suffix = name.partition(".")
            patterns.append(rf"(?:.*\.)?model\.{scope}\.(?:.*\.)?{re.escape(suffix)}")
        return "|".join(f"(?:{p})" for p in patterns)

    def setup_trained_modules(self) -> None:
        super().setup_trained_modules()
        if not self.trains_thinker:
            return  # the talker stage: the thinker is frozen whole (and absent from a plan's build)
        frozen = {"visual": self.options.freeze_vision_tower, "audio_tower": self.options.freeze_audio_tower}
        for name, tower in self.towers().items():
            if frozen[name]:
                tower.requires_grad_(False)

    def enable_checkpointing(self, module) -> None:
        thinker = self.thinker
        enable = getattr(thinker, "activation_checkpointing_enable", None) or thinker.gradient_checkpointing_enable
        enable({"use_reentrant": False})

    def checkpointed_layers(self) -> list:
        return list(self.thinker.model.language_model.layers)

    def router_modules(self) -> list[torch.nn.Module]:
        """The text model's routers (`mlp.gate` of each sparse layer), for routing replay
        (`algo.family_options.routing_replay`); the towers are dense."""
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextSparseMoeBlock

        return [layer.mlp.gate for layer in self.thinker.model.language_model.layers
                if isinstance(layer.mlp, Qwen3OmniMoeThinkerTextSparseMoeBlock)]

    def new_cache(self) -> ThinkerCache:
        from transformers import DynamicCache

        return ThinkerCache(DynamicCache())

    # --- prompts --------------------------------------------------------------------------
    def encode_prompt(self, messages: list[dict[str, Any]], media: dict[str, Any] | None = None) -> PromptInputs:
        media = dict(media or {})
        unknown = sorted(set(media) - {"images", "audio"})
        if unknown:
            raise ValueError(
                f"media has {unknown}; the Qwen3-Omni thinker adapter takes 'images' (PIL images) and "
                f"'audio' ((samples, sample_rate) pairs); video is not supported: pass frames as images"
            )
        images = list(media.get("images") or [])
        self._check_images(images)
        clips = [self._audio_clip(clip, k) for k, clip in enumerate(media.get("audio") or [])]
        messages = self._place_media(messages, len(images), len(clips))
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if isinstance(text, (list, tuple)):
            text = text[0]
        return self._encode(text, images, clips)

    def chat_text(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                  add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False,
            chat_template=self.processor.chat_template)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_media_text(self, text: str, images: list[Any] | None = None) -> PromptInputs:
        images = list(images or [])
        self._check_images(images)
        given = text.count(self.processor.image_token)
        if given != len(images):
            raise ValueError(f"the text has {given} image placeholders ({self.processor.image_token}) but {len(images)} "
                             f"images were given; render one image part per image")
        return self._encode(text, images, [])

    def image_tokens(self, height: int, width: int) -> int:
        """The processor's resize to multiples of patch x merge pixels (rounded; its pixel limits
        are not applied), one token per merged patch, plus the vision start and end markers. Read
        from the thinker's config, so the planner's weightless build answers it too."""
        vision = self.thinker.config.vision_config
        factor = vision.patch_size * vision.spatial_merge_size
        rows, cols = (max(1, round(side / factor)) for side in (height, width))
        return rows * cols + 2

    @staticmethod
    def _check_images(images: list[Any]) -> None:
        for k, image in enumerate(images):
            if not hasattr(image, "convert") or not hasattr(image, "size"):
                raise ValueError(f"media['images'][{k}] is a {type(image).__name__}; expected a PIL image")

    def _encode(self, text: str, images: list[Any], clips: list[np.ndarray]) -> PromptInputs:
        """The processor on template text: ids with the placeholder runs expanded, and the media tensors."""
        kwargs = {}
        if clips:
            kwargs["audio_kwargs"] = {"sampling_rate": self.processor.feature_extractor.sampling_rate}
        out = self.processor(
            text=[text], images=images or None, audio=clips or None, return_tensors="pt", **kwargs
        )
        prompt_media = {
            "pixel_values": torch.zeros(0, self.patch_dim),
            "image_grid_thw": torch.zeros(0, 3, dtype=torch.long),
            "audio_features": torch.zeros(0, self.num_mel_bins),
            "audio_feature_lengths": torch.zeros(0, dtype=torch.long),
        }
        if images:
            prompt_media["pixel_values"] = out["pixel_values"].float()
            prompt_media["image_grid_thw"] = out["image_grid_thw"].long()
        if clips:
            lengths = out["feature_attention_mask"].sum(-1).long()
            features = out["input_features"].float()
            prompt_media["audio_features"] = torch.cat([f[:, :n].T for f, n in zip(features, lengths.tolist())])
            prompt_media["audio_feature_lengths"] = lengths
        return PromptInputs(input_ids=out["input_ids"][0].long(), media=prompt_media)

    def _audio_clip(self, clip: Any, k: int) -> np.ndarray:
        if not isinstance(clip, (tuple, list)) or len(clip) != 2:
            raise ValueError(
                f"media['audio'][{k}] is a {type(clip).__name__}; expected a (float32 mono numpy array, "
                f"sample_rate) pair"
            )
        samples, rate = clip
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1 or samples.size == 0:
            raise ValueError(
                f"media['audio'][{k}] has samples of shape {samples.shape}; expected a non-empty 1-D mono "
                f"array (average the channels first)"
            )
        if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate <= 0:
            raise ValueError(f"media['audio'][{k}] has sample_rate {rate!r}; expected a positive int (Hz)")
        target = int(self.processor.feature_extractor.sampling_rate)
        return samples if int(rate) == target else resample_audio(samples, int(rate), target)

    @staticmethod
    def _place_media(messages: list[dict[str, Any]], n_images: int, n_audio: int) -> list[dict[str, Any]]:
        """Messages with one image/audio content part per medium: kept when the messages already
        mark them, else inserted before the text of the first user message."""
        messages = [dict(m) for m in messages]
        counts = {"image": 0, "audio": 0}
        for m in messages:
            if isinstance(m.get("content"), (list, tuple)):
                for part in m["content"]:
                    if isinstance(part, dict) and part.get("type") in counts:
                        counts[part["type"]] += 1
        for kind, given in (("image", n_images), ("audio", n_audio)):
            if counts[kind] not in (0, given):
                raise ValueError(
                    f"the messages have {counts[kind]} {{'type': '{kind}'}} parts but media has {given} "
                    f"{kind}s; mark every {kind} with one part, in order, or mark none (then they go before "
                    f"the text of the first user message)"
                )
        missing = [{"type": "image"}] * (n_images if counts["image"] == 0 else 0)
        missing += [{"type": "audio"}] * (n_audio if counts["audio"] == 0 else 0)
        if missing:
            users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
            if not users:
                raise ValueError("the prompt has media but no user message to attach them to; add a user message")
            first = messages[users[0]]
            content = first["content"]
            parts = list(content) if isinstance(content, (list, tuple)) else [{"type": "text", "text": content}]
            first["content"] = missing + parts
        return messages

    # --- forward --------------------------------------------------------------------------
    def rope_positions(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Multimodal rotary positions [3, B, T] (int64; 0 on padding) and each row's offset [B]
        (next position minus attended-token count), counting only attended tokens. Images are
        matched to `image_grid_thw` rows in batch order, one run of placeholder tokens each."""
        batch, width = input_ids.shape
        grids = [] if image_grid_thw is None else image_grid_thw.tolist()
        merge, per_second = self.spatial_merge_size, self.position_id_per_seconds
        positions = torch.zeros(3, batch, width, dtype=torch.long)
        deltas = torch.zeros(batch, dtype=torch.long)
        ids_cpu, mask_cpu = input_ids.cpu(), attention_mask.cpu().bool()
        g = 0
        for b in range(batch):
            ids = ids_cpu[b, mask_cpu[b]]
            row = torch.empty(3, ids.numel(), dtype=torch.long)
            image_at = (ids == self.image_token_id).nonzero().squeeze(1).tolist()
            cursor, nxt, k = 0, 0, 0
            while k < len(image_at):
                start = image_at[k]
                row[:, cursor:start] = torch.arange(nxt, nxt + start - cursor)
                nxt += start - cursor
                if g >= len(grids):
                    raise ValueError(
                        f"row {b} has more images (placeholder runs) than image_grid_thw has rows ({len(grids)}); "
                        f"pass the media of every prompt in the batch, in row order"
                    )
                t, h, w = grids[g]
                gh, gw = h // merge, w // merge
                n = t * gh * gw
                if image_at[k : k + n] != list(range(start, start + n)):
                    raise ValueError(
                        f"row {b}: image {g} has grid {(t, h, w)} ({n} tokens) but its placeholder run at column "
                        f"{start} is shorter; the prompt's tokens and media do not belong together"
                    )
                grid = torch.stack([
                    torch.arange(t).repeat_interleave(gh * gw) * per_second,
                    torch.arange(gh).repeat_interleave(gw).repeat(t),
                    torch.arange(gw).repeat(t * gh),
                ]) + nxt
                row[:, start : start + n] = grid
                nxt = int(grid.max()) + 1
                cursor, k, g = start + n, k + n, g + 1
            row[:, cursor:] = torch.arange(nxt, nxt + ids.numel() - cursor)
            nxt += ids.numel() - cursor
            positions[:, b, mask_cpu[b]] = row
            deltas[b] = nxt - ids.numel()
        if g != len(grids):
            raise ValueError(
                f"image_grid_thw has {len(grids)} images but the input ids hold {g}; pass exactly the media "
                f"of the prompts in the batch"
            )
        return positions.to(input_ids.device), deltas.to(input_ids.device)

    def _model_media(self, media: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The prompt media keys -> the thinker's forward arguments (nothing for absent media)."""
        unknown = sorted(set(media) - set(MEDIA_KEYS))
        if unknown:
            raise ValueError(f"media keys {unknown} are unknown; expected those of encode_prompt: {list(MEDIA_KEYS)}")
        out: dict[str, torch.Tensor] = {}
        grid = media.get("image_grid_thw")
        if grid is not None and grid.numel():
            out["pixel_values"] = media["pixel_values"].to(self.device)
            out["image_grid_thw"] = grid.to(self.device)
        lengths = media.get("audio_feature_lengths")
        if lengths is not None and lengths.numel():
            frames = media["audio_features"]
            sizes = lengths.tolist()
            if sum(sizes) != frames.shape[0]:
                raise ValueError(
                    f"audio_features has {frames.shape[0]} frames but audio_feature_lengths sums to {sum(sizes)}; "
                    f"collate both keys from the same prompts"
                )
            features = frames.new_zeros(len(sizes), max(sizes), frames.shape[1])
            mask = torch.zeros(len(sizes), max(sizes), dtype=torch.long)
            for i, chunk in enumerate(frames.split(sizes)):
                features[i, : sizes[i]] = chunk
                mask[i, : sizes[i]] = 1
            out["input_features"] = features.transpose(1, 2).to(self.device)
            out["feature_attention_mask"] = mask.to(self.device)
        return out

    def forward_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        media: dict[str, torch.Tensor] | None = None,
        cache: Any = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, Any]:
        """Logits [B, T, V] (fp32, placeholders blocked; the last `logits_to_keep` positions only
        when > 0) and the cache.

        Positions: None -> computed from the mask and media (the whole sequence, or, after a
        cached prefill, the new tokens' mask positions plus the cache's offsets); [B, T] text
        positions -> shifted by the cache's offsets (cached decoding); [3, B, T] -> used as given."""
        if cache is not None and not isinstance(cache, ThinkerCache):
            raise TypeError(f"cache is a {type(cache).__name__}; expected the adapter's own, from model.new_cache()")
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        inputs = self._model_media(media or {})
        width = input_ids.shape[1]
        decoding = cache is not None and cache.rope_deltas is not None
        if decoding and "image_grid_thw" in inputs:
            # New tokens with images after a cached prefix (an agent's tool turn with its image):
            # the chunk's multimodal positions from its own placeholder runs, shifted to each row's
            # next free position, and the row's offset grown by what its images skipped. The same
            # positions `rope_positions` gives the whole sequence, since its layout is shift-invariant.
            if position_ids is not None and position_ids.dim() == 3:
                raise ValueError("pass 2-D (text) or no position_ids with images after a cached prefix; their "
                                 "multimodal positions are computed from the chunk's placeholder runs")
            chunk_mask = attention_mask[:, -width:]
            local, deltas = self.rope_positions(input_ids, chunk_mask, inputs["image_grid_thw"])
            start = attention_mask[:, :-width].long().sum(-1) + cache.rope_deltas
            position_ids = (local + start[None, :, None]) * chunk_mask[None].long()
            cache.rope_deltas = cache.rope_deltas + deltas
        elif position_ids is None or position_ids.dim() == 2:
            if decoding:
                text = positions_from_mask(attention_mask)[:, -width:] if position_ids is None else position_ids
                position_ids = text.to(self.device).long() + cache.rope_deltas[:, None]
                position_ids = position_ids.unsqueeze(0).expand(3, -1, -1)
            elif position_ids is None:
                if width != attention_mask.shape[1]:
                    raise ValueError(
                        f"input_ids has {width} columns but attention_mask {attention_mask.shape[1]}; without a "
                        f"prefilled cache the whole sequence is needed to place multimodal positions"
                    )
                position_ids, deltas = self.rope_positions(input_ids, attention_mask, inputs.get("image_grid_thw"))
                if cache is not None:
                    cache.rope_deltas = deltas
            else:
                raise ValueError(
                    "2-D position_ids are text positions; Qwen3-Omni needs multimodal ones: pass None (computed "
                    "from the mask and media) or [3, B, T] positions"
                )
        elif cache is not None and not decoding:
            # A prefill at given positions: the offsets that later text positions need, from them.
            cache.rope_deltas = position_ids[0, :, -1].to(self.device).long() + 1 - attention_mask.long().sum(-1)
        module = self.thinker_module()
        with _lm_head_on_last(module, logits_to_keep):
            out = module(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids.to(self.device),
                cache=None if cache is None else cache.kv,
                use_cache=cache is not None,
                **inputs,
            )
        if cache is not None:
            cache.kv = out.cache
        blocked = torch.tensor(self.placeholder_token_ids, device=out.logits.device)
        return out.logits.float().index_fill(-1, blocked, BLOCKED_LOGIT), cache


@contextlib.contextmanager
def _lm_head_on_last(module, keep: int):
    """Within the block, the thinker's `lm_head` sees only the last `keep` positions (all when 0).

    Qwen3-Omni's thinker has no `logits_to_keep`; a forward pre-hook on its head (PyTorch's hook
    API, removed on exit) cuts the hidden states it is given, inside the thinker's own forward, so
    an FSDP2 root's gathering of the head still runs as in training."""
    if keep <= 0:
        yield
        return
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    handle = base.lm_head.register_forward_pre_hook(lambda _, args: (args[0][:, -keep:], *args[1:]))
    try:
        yield
    finally:
        handle.remove()
