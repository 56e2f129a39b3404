"""BAGEL against its official inference (issue 26, point 5): the three differences an outside
comparison found, each against numbers worked out by hand on tiny vectors, then on `tiny:bagel`.

1. Text-to-image: the official inferencer's `cfg_img_scale` s with no image in the context guides
   toward the prompt a second time (its image-unconditional context is the prompt itself), which
   is text CFG at `1 + s (g - 1)`: 4 with 1.5 is 5.5.
2. Think mode: CFG toward the plan (`model.adapter_options.plan_guidance_scale`), whose unconditional
   context is the system prompt and the prompt (tokens checked against the tokenizer's own).
3. Editing: the "text_channel" renorm (`model.adapter_options.cfg_renorm_type`): per token, on the
   text-guided velocity, before image CFG, which is not rescaled.

Velocity tensors here are [B, L, D]: samples, tokens, one token's numbers."""
import math

import pytest
import torch

from adapters.bagel.adapter import guided_velocity
from adapters.bagel.think import THINK_SYSTEM_PROMPT
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.models import Conditioning, build_model
from tests.adapters.diffusion_suite import model_config

ADAPTER = "BagelForConditionalGeneration"


def vec(*rows):
    return torch.tensor([rows], dtype=torch.float32)  # one sample of len(rows) tokens


# --- 1. text-to-image: the inferencer's image scale without an image ---------------------------------

def test_the_inferencers_image_scale_without_an_image_is_text_cfg_5_5_by_hand():
    c, u = vec([1.0, 2.0]), vec([1.0, 0.0])
    # Official, no image: ui = c. t = u + 4 (c - u) = (1, 8); v = c + 1.5 (t - c) = (1, 2) + 1.5 (0, 6) = (1, 11).
    # Text CFG 5.5: u + 5.5 (c - u) = (1, 0) + 5.5 (0, 2) = (1, 11).
    official = guided_velocity(c, u, 4.0, 1.0, image_uncond=c, image_scale=1.5)
    torch.testing.assert_close(official, vec([1.0, 11.0]))
    torch.testing.assert_close(guided_velocity(c, u, 5.5, 1.0), vec([1.0, 11.0]))
    # With the global renorm (min 0) both are rescaled to |c| = sqrt 5: (1, 11) sqrt(5 / 122).
    k = math.sqrt(5 / 122)
    torch.testing.assert_close(guided_velocity(c, u, 4.0, 0.0, c, 1.5), vec([k, 11 * k]))
    torch.testing.assert_close(guided_velocity(c, u, 5.5, 0.0), vec([k, 11 * k]))
    # Not under text_channel, which rescales t = (1, 8) to sqrt 5 first: t' = (1, 8) sqrt(5 / 65),
    # then c + 1.5 (t' - c); text CFG 5.5 there is (1, 11) sqrt(5 / 122).
    j = math.sqrt(5 / 65)
    torch.testing.assert_close(guided_velocity(c, u, 4.0, 0.0, c, 1.5, "text_channel"),
                               vec([1 + 1.5 * (j - 1), 2 + 1.5 * (8 * j - 2)]))
    torch.testing.assert_close(guided_velocity(c, u, 5.5, 0.0, renorm_type="text_channel"), vec([k, 11 * k]))


def test_text_to_image_refuses_both_second_guidances_and_says_what_to_do():
    base = ["model.adapter=BagelForConditionalGeneration", "model.path=tiny:bagel", "rollout.sampling_options.height=32",
            "rollout.sampling_options.width=32"]
    with pytest.raises(ConfigError, match=r"image_guidance_scale=1.5: .* text CFG at 1 \+ s \(g - 1\)"):
        load_config([*base, "model.adapter_options.image_guidance_scale=1.5"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.plan_guidance_scale=1.5: CFG toward the plan needs a plan"):
        load_config([*base, "model.adapter_options.plan_guidance_scale=1.5"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.plan_guidance_scale=1.5: CFG toward the plan needs a plan"):
        load_config([*base, "model.stage=edit", "model.adapter_options.plan_guidance_scale=1.5"])


# --- 2. think: CFG toward the plan ----------------------------------------------------------------

def test_cfg_toward_the_plan_by_hand():
    c, u, ui = vec([3.0, 4.0]), vec([0.0, 0.0]), vec([3.0, 0.0])  # ui: the plan-free context's velocity
    # t = u + 2 (c - u) = (6, 8); v = ui + 1.5 (t - ui) = (3, 0) + 1.5 (3, 8) = (7.5, 12).
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 1.0, ui, 1.5), vec([7.5, 12.0]))
    # global renorm, min 0: |c| = 5, |v| = sqrt(7.5^2 + 12^2) = sqrt(200.25)
    k = 5 / math.sqrt(200.25)
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 0.0, ui, 1.5), vec([7.5 * k, 12 * k]))


def think_model(**options):
    cfg = model_config(adapter=ADAPTER, stage="think", path="tiny:bagel", max_sequence_length=16,
                       cfg_interval=[0.4, 1.0], **options)
    return build_model(cfg, torch.device("cpu"))


@pytest.fixture(scope="module")
def planner():
    return think_model(plan_guidance_scale=1.5)


def test_the_plan_free_context_is_the_system_prompt_and_the_prompt_in_tokens(planner):
    tok = planner.tokenizer
    bos, eos = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    words = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids, mask = torch.tensor([[65, 66, 67]]), torch.ones(1, 3)
    cond = planner.encode_prompts_with_plans(["a cat"], ids, mask, negative_prompt="blurry")
    row = cond["plan_free_input_ids"][0][cond["plan_free_text_mask"][0].bool()].tolist()
    # The official think mode's cfg_img_context: the system prompt, then the prompt, each a
    # <|im_start|> ... <|im_end|> piece; no plan, no negative prompt.
    assert row == [bos, *words(THINK_SYSTEM_PROMPT), eos, bos, *words("a cat"), eos]
    assert cond["plan_free_input_ids"].shape == cond["input_ids"].shape  # one fixed width
    # Off (the default), the conditioning carries no such context.
    off = think_model().encode_prompts_with_plans(["a cat"], ids, mask)
    assert "plan_free_input_ids" not in off.tensors


@torch.no_grad()
def test_cfg_toward_the_plan_on_tiny_bagel_is_the_hand_formula_of_three_passes(planner):
    """One guided forward against three unguided ones (g = 1 takes the conditional rows only),
    each context given as the conditional text, combined by the formula written out here."""
    ids, mask = torch.tensor([[65, 66, 67], [70, 71, 0]]), torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    cond = planner.encode_prompts_with_plans(["a cat", "a red cube"], ids, mask)
    x = torch.randn(2, *planner.latent_shape(32, 32), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.3])  # inside and outside cfg_interval (0.4, 1]
    guided = planner.predict_velocity(x, sigma, cond, 4.0)

    def alone(key, mask_key):
        text = Conditioning({"input_ids": cond[key], "text_mask": cond[mask_key],
                             "negative_input_ids": cond["negative_input_ids"],
                             "negative_text_mask": cond["negative_text_mask"]},
                            {"input_ids": "text_mask", "negative_input_ids": "negative_text_mask"})
        return planner.predict_velocity(x, sigma, text, 1.0)

    c = alone("input_ids", "text_mask")
    u = alone("negative_input_ids", "negative_text_mask")
    ui = alone("plan_free_input_ids", "plan_free_text_mask")
    v = ui[0] + 1.5 * (u[0] + 4.0 * (c[0] - u[0]) - ui[0])
    v = v * (c[0].norm() / v.norm()).clamp(0.0, 1.0)
    torch.testing.assert_close(guided[0], v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(guided[1], c[1], atol=1e-5, rtol=1e-5)  # outside the interval: c
    assert (guided[0] - think_model().predict_velocity(x[:1], sigma[:1], cond.select([0]), 4.0)[0]).abs().max() > 1e-4


def test_think_checks_its_plan_guidance():
    base = ["model.adapter=BagelForConditionalGeneration", "model.stage=think", "model.path=tiny:bagel",
            "rollout.sampling_options.height=32", "rollout.sampling_options.width=32"]
    load_config([*base, "model.adapter_options.plan_guidance_scale=1.5", "rollout.sampling_options.guidance_scale=4.0"])
    with pytest.raises(ConfigError, match=r"model.adapter_options.plan_guidance_scale=1.5 with rollout.sampling_options.guidance_scale=1.0: "):
        load_config([*base, "model.adapter_options.plan_guidance_scale=1.5", "rollout.sampling_options.guidance_scale=1.0"])
    with pytest.raises(ConfigError, match=r"plan_guidance_scale=0.5: expected a number >= 1"):
        load_config([*base, "model.adapter_options.plan_guidance_scale=0.5"])


# --- 3. editing: the text_channel renorm -----------------------------------------------------------

def test_the_renorm_types_by_hand():
    c = vec([3.0, 4.0], [0.0, 1.0])  # token norms 5 and 1
    u = vec([3.0, 4.0], [0.0, 0.0])
    ui = vec([0.0, 0.0], [0.0, 0.0])
    # t = u + 2 (c - u) = [(3, 4), (0, 2)]: token norms 5 and 2.
    # text_channel: t rescaled per token by (5/5, 1/2) = [(3, 4), (0, 1)], then ui + 2 (t' - ui) = [(6, 8), (0, 2)].
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 0.0, ui, 2.0, "text_channel"), vec([6.0, 8.0], [0.0, 2.0]))
    # channel: v = ui + 2 (t - ui) = [(6, 8), (0, 4)], rescaled per token by (5/10, 1/4) = [(3, 4), (0, 1)].
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 0.0, ui, 2.0, "channel"), vec([3.0, 4.0], [0.0, 1.0]))
    # global: the same v rescaled by |c| / |v| over the sample = sqrt(26) / sqrt(116).
    k = math.sqrt(26 / 116)
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 0.0, ui, 2.0, "global"), vec([6 * k, 8 * k], [0.0, 4 * k]))
    # renorm_min clamps the per-token scale from below: text_channel with min 0.75 -> (1, 0.75).
    torch.testing.assert_close(guided_velocity(c, u, 2.0, 0.75, ui, 2.0, "text_channel"), vec([6.0, 8.0], [0.0, 3.0]))
    # Each sample on its own: a second sample changes nothing of the first.
    two = guided_velocity(torch.cat([c, 2 * c]), torch.cat([u, u]), 2.0, 0.0, torch.cat([ui, ui]), 2.0, "text_channel")
    torch.testing.assert_close(two[:1], vec([6.0, 8.0], [0.0, 2.0]))
    with pytest.raises(ValueError, match=r"renorm_type='token': expected one of"):
        guided_velocity(c, u, 2.0, 0.0, renorm_type="token")


@torch.no_grad()
def test_text_channel_on_tiny_bagel_edit_inside_the_interval_only():
    from PIL import Image

    def edit_model(renorm):
        cfg = model_config(adapter=ADAPTER, stage="edit", path="tiny:bagel_edit", max_sequence_length=32,
                           cfg_interval=[0.6, 1.0], image_guidance_scale=1.5, cfg_renorm_type=renorm)
        return build_model(cfg, torch.device("cpu"))

    text_channel, plain = edit_model("text_channel"), edit_model("global")
    image = Image.new("RGB", (32, 32), (90, 90, 90))
    images = [text_channel.condition_images([image], 32, 32)] * 2
    cond = text_channel.encode_prompts(["make it brighter"] * 2, images=images)
    x = torch.randn(1, *text_channel.latent_shape(32, 32), generator=torch.Generator().manual_seed(0)).expand(2, -1, -1, -1)
    sigma = torch.tensor([0.9, 0.5])  # inside and outside (0.6, 1]
    a, b = text_channel.predict_velocity(x, sigma, cond, 4.0), plain.predict_velocity(x, sigma, cond, 4.0)
    assert (a[0] - b[0]).abs().max() > 1e-4
    torch.testing.assert_close(a[1], b[1], atol=1e-6, rtol=0)


def test_a_bad_renorm_type_is_one_line():
    with pytest.raises(ConfigError, match=r"cfg_renorm_type='token': expected one of \['global', 'channel', "
                                          r"'text_channel'\]"):
        load_config(["model.adapter=BagelForConditionalGeneration", "model.path=tiny:bagel", "rollout.sampling_options.height=32",
                     "rollout.sampling_options.width=32", "model.adapter_options.cfg_renorm_type=token"])
