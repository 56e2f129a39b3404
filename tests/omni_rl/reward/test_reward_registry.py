"""The reward registry and build_reward (omni_rl/reward/registry.py)."""
import pytest

from omni_rl.registry import RegistryError
from omni_rl.reward import REWARDS, RewardConfigError, build_reward, register_reward


@register_reward("tests.registry.offset")
class OffsetScorer:
    def __init__(self, *, offset: float = 0.0):
        self.offset = offset

    def __call__(self, images, prompts, metadata):
        return [self.offset] * len(prompts)


@register_reward("tests.registry.needs_option")
def needs_option(*, level: int):
    return lambda images, prompts, metadata: [float(level)] * len(prompts)


@register_reward("tests.registry.not_callable")
def not_callable():
    return 42


@register_reward("tests.registry.broken_factory")
def broken_factory(*, value: int = 0):
    raise ValueError(f"value must be positive, got {value}")


def test_build_passes_options_to_a_class_factory():
    scorer = build_reward("tests.registry.offset", offset=2.5)
    assert isinstance(scorer, OffsetScorer)
    assert scorer(None, ["a", "b"], [{}, {}]) == [2.5, 2.5]


def test_builtin_rewards_are_found_through_the_plugins():
    assert {"jpeg_compressibility", "jpeg_incompressibility", "brightness"} <= set(REWARDS.names())
    assert callable(build_reward("jpeg_compressibility", scale=0.002))


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(RegistryError, match=r"unknown reward 'jpeg_compresibility'.*jpeg_compressibility"):
        build_reward("jpeg_compresibility")


def test_unknown_option_names_the_reward_and_the_option():
    with pytest.raises(TypeError, match=r"reward 'tests.registry.offset'.*'ofset'.*accepted options: offset"):
        build_reward("tests.registry.offset", ofset=1.0)
    with pytest.raises(RewardConfigError, match=r"'jpeg_compressibility'.*'scael'.*scale, quality"):
        build_reward("jpeg_compressibility", scael=0.002)


def test_missing_required_option():
    with pytest.raises(TypeError, match=r"reward 'tests.registry.needs_option'.*level"):
        build_reward("tests.registry.needs_option")
    assert build_reward("tests.registry.needs_option", level=3)(None, ["p"], [{}]) == [3.0]


def test_factory_must_return_a_callable():
    with pytest.raises(RewardConfigError, match="returned a int, which is not callable"):
        build_reward("tests.registry.not_callable")


def test_factory_errors_propagate_with_a_note():
    with pytest.raises(ValueError, match="value must be positive") as info:
        build_reward("tests.registry.broken_factory", value=-1)
    assert any("tests.registry.broken_factory" in note for note in getattr(info.value, "__notes__", []))


def test_duplicate_registration_raises():
    with pytest.raises(RegistryError, match="already registered"):
        register_reward("tests.registry.offset")(lambda: None)


def _check_level(*, level=1):
    if level < 0:
        raise ValueError(f"level={level}; expected >= 0")


@register_reward("tests.registry.checked", check_options=_check_level)
def checked(*, level: int = 1):
    return lambda images, prompts, metadata: [float(level)] * len(prompts)


def test_a_factory_check_options_runs_at_config_check_and_build_time():
    from omni_rl.reward.registry import check_reward_options

    check_reward_options("tests.registry.checked", {"level": 2})
    for check in (lambda: check_reward_options("tests.registry.checked", {"level": -1}),
                  lambda: build_reward("tests.registry.checked", level=-1)):
        with pytest.raises(RewardConfigError, match=r"reward 'tests.registry.checked': level=-1; expected >= 0"):
            check()
    with pytest.raises(RewardConfigError, match="unknown option"):  # the signature is checked first
        check_reward_options("tests.registry.checked", {"levle": 2})


def test_what_a_reward_declares_is_its_registry_entrys_spec_not_an_attribute():
    from omni_rl.reward.registry import RewardDeclaration, reward_declaration

    declared = reward_declaration("tests.registry.checked")
    assert isinstance(declared, RewardDeclaration) and declared.check_options is _check_level
    assert not hasattr(checked, "check_options")  # nothing set on the factory
    # A function attribute is not read any more: only the declaration counts.
    register_reward("tests.registry.attribute_only")(lambda *, level=1: (lambda i, p, m: [0.0] * len(p)))
    REWARDS.get("tests.registry.attribute_only").check_options = _check_level
    from omni_rl.reward.registry import check_reward_options

    check_reward_options("tests.registry.attribute_only", {"level": -1})
    assert reward_declaration("tests.registry.attribute_only") == RewardDeclaration()
    with pytest.raises(RewardConfigError, match=r"check_options=3; expected a callable"):
        register_reward("tests.registry.bad_check", check_options=3)


def test_what_a_reward_needs_of_each_prompt_is_its_declared_check_item():
    from omni_rl.reward.registry import reward_declaration

    def needs_a_colour(prompt, metadata):
        return None if "red" in prompt or "colour" in metadata else "names no colour"

    register_reward("tests.registry.item_checked", check_item=needs_a_colour)(lambda: (lambda i, p, m: [0.0] * len(p)))
    check = reward_declaration("tests.registry.item_checked").check_item
    assert check is needs_a_colour
    assert check("a red cube", {}) is None and check("a cube", {"colour": "blue"}) is None
    assert check("a cube", {}) == "names no colour"
    # The rewards that read a prompt's data declare one (issue 38, part 3.6).
    assert all(reward_declaration(name).check_item is not None
               for name in ("ocr", "math_answer", "geneval_shapes", "edit_brightness", "source_consistency"))
    with pytest.raises(RewardConfigError, match=r"check_item='x'; expected a callable \(prompt, metadata\)"):
        register_reward("tests.registry.bad_item_check", check_item="x")
