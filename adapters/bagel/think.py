"""BAGEL's "think, then draw" (`model.adapter=BagelForConditionalGeneration model.stage=think`): the adapter.

The model writes a short plan, then draws the image conditioned on the prompt and the plan, as
the official think mode of `InterleaveInferencer.interleave_inference` does for text-to-image:

1. **The plan's context** is the system prompt that asks for a plan (`THINK_SYSTEM_PROMPT`, the
   official generation-think prompt, which the checkpoint was trained to follow), then the
   prompt, each a `<|im_start|> ... <|im_end|>` piece (the official `prepare_prompts`), then
   `<|im_start|>`: the official `prepare_start_tokens`, after which the plan is sampled.
2. **The plan** is sampled token by token from the understanding expert, its final `norm` and
   `lm_head` (the official `generate_text`), at `rollout.sampling_options.temperature` (0: greedy), each sample
   from a generator of its own seed, until `<|im_end|>` or `rollout.sampling_options.max_new_tokens` tokens. The
   sampled `<|im_end|>` is an action like any other token. Sampling recomputes the whole
   sequence for each token, with the plan padded to its full width from the first token (so
   sampling and training forwards have one shape): right for the tiny model; a KV cache is left
   for real sizes, where a plan of hundreds of tokens over a 7B decoder needs one.
3. **The image's context** is the system prompt, the prompt and `<|im_start|> plan <|im_end|>`
   (the official `update_context_text(gen_text)`: the plan re-enters as a text piece of its
   own; here as the sampled ids, which the official code gets back by decoding and encoding
   again). Text CFG's unconditional context is the system prompt alone (the official
   `cfg_text_context`, taken before the prompt), or the system prompt and
   `rollout.sampling_options.negative_prompt` when one is given.
4. **CFG toward the plan** (`model.adapter_options.plan_guidance_scale` > 1): the official think mode's
   `cfg_img_scale` (`interleave_inference` defaults it to 1.5) guides by a third context, its
   `cfg_img_context`: the system prompt and the prompt, without the plan (and without the
   negative prompt). With `ui` that branch's velocity, `v = ui + s (t - ui)` after text CFG `t`
   (adapters/bagel/adapter.py's `guided_velocity`, the renorm as `model.adapter_options.cfg_renorm_type`
   says). The official notebook's think cell (`inference.ipynb`) passes `cfg_img_scale` 1: off.
   As in the official code it applies only together with text CFG. Image CFG needs a source
   image: refused, as in text-to-image. Everything else of text-to-image holds
   (adapters/bagel/adapter.py: latents, schedule, CFG interval and renorm, exports).

Widths are fixed, so a plan's log-probs and an image's velocity never depend on their batch-
mates' lengths: the plan's context is padded to the system prompt plus `model.adapter_options.max_sequence_length`
prompt tokens, plans to `rollout.sampling_options.max_new_tokens`.

**What trains.** With LoRA (the default targets `default_lora_targets`): adapters on both experts'
attention and MLP projections, the generation expert's (`*_moe_gen`, as text-to-image) and the
understanding expert's (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `mlp.gate_proj`, `mlp.up_proj`,
`mlp.down_proj`): the plan's tokens come from the understanding expert, and the image reads the
plan through it too, so the flow loss also reaches the understanding side. Without LoRA, both
experts' decoder weights train (every decoder-layer tensor, both final norms), with the
generation side of text-to-image (time embedder, `vae2llm`, `llm2vae`); the token embeddings,
`lm_head`, the connector, the position tables and the VAE stay frozen.
"""
from __future__ import annotations

import torch

from omni_rl.models import Conditioning, ThinkDrawModelBase, register_adapter
from omni_rl.models.think_draw import plan_token

from adapters.bagel.adapter import (
    ARCHITECTURE, BOS, EOS, TEXT_MASKS, BagelAdapter, is_generation_parameter, padded,
)

STAGE = "think"
# The official generation-think system prompt (inferencer.py's GEN_THINK_SYSTEM_PROMPT): the
# checkpoint's think mode was trained on it, so it is reproduced as given.
THINK_SYSTEM_PROMPT = (
    "You should first think about the planning process in the mind and then generate the image. \n"
    "The planning process is enclosed within <think> </think> tags, i.e. <think> planning process here </think> "
    "image here"
)
UNDERSTANDING_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def is_understanding_decoder_parameter(name: str) -> bool:
    """The understanding expert's decoder tensors: every layer tensor without `_moe_gen`, and its final norm."""
    decoder = name.startswith("language_model.model.layers.") or name.startswith("language_model.model.norm.")
    return decoder and "_moe_gen" not in name


@register_adapter(ARCHITECTURE, stage=STAGE)
class BagelThinkAdapter(BagelAdapter, ThinkDrawModelBase):
    default_lora_targets = BagelAdapter.default_lora_targets + UNDERSTANDING_LORA_TARGETS

    def setup_trained_modules(self) -> None:
        """The base's freeze / LoRA; without LoRA both experts' decoders train (module docstring)."""
        super().setup_trained_modules()
        if not self.cfg.lora.enabled:
            for name, p in self.network.named_parameters():
                trains = is_generation_parameter(name) or is_understanding_decoder_parameter(name)
                p.requires_grad_(trains and "pos_embed" not in name)

    @classmethod
    def check_plan_guidance(cls, cfg) -> None:
        """CFG toward the plan applies only together with text CFG, as in the official code."""
        scale = cfg.model.adapter_options.plan_guidance_scale
        if scale > 1.0 and cfg.rollout.sampling_options.guidance_scale <= 1.0:
            raise ValueError(
                f"model.adapter_options.plan_guidance_scale={scale} with rollout.sampling_options.guidance_scale={cfg.rollout.sampling_options.guidance_scale}: "
                f"BAGEL applies its second guidance only together with text CFG; set rollout.sampling_options.guidance_scale > 1 "
                f"(BAGEL: 4), or model.adapter_options.plan_guidance_scale=1"
            )

    # --- the forward's second guidance (BagelAdapter.predict_velocity's hooks) ----------------
    def image_cfg_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.options.plan_guidance_scale > 1.0 else rows[:0]

    def image_cfg_scale(self) -> float:
        return self.options.plan_guidance_scale

    def image_cfg_text(self, cond: Conditioning) -> Conditioning:
        """The plan-free context, system prompt and prompt (module docstring, 4)."""
        if "plan_free_input_ids" not in cond.tensors:
            raise ValueError("model.adapter_options.plan_guidance_scale > 1 needs the plan-free context: encode the prompts "
                             "with encode_prompts_with_plans under that setting")
        return Conditioning({"e": cond["plan_free_input_ids"], "m": cond["plan_free_text_mask"]}, {"e": "m"})

    # --- tokens --------------------------------------------------------------------------
    @property
    def system_ids(self) -> list[int]:
        ids = self.__dict__.get("_system_ids")
        if ids is None:
            ids = self.__dict__["_system_ids"] = self.piece(THINK_SYSTEM_PROMPT)
        return ids

    def context_width(self) -> int:
        """The plan context's fixed width: system prompt, longest prompt piece, `<|im_start|>`."""
        return len(self.system_ids) + self.options.max_sequence_length + 2 + 1

    def plan_context(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) [B, context_width] of `system, prompt, <|im_start|>` (module docstring, 1)."""
        rows = [self.system_ids + self.piece(p, self.options.max_sequence_length) + [self.token_ids[BOS]] for p in prompts]
        return padded(rows, self.context_width())

    def decode_plan(self, ids: list[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i != self.token_ids[EOS]], skip_special_tokens=True)

    # --- the plan ------------------------------------------------------------------------
    def next_token_logits(self, context, plan_ids: torch.Tensor, plan_mask: torch.Tensor) -> torch.Tensor:
        """[B, R, V] fp32: row t is the distribution of plan token t (after the context and
        plan tokens 0 .. t-1)."""
        ids, mask = context
        logits = self.network.text_logits([(ids, mask), (plan_ids, plan_mask.long())])
        width = ids.shape[1]
        last = (mask.sum(1) - 1).to(logits.device)  # the context's `<|im_start|>`
        first = logits[torch.arange(ids.shape[0], device=logits.device), last]
        return torch.cat([first[:, None], logits[:, width : width + plan_ids.shape[1] - 1]], dim=1)

    @torch.no_grad()
    def sample_plans(self, prompts, seeds, max_new_tokens, temperature):
        b = len(prompts)
        context = self.plan_context(list(prompts))
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        ids = torch.zeros(b, max_new_tokens, dtype=torch.long)
        mask = torch.zeros(b, max_new_tokens, dtype=torch.float32)
        done = torch.zeros(b, dtype=torch.bool)
        eos = self.token_ids[EOS]
        for t in range(max_new_tokens):
            logits = self.next_token_logits(context, ids, mask)[:, t].cpu()
            for i in (~done).nonzero().flatten().tolist():
                token = plan_token(logits[i], temperature, gens[i])
                ids[i, t], mask[i, t] = token, 1.0
                done[i] = token == eos
            if bool(done.all()):
                break
        return ids, mask

    def plan_log_probs(self, prompts, plan_ids, plan_mask, temperature):
        logits = self.next_token_logits(self.plan_context(list(prompts)), plan_ids, plan_mask)
        targets = plan_ids.to(logits.device)
        return torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets[..., None]).squeeze(-1)

    # --- the image's context ---------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts_with_plans(self, prompts, plan_ids, plan_mask, negative_prompt: str = "") -> Conditioning:
        """`input_ids`: system, prompt, `<|im_start|> plan <|im_end|>`; `negative_input_ids`: the
        system prompt (and the negative prompt); with `model.adapter_options.plan_guidance_scale` > 1 also
        `plan_free_input_ids`: system and prompt; all at one fixed width (module docstring, 3, 4)."""
        eos = self.token_ids[EOS]
        rows, plan_free = [], []
        for prompt, row, m in zip(prompts, plan_ids, plan_mask):
            plan = [i for i in row[m.bool()].tolist() if i != eos]
            plan_free.append(self.system_ids + self.piece(prompt, self.options.max_sequence_length))
            rows.append(plan_free[-1] + [self.token_ids[BOS], *plan, eos])
        width = self.context_width() + plan_ids.shape[1] + 1
        ids, mask = padded(rows, width)
        negative = self.system_ids + (self.piece(negative_prompt, self.options.max_sequence_length) if negative_prompt else [])
        neg, neg_mask = padded([negative] * len(rows), width)
        tensors = {"input_ids": ids, "text_mask": mask, "negative_input_ids": neg, "negative_text_mask": neg_mask}
        masks = dict(TEXT_MASKS)
        if self.options.plan_guidance_scale > 1.0:
            tensors["plan_free_input_ids"], tensors["plan_free_text_mask"] = padded(plan_free, width)
            masks["plan_free_input_ids"] = "plan_free_text_mask"
        return Conditioning({k: v.to(self.device) for k, v in tensors.items()}, masks)
