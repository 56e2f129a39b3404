"""Qwen3-Omni's talker (`model.stage=talker`, `thinker_talker`): RL on how the omni model speaks.

The speech path of `Qwen3OmniMoeForConditionalGeneration` (transformers 5.x), as its `generate`
runs it, split into a sampler and a teacher-forced scorer that compute the same numbers
(`omni_rl.models.speech.SpeechModelBase`):

1. The thinker writes the answer (the text rollout engine, through `forward_logits`: the
   thinker adapter's, frozen for `talker`, trained for `thinker_talker`).
2. The talker's prefix, built from the thinker's input embeddings (frozen) by the talker's own
   `text_projection`: the prompt's user turns; the assistant header; 4 `tts_pad`, `tts_bos` and
   the answer's first token; added to codec embeddings of [0 (header), nothink, think_bos,
   think_eos, speaker, codec_pad, codec_bos] (transformers' `_get_talker_assistant_parts`).
3. Frame f: the talker's `codec_head` on its last hidden state gives the first-codebook token;
   the code predictor, fed [that hidden state, the token's talker embedding] and then each
   residual token's embedding, gives the K - 1 residual tokens with its `lm_head[j]`. The next
   talker input is the sum of the frame's K code embeddings plus the answer's next token
   (projected), then `tts_eos`, then `tts_pad` (the trailing text, one per frame).
4. A frame whose first token is `codec_eos_token_id` ends the utterance. code2wav (frozen)
   turns the frames before it into a 24 kHz waveform (`model.adapter_options.sample_rate`).

The first codebook never samples the codec's special ids ([codebook_size, vocab) but the end
token; transformers' `suppress_tokens`), nor a residual codebook ids past the codebook: their
logits are set to -1e9, in sampling and training alike. Sampling is of the whole tempered
distribution (no top-k, top-p, repetition penalty); temperature 0 is greedy.

What trains (`model.adapter_options.trainable`): `talker` (the talker's decoder, projections and heads;
not the code predictor), `code_predictor`, or `both`; with LoRA (the default: q/k/v/o projections
of the chosen part's decoder layers) or full weights (`model.lora.enabled=false`). The thinker and
code2wav are frozen. `model.stage=thinker_talker` trains the thinker too (LoRA on its language
model, as the thinker stage does): one trajectory of its answer tokens, then the frames.

Prompts are text: the talker is conditioned on the thinker's input embeddings, and a prompt with
images or audio would need the thinker's hidden states at the media positions and their 3-D
rotary positions (`hidden_projection`), which this adapter does not build: it refuses media.
Voice cloning from reference audio is not possible either: it needs Qwen3-Omni's audio tokenizer,
which is not released; the voice is one of the checkpoint's speakers (`model.adapter_options.speaker`).

Its tiny model is in `adapters/tiny/qwen3_omni_talker.py`,
its view for the planner in `adapters/plan/qwen3_omni_talker.py`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

import torch

from omni_rl.option import option
from omni_rl.config.schema import ModelConfig
from omni_rl.errors import OmniConfigError
from omni_rl.models import register_adapter
from omni_rl.models.autoregressive import PromptInputs, positions_from_mask
from omni_rl.models.speech import SpeechModelBase, SpeechSample

from adapters.qwen3_omni import BLOCKED_LOGIT, Qwen3OmniOptions, Qwen3OmniThinkerAdapter

TRAINABLE = ("talker", "code_predictor", "both")
# transformers' `_get_talker_assistant_parts`: 4 tts_pad between the header and tts_bos.
HEADER_PADS = 4


class NoTalkerError(OmniConfigError):
    """`model.stage=talker` on a checkpoint without a talker."""


@dataclasses.dataclass
class Qwen3OmniTalkerOptions(Qwen3OmniOptions):
    """The talker stage's options (`model.adapter_options`); the tower options are the thinker's."""

    trainable: str = option("talker", "What trains: talker (its decoder and heads), code_predictor, or both.")
    speaker: str = option("", "The voice: a key of the checkpoint's talker_config.speaker_id (e.g. ethan, chelsie); "
                              "empty = ethan if the checkpoint has it, else its first.")
    sample_rate: int = option(24000, "Hz of code2wav's waveform (Qwen3-Omni: 24000).")

    def check(self) -> None:
        if self.trainable not in TRAINABLE:
            raise ValueError(f"trainable={self.trainable!r}: expected one of {', '.join(TRAINABLE)}")
        if self.sample_rate < 1:
            raise ValueError(f"sample_rate={self.sample_rate!r}: expected a positive rate in Hz")


def check_has_talker(path: str) -> None:
    """One-line error before any weight loads when the checkpoint at `path` has no talker."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    if not getattr(config, "enable_audio_output", False) or getattr(config, "talker_config", None) is None:
        raise NoTalkerError(
            f"model.stage=talker: the checkpoint at {path!r} has no talker (enable_audio_output=false: a thinker-only "
            f"release such as Qwen3-Omni-30B-A3B-Thinking, or one saved with its talker stripped); use a checkpoint "
            f"that speaks (Qwen/Qwen3-Omni-30B-A3B-Instruct) or model.stage=thinker"
        )


@register_adapter("Qwen3OmniMoeForConditionalGeneration", stage="talker")
class Qwen3OmniTalkerAdapter(SpeechModelBase, Qwen3OmniThinkerAdapter):
    options_class = Qwen3OmniTalkerOptions
    checkpoint_prefix = "talker."
    trains_thinker: ClassVar[bool] = False
    # The speech stages run no agent: their prompts are text only (`encode_prompt` refuses media).
    takes_tools = False
    takes_images = False

    def __init__(self, cfg: ModelConfig, path: str, device: torch.device):
        check_has_talker(path)
        Qwen3OmniThinkerAdapter.__init__(self, cfg, path, device)
        talker = self.config.talker_config
        self.num_code_groups = talker.num_code_groups
        self.codec_eos_id = talker.codec_eos_token_id
        self.codebook_size = self.config.code2wav_config.codebook_size
        speakers = {k.lower(): v for k, v in talker.speaker_id.items()}
        name = self.options.speaker.lower() or ("ethan" if "ethan" in speakers else next(iter(speakers)))
        if name not in speakers:
            raise OmniConfigError(f"model.adapter_options.speaker={self.options.speaker!r}: expected one of the checkpoint's "
                                  f"speakers {sorted(speakers)}")
        self.speaker_id = speakers[name]
        vocab = talker.text_config.vocab_size
        first = torch.zeros(vocab, dtype=torch.bool)
        first[self.codebook_size:] = True
        first[self.codec_eos_id] = False
        self._blocked_first = first.nonzero().squeeze(1).to(device)
        cp_vocab = talker.code_predictor_config.vocab_size
        self._blocked_residual = torch.arange(self.codebook_size, cp_vocab, device=device)

    @classmethod
    def check_model_limits(cls, cfg, configs) -> None:
        """`rollout.sampling_options.max_frames` within the talker's positions: each frame is one
        position of the talker's sequence after the prompt, so more frames than its
        `max_position_embeddings` cannot be spoken."""
        talker = ((configs.get("") or {}).get("talker_config") or {}).get("text_config") or {}
        limit = talker.get("max_position_embeddings")
        max_frames = cfg.rollout.sampling_options.max_frames
        if isinstance(limit, int) and max_frames > limit:
            raise ValueError(f"rollout.sampling_options.max_frames={max_frames}: the talker of {cfg.model.path!r} has "
                             f"{limit} positions (talker_config.text_config.max_position_embeddings), each frame one "
                             f"of them after the prompt; set at most {limit}")

    # --- modules --------------------------------------------------------------------------
    def strip_for_training(self) -> None:
        """Keep the talker (with its code predictor) and code2wav beside the thinker."""
        full = self._full
        self.config = full.config
        self.thinker, self.talker, self.code2wav = full.thinker, full.talker, full.code2wav
        self.talker.to(self.device)
        self.code2wav.to(self.device)
        self.model = self.talker
        del self._full

    def thinker_module(self):
        return self.thinker

    def trainable_module(self):
        return self.model

    def frozen_modules(self) -> list:
        return [self.thinker, self.code2wav]

    def context_length(self):
        value = self.thinker.config.text_config.max_position_embeddings
        return value if isinstance(value, int) and value >= 1 else None

    def fsdp_wrap_classes(self):
        return (type(self.talker.model.layers[0]), type(self.talker.code_predictor.model.layers[0]))

    def talker_lora_pattern(self) -> str:
        """The regex (PEFT full-matches module names inside the talker) of the LoRA targets in the
        part `model.adapter_options.trainable` names."""
        suffixes = "|".join(re.escape(s) for s in (self.cfg.lora.target_modules or self.default_lora_targets))
        parts = {"talker": [r"model\.layers"], "code_predictor": [r"code_predictor\.model\.layers"],
                 "both": [r"model\.layers", r"code_predictor\.model\.layers"]}[self.options.trainable]
        return "|".join(rf"(?:{p}\.\d+\.(?:.*\.)?(?:{suffixes}))" for p in parts)

    def lora_targets(self) -> str:
        return self.talker_lora_pattern()

    def setup_trained_modules(self) -> None:
        super().setup_trained_modules()
        if not self.cfg.lora.enabled:  # full weights: only the named part
            trainable = self.options.trainable
            if trainable == "talker":
                self.talker.code_predictor.requires_grad_(False)
            elif trainable == "code_predictor":
                self.talker.requires_grad_(False)
                self.talker.code_predictor.requires_grad_(True)

    def enable_checkpointing(self, module) -> None:
        self.talker.gradient_checkpointing_enable({"use_reentrant": False})

    def checkpointed_layers(self) -> list:
        return list(self.talker.model.layers) + list(self.talker.code_predictor.model.layers)

    @property
    def sample_rate(self) -> int:
        return self.options.sample_rate

    # --- prompts --------------------------------------------------------------------------
    def encode_prompt(self, messages, media=None) -> PromptInputs:
        if media and any(media.get(k) for k in media):
            raise ValueError(
                f"media has {sorted(k for k in media if media.get(k))}; the Qwen3-Omni talker stage takes text prompts "
                f"(its talker would need the thinker's hidden states at media positions, which this adapter does not "
                f"build): drop the media or use model.stage=thinker"
            )
        return super().encode_prompt(messages, None)

    # --- the talker's inputs ----------------------------------------------------------------
    def _project(self, ids: torch.Tensor) -> torch.Tensor:
        """The talker's view of thinker tokens: text_projection of their input embeddings, read
        without gradient. With `thinker_talker` and full weights the thinker's embedding table
        trains, and this keeps the frames' loss out of it: the thinker is trained by its answer's
        tokens alone and the talker by its frames alone, each half as its own stage would be
        (tests/omni_rl/families/test_talker.py)."""
        with torch.no_grad():
            embed = self.thinker.get_input_embeddings()(ids.to(self.device))
        return self.talker.text_projection(embed.to(self.talker.dtype))

    def _split_prompt(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the user turns' tokens, the assistant header's) of a prompt, split at <|im_start|>."""
        start = self.config.im_start_token_id
        at = (ids == start).nonzero().squeeze(1).tolist()
        if not at:
            raise ValueError("the prompt has no <|im_start|> token; encode it with the chat template (encode_prompt)")
        bounds = at + [len(ids)]
        user = []
        for a, b in zip(bounds[:-2], bounds[1:-1]):
            role = self.tokenizer.decode(ids[a + 1 : b].tolist()).split("\n", 1)[0].strip()
            if role == "user":
                user.append(ids[a:b])
        header = ids[at[-1]:]
        if self.tokenizer.decode(header[1:].tolist()).strip() != "assistant":
            raise ValueError("the prompt does not end with the assistant header; encode it with add_generation_prompt")
        return (torch.cat(user) if user else ids[:0]), header

    def _prefix(self, prompts: list[torch.Tensor], answers: list[torch.Tensor], width: int | None = None):
        """(prefix [B, Lp, H] left-padded to at least `width` columns, its mask [B, Lp], trailing
        text [B, T, H] (padded with tts_pad), the tts_pad embedding [H])."""
        cfg = self.config
        special = torch.tensor([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id])
        tts_bos, tts_eos, tts_pad = self._project(special).unbind(0)
        tc = cfg.talker_config
        codec_ids = torch.tensor([tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id, self.speaker_id,
                                  tc.codec_pad_id, tc.codec_bos_id], device=self.device)
        codec = self.talker.get_input_embeddings()(codec_ids)
        rows, trailing = [], []
        for prompt, answer in zip(prompts, answers):
            if len(answer) < 1:
                raise ValueError("an answer with no token; the thinker samples at least one (max_new_tokens >= 1)")
            user, header = self._split_prompt(prompt.cpu())
            h = len(header)
            text = torch.cat([self._project(header), tts_pad.expand(HEADER_PADS, -1), tts_bos[None],
                              self._project(answer[:1])])
            codes = torch.cat([codec.new_zeros(h, codec.shape[1]), codec])
            rows.append(torch.cat([self._project(user), text + codes]))
            trailing.append(torch.cat([self._project(answer[1:]), tts_eos[None]]))
        width, t_width = max(max(len(r) for r in rows), width or 0), max(len(t) for t in trailing)
        hidden = rows[0].shape[1]
        prefix = rows[0].new_zeros(len(rows), width, hidden)
        mask = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        text = tts_pad.expand(len(rows), t_width, hidden).clone()
        for i, (r, t) in enumerate(zip(rows, trailing)):
            prefix[i, width - len(r):] = r
            mask[i, width - len(r):] = 1
            text[i, : len(t)] = t
        return prefix, mask, text, tts_pad

    def _frame_embeds(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, n, H]: the sum of each frame's K code embeddings (the talker's for the first codebook,
        the code predictor's j-th table for residual codebook j + 1)."""
        out = self.talker.get_input_embeddings()(codes[..., 0])
        tables = self.talker.code_predictor.get_input_embeddings()
        for j in range(self.num_code_groups - 1):
            out = out + tables[j](codes[..., j + 1])
        return out

    def _text_at(self, text: torch.Tensor, tts_pad: torch.Tensor, frames: range) -> torch.Tensor:
        """[B, n, H]: the trailing text the talker reads after frames `frames` (tts_pad past its end)."""
        cols = [text[:, f] if f < text.shape[1] else tts_pad.expand(text.shape[0], -1) for f in frames]
        return torch.stack(cols, dim=1) if cols else text[:, :0]

    def _talker_hidden(self, embeds, mask, cache=None, new: int | None = None) -> torch.Tensor:
        positions = positions_from_mask(mask)
        if new is not None:
            positions = positions[:, -new:]
        out = self.talker.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=cache,
                                use_cache=cache is not None)
        return out.last_hidden_state

    def _first_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.talker.codec_head(hidden).float().index_fill(-1, self._blocked_first, BLOCKED_LOGIT)

    def _residual_logits(self, j: int, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.talker.code_predictor.lm_head[j](hidden).float()
        return logits.index_fill(-1, self._blocked_residual, BLOCKED_LOGIT) if self._blocked_residual.numel() else logits

    @staticmethod
    def _draw(logits: torch.Tensor, temperature: float, generators: list) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B], log-probs [B] at `temperature`) from logits [B, V]; greedy at temperature 0."""
        if temperature == 0:
            tokens = logits.argmax(-1)
            return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
        log_probs = torch.log_softmax(logits / temperature, -1)
        probs = log_probs.exp().cpu()
        tokens = torch.stack([torch.multinomial(p, 1, generator=g)[0] for p, g in zip(probs, generators)])
        tokens = tokens.to(logits.device)
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)

    # --- the speech contract ----------------------------------------------------------------
    @torch.no_grad()
    def sample_speech(self, prompts, answers, seeds, max_frames, temperature) -> SpeechSample:
        from transformers import DynamicCache

        prefix, mask, text, tts_pad = self._prefix(prompts, answers)
        prefix_width = prefix.shape[1]
        b, k = len(prompts), self.num_code_groups
        generators = [torch.Generator().manual_seed(int(s) % (1 << 63)) for s in seeds]
        codes = torch.zeros(b, max_frames, k, dtype=torch.long, device=self.device)
        frame_mask = torch.zeros(b, max_frames, device=self.device)
        log_probs = torch.zeros(b, max_frames, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        cache = DynamicCache()
        hidden = self._talker_hidden(prefix, mask, cache)[:, -1]
        predictor = self.talker.code_predictor
        for f in range(max_frames):
            c0, lp0 = self._draw(self._first_logits(hidden), temperature, generators)
            active = ~done
            codes[active, f, 0] = c0[active]
            frame_mask[active, f] = 1.0
            log_probs[active, f] = lp0[active]
            ends = active & (c0 == self.codec_eos_id)
            speak = (active & ~ends).nonzero().squeeze(1)
            if speak.numel() and k > 1:
                rows = speak.tolist()
                seq = torch.stack([hidden[speak], self.talker.get_input_embeddings()(c0[speak])], dim=1)
                for j in range(k - 1):
                    h = predictor.model(inputs_embeds=seq).last_hidden_state[:, -1]
                    c, lp = self._draw(self._residual_logits(j, h), temperature, [generators[r] for r in rows])
                    codes[speak, f, j + 1] = c
                    log_probs[speak, f] += lp
                    seq = torch.cat([seq, predictor.get_input_embeddings()[j](c)[:, None]], dim=1)
            done |= ends
            if bool(done.all()) or f == max_frames - 1:
                break
            step_in = self._frame_embeds(codes[:, f : f + 1]) + self._text_at(text, tts_pad, range(f, f + 1))
            mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
            hidden = self._talker_hidden(step_in, mask, cache, new=1)[:, -1]
        reasons = ["stop" if d else "length" for d in done.tolist()]
        return SpeechSample(codes.cpu(), frame_mask.cpu(), log_probs.float().cpu(), reasons, prefix_width)

    def speech_log_probs(self, prompts, answers, codes, frame_mask, temperature, prefix_width=None) -> torch.Tensor:
        prefix, mask, text, tts_pad = self._prefix(prompts, answers, prefix_width)
        codes = codes.to(self.device)
        b, frames, k = codes.shape
        width = prefix.shape[1]
        inputs = self._frame_embeds(codes[:, : frames - 1]) + self._text_at(text, tts_pad, range(frames - 1))
        mask = torch.cat([mask, mask.new_ones(b, frames - 1)], dim=1)
        hidden = self._talker_hidden(torch.cat([prefix, inputs], dim=1), mask)[:, width - 1 :]  # [B, F, H]
        first = torch.log_softmax(self._first_logits(hidden) / temperature, -1)
        out = first.gather(-1, codes[..., :1]).squeeze(-1)
        if k > 1:
            predictor = self.talker.code_predictor
            tables = predictor.get_input_embeddings()
            seq = [hidden, self.talker.get_input_embeddings()(codes[..., 0])]
            seq += [tables[j](codes[..., j + 1]) for j in range(k - 2)]
            seq = torch.stack(seq, dim=2).reshape(b * frames, k, -1)
            h = predictor.model(inputs_embeds=seq).last_hidden_state.reshape(b, frames, k, -1)
            residual = torch.stack([
                torch.log_softmax(self._residual_logits(j, h[:, :, j + 1]) / temperature, -1)
                .gather(-1, codes[..., j + 1 : j + 2]).squeeze(-1)
                for j in range(k - 1)
            ], dim=-1).sum(-1)
            out = out + residual * (codes[..., 0] != self.codec_eos_id)
        return out.float()

    @torch.no_grad()
    def decode_speech(self, codes, frame_mask) -> list[torch.Tensor]:
        upsample = int(self.code2wav.total_upsample)
        waves = []
        for row, m in zip(codes, frame_mask):
            spoken = row[(m > 0) & (row[:, 0] != self.codec_eos_id)]
            if not len(spoken):
                waves.append(torch.zeros(upsample))
                continue
            wav = self.code2wav.chunked_decode(spoken.T[None].to(self.device), chunk_size=300, left_context_size=25)
            waves.append(wav.reshape(-1).float().cpu())
        return waves


@register_adapter("Qwen3OmniMoeForConditionalGeneration", stage="thinker_talker")
class Qwen3OmniThinkerTalkerAdapter(Qwen3OmniTalkerAdapter):
    """Both halves train: the thinker's language model (LoRA, as the thinker stage puts it, or full
    weights) and the talker part `model.adapter_options.trainable` names."""

    trains_thinker: ClassVar[bool] = True

    def strip_for_training(self) -> None:
        super().strip_for_training()
        self.thinker_trained = self.thinker

    def thinker_module(self):
        return self.thinker_trained

    def trainable_modules(self) -> dict:
        return {"thinker": self.thinker_trained, "talker": self.model}

    def frozen_modules(self) -> list:
        return [self.code2wav]

    def lora_targets(self) -> str:
        return f"{Qwen3OmniThinkerAdapter.lora_targets(self)}|{self.talker_lora_pattern()}"

    def add_lora(self, module, config):
        from peft import get_peft_model

        wrapped = get_peft_model(module, config)
        if module is self.thinker:
            self.thinker_trained = wrapped
        else:
            self.model = wrapped
        return wrapped

    def lora_disabled(self):
        raise NotImplementedError("model.stage=thinker_talker has no reference policy (the talker family refuses "
                                  "algo.kl_coef > 0)")

    def setup_trained_modules(self) -> None:
        super().setup_trained_modules()
        if not self.cfg.lora.enabled:
            for name, tower in self.towers().items():
                tower.requires_grad_(not getattr(self.options, f"freeze_{'vision' if name == 'visual' else 'audio'}_tower"))

    def save_lora(self, folder: str) -> None:
        for name, module in self.trainable_modules().items():
            module.save_pretrained(f"{folder}/{name}")

    def save_full(self, folder: str) -> None:
        for name, module in self.trainable_modules().items():
            module.save_pretrained(f"{folder}/{name}")
        self.tokenizer.save_pretrained(f"{folder}/thinker")
