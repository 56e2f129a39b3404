"""Composes a job's config: `recipe=NAME key=value ...` -> a validated `OmniConfig`.

Hydra composes three layers: the dataclass schema (every default), the recipe YAML
(`recipes/NAME.yaml`, overrides only) and the command-line overrides. Every failure is turned
into one `ConfigError` line that names the key and what was expected: an unknown recipe lists
the available ones, a misspelled key names it, a wrong type names the key and the type, and the
cross-field rules of `validate.py` run last. Names of registered components (losses, rewards,
backends) are checked above this package, by `omni_rl.compose.load_config`, which calls
`compose_config` first: the config layer imports nothing above it.

A key that left the flat schema for a component's options block (`MOVED_KEYS`), or a block that
was renamed (`MOVED_BLOCKS`: `model.options` is `model.adapter_options`), fails, in a recipe or an
override, with one line naming its new place, before the schema would call it unknown. The table is kept until `MOVED_KEYS_REMOVED_IN` (0.3.0), then removed.
A config a run wrote before the sampling knobs moved to `rollout.sampling_options`
(`upgrade_saved_config`) is read in the new layout, so its checkpoints still resume and export.

A prompt file given on the command line (`data.prompt_file=...`, `data.val_prompt_file=...`)
replaces the recipe's inline list (`data.prompts`, `data.val_prompts`, which would otherwise win
in `omni_rl.data.prompts.load_prompt_items`); both given on the command line is one error.

Recipes are found in the project's `recipes/` folder and in the folders listed in the
`OMNI_RL_RECIPE_PATH` environment variable (`:`-separated); `recipe=path/to/file.yaml` also
works.
"""
from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Sequence

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from omni_rl.config.options import recipe_values
from omni_rl.config.schema import OmniConfig
from omni_rl.config.validate import validate_config
from omni_rl.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Keys that left the flat schema: old key -> (where it is set now, whose option it is). The algo
# rows: the advantage estimators', the losses' (one block per loss, `<loss>` being the
# algo.policy_loss that reads the key) and the model families' options; `MOVED_KEYS` below
# joins them with the other sections' rows.
_ANY_LOSS = "the option of the loss algo.policy_loss names, under its name <loss>, e.g. flow_grpo"
_TOKEN_LOSS = "an option of the token losses, under the loss's name <loss>, e.g. ppo_clip"
_FAMILY = "the diffusion and think_draw families' option"
MOVED_ALGO_KEYS: dict[str, tuple[str, str]] = {
    "algo.std_mode": ("algo.advantage_options.std_mode", "the advantage estimators' option"),
    "algo.adv_eps": ("algo.advantage_options.eps", "the advantage estimators' option"),
    "algo.clip_range": ("algo.policy_loss_options.<loss>.clip_range", _ANY_LOSS),
    "algo.clip_range_high": ("algo.policy_loss_options.<loss>.clip_range_high", _ANY_LOSS),
    "algo.adv_clip_max": ("algo.policy_loss_options.<loss>.adv_clip_max", _ANY_LOSS),
    "algo.kl_threshold": ("algo.policy_loss_options.flow_dppo.kl_threshold", "loss flow_dppo's option"),
    "algo.loss_agg_mode": ("algo.policy_loss_options.<loss>.loss_agg_mode", _TOKEN_LOSS + " (ppo_clip, cispo, sapo)"),
    "algo.loss_scale_factor": ("algo.policy_loss_options.<loss>.loss_scale_factor", _TOKEN_LOSS + " (ppo_clip, cispo, sapo)"),
    "algo.clip_ratio_c": ("algo.policy_loss_options.<loss>.clip_ratio_c", _TOKEN_LOSS + " (ppo_clip, dapo)"),
    "algo.kl_estimator": ("algo.policy_loss_options.<loss>.kl_estimator", _TOKEN_LOSS),
    "algo.kl_clamp": ("algo.policy_loss_options.<loss>.kl_clamp", _TOKEN_LOSS),
    "algo.tau_pos": ("algo.policy_loss_options.sapo.tau_pos", "loss sapo's option"),
    "algo.tau_neg": ("algo.policy_loss_options.sapo.tau_neg", "loss sapo's option"),
    "algo.nft_beta": ("algo.policy_loss_options.diffusion_nft.beta", "loss diffusion_nft's option"),
    "algo.nft_ema_decay": ("algo.policy_loss_options.diffusion_nft.ema_decay", "loss diffusion_nft's option"),
    "algo.nft_weighting": ("algo.policy_loss_options.diffusion_nft.weighting", "loss diffusion_nft's option"),
    "algo.dpo_beta": ("algo.policy_loss_options.diffusion_dpo.beta", "loss diffusion_dpo's option"),
    "algo.kl_form": ("algo.family_options.kl_form", _FAMILY),
    "algo.timestep_fraction": ("algo.family_options.timestep_fraction", _FAMILY),
    "algo.forward_num_timesteps": ("algo.family_options.forward_num_timesteps", _FAMILY),
    "algo.forward_timestep_sampling": ("algo.family_options.forward_timestep_sampling", _FAMILY),
    "algo.plan_policy_loss": ("algo.family_options.plan_policy_loss", "the think_draw family's option"),
    "algo.plan_loss_weight": ("algo.family_options.plan_loss_weight", "the think_draw family's option"),
    "algo.plan_clip_range": ("algo.family_options.plan_loss_options.clip_range", "the think_draw family's plan loss's option"),
    "algo.rollout_is": ("algo.rollout_correction_options.level", "the rollout correction's block"),
    "algo.rollout_is_cap": ("algo.rollout_correction_options.cap", "the rollout correction's block"),
    "algo.rollout_is_mode": ("algo.rollout_correction_options.mode", "the rollout correction's block"),
}
DEFAULT_RECIPE = OmniConfig.recipe
_SCHEMA_NAME = "omni_schema"
_PRIMARY_NAME = "omni"

_LTX2 = "LTX2Pipeline's option"
_BAGEL = "BagelForConditionalGeneration's option"
_EDITING = "an editing adapter's option: QwenImageEditPipeline, BAGEL model.stage=edit"
_SERVER = "an option of rollout backends server, vllm, vllm_omni"
_VLLM = "an option of rollout backends vllm, vllm_omni"
_RAY = "trainer backend ray's option"
_FSDP2 = "training engine fsdp2's option"
_WINDOW = "the SDE window schedules' option"
_BUFFERED = "an option of pipelines one_step_off, async"
_TEXT = "the autoregressive family's option"
_IMAGE = "the diffusion, think_draw and write_draw families' sampling option"
_TOKENS = "the autoregressive, talker, think_draw and write_draw families' sampling option"
_NUCLEUS = "the autoregressive and talker families' sampling option"
_SPEECH = "the talker family's sampling option"
# The sampling knobs that left `rollout` and `algo.family_options` for `rollout.sampling_options`
# (a model family's `Sampling`): a diffusion model's, and a language head's.
DIFFUSION_SAMPLING_KEYS = ("height", "width", "num_steps", "guidance_scale", "negative_prompt", "num_frames", "fps",
                           "kernel", "noise_level", "sde_window_size", "sde_window_range", "sde_window_schedule",
                           "sde_window_options")
TOKEN_SAMPLING_KEYS = ("temperature", "max_new_tokens")
TEXT_SAMPLING_KEYS = TOKEN_SAMPLING_KEYS + ("top_p", "stop_token_ids")
SPEECH_SAMPLING_KEYS = ("speech_temperature", "max_frames")
# The release that drops `MOVED_KEYS` (and `MOVED_ALGO_KEYS`, `MOVED_BLOCKS`): until then an old
# recipe gets the one-line "moved: set NEW" error; from then on it gets the schema's unknown-key
# error.
# tests/omni_rl/config/test_component_options.py fails once the package's version reaches it, so
# the table is removed (or this date moved, on purpose) in that release.
MOVED_KEYS_REMOVED_IN = "0.3.0"
# Keys that left the flat schema: old key -> (where it is set now, whose option it is). One table
# for every section; a component that takes over a flat key adds its row here.
MOVED_KEYS: dict[str, tuple[str, str]] = {
    "model.guidance_scale_2": ("model.adapter_options.guidance_scale_2", "WanPipeline's option"),
    "model.audio_guidance_scale": ("model.adapter_options.audio_guidance_scale", _LTX2),
    "model.guidance_rescale": ("model.adapter_options.guidance_rescale", _LTX2),
    "model.audio_guidance_rescale": ("model.adapter_options.audio_guidance_rescale", _LTX2),
    "model.stg_scale": ("model.adapter_options.stg_scale", _LTX2),
    "model.audio_stg_scale": ("model.adapter_options.audio_stg_scale", _LTX2),
    "model.stg_blocks": ("model.adapter_options.stg_blocks", _LTX2),
    "model.modality_scale": ("model.adapter_options.modality_scale", _LTX2),
    "model.audio_modality_scale": ("model.adapter_options.audio_modality_scale", _LTX2),
    "model.max_sequence_length": ("model.adapter_options.max_sequence_length", "an option of the diffusion adapters with a prompt encoder (models.diffusion.PromptLengthOptions)"),
    "model.condition_image_size": ("model.adapter_options.condition_image_size", _EDITING),
    "model.timestep_shift": ("model.adapter_options.timestep_shift", _BAGEL),
    "model.cfg_interval": ("model.adapter_options.cfg_interval", _BAGEL),
    "model.cfg_renorm_min": ("model.adapter_options.cfg_renorm_min", _BAGEL),
    "model.image_guidance_scale": ("model.adapter_options.image_guidance_scale", _BAGEL),
    "model.freeze_vision_tower": ("model.adapter_options.freeze_vision_tower", "Qwen3OmniMoeForConditionalGeneration/thinker's option"),
    "model.freeze_audio_tower": ("model.adapter_options.freeze_audio_tower", "Qwen3OmniMoeForConditionalGeneration/thinker's option"),
    "rollout.sde_window_shift": ("rollout.sampling_options.sde_window_options.shift", _WINDOW),
    "rollout.sde_window_tau": ("rollout.sampling_options.sde_window_options.tau", _WINDOW),
    "rollout.sde_window_min_size": ("rollout.sampling_options.sde_window_options.min_size", _WINDOW),
    "rollout.max_wait_ms": ("rollout.backend_options.max_wait_ms", "an option of rollout backends native, server, vllm_omni"),
    "rollout.trajectory_device": ("rollout.backend_options.trajectory_device", "an option of rollout backends native, server, vllm_omni"),
    "rollout.python": ("rollout.backend_options.python", _SERVER),
    "rollout.server_timeout_s": ("rollout.backend_options.server_timeout_s", _SERVER),
    "rollout.server_startup_timeout_s": ("rollout.backend_options.server_startup_timeout_s", _SERVER),
    "rollout.vllm_gpu_memory_utilization": ("rollout.backend_options.gpu_memory_utilization", _VLLM),
    "rollout.vllm_enforce_eager": ("rollout.backend_options.enforce_eager", _VLLM),
    "rollout.vllm_sleep_mode": ("rollout.backend_options.sleep_mode", _VLLM),
    "trainer.nnodes": ("trainer.backend_options.nnodes", _RAY),
    "trainer.devices_per_node": ("trainer.backend_options.devices_per_node", _RAY),
    "trainer.ray_address": ("trainer.backend_options.ray_address", _RAY),
    "trainer.worker_timeout_s": ("trainer.backend_options.worker_timeout_s", _RAY),
    "trainer.worker_startup_timeout_s": ("trainer.backend_options.worker_startup_timeout_s", _RAY),
    "trainer.param_offload": ("trainer.engine_options.param_offload", _FSDP2),
    "trainer.optimizer_offload": ("trainer.engine_options.optimizer_offload", _FSDP2),
    "reward.num_workers": ("reward.worker_options.num_workers", "the reward workers' option"),
    "reward.worker_num_cpus": ("reward.worker_options.num_cpus", "the reward workers' option"),
    "reward.worker_num_gpus": ("reward.worker_options.num_gpus", "the reward workers' option"),
    "trainer.progress_bar": ("trainer.logger_options.progress_bar", "the metric sinks' option"),
    "trainer.wandb_project": ("trainer.logger_options.wandb_project", "the metric sinks' option"),
    "trainer.max_staleness": ("trainer.pipeline_options.max_staleness", _BUFFERED),
    "trainer.stale_policy": ("trainer.pipeline_options.stale_policy", _BUFFERED),
    "rollout.temperature": ("rollout.sampling_options.temperature", _TOKENS),
    "rollout.max_new_tokens": ("rollout.sampling_options.max_new_tokens", _TOKENS),
    "rollout.top_p": ("rollout.sampling_options.top_p", _NUCLEUS),
    "rollout.stop_token_ids": ("rollout.sampling_options.stop_token_ids", _NUCLEUS),
    "data.max_prompt_tokens": ("algo.family_options.max_prompt_tokens", _TEXT),
    "data.overlong_prompts": ("algo.family_options.overlong_prompts", _TEXT),
    "rollout.same_noise_in_group": ("algo.family_options.same_noise_in_group", _FAMILY),
    "trainer.val_num_steps": ("algo.family_options.val_num_steps", _FAMILY),
    **MOVED_ALGO_KEYS,
    **{f"rollout.{name}": (f"rollout.sampling_options.{name}", _IMAGE) for name in DIFFUSION_SAMPLING_KEYS},
    **{f"algo.family_options.{name}": (f"rollout.sampling_options.{name}", _TOKENS if name in TOKEN_SAMPLING_KEYS
                                       else _NUCLEUS) for name in TEXT_SAMPLING_KEYS},
    **{f"algo.family_options.{name}": (f"rollout.sampling_options.{name}", _SPEECH) for name in SPEECH_SAMPLING_KEYS},
}
# Options blocks renamed to `<kind>_options` (docs/recipes.md, "Options blocks"): old block ->
# (the block now, whose it is); a key inside an old block (`model.options.stg_scale`) is named
# under the new one, and `[]` stands for a list item's index. Kept as long as `MOVED_KEYS`.
MOVED_BLOCKS: dict[str, tuple[str, str]] = {
    "model.options": ("model.adapter_options", "the model adapter's options block"),
    "rollout.options": ("rollout.backend_options", "the rollout backend's options block"),
    "algo.loss_options": ("algo.policy_loss_options", "the policy losses' options blocks, one per loss name"),
    "algo.rollout_correction": ("algo.rollout_correction_options", "the rollout correction's options block"),
    "reward.workers": ("reward.worker_options", "the reward workers' options block"),
    "reward.rewards[].kwargs": ("reward.rewards[].reward_options", "the reward's options block"),
    "reward.val_rewards[].kwargs": ("reward.val_rewards[].reward_options", "the reward's options block"),
}


def upgrade_saved_config(tree: dict) -> dict:
    """A config a run wrote before the sampling knobs moved (its `config.yaml`: checkpoints, the
    rollout server's file) with them in `rollout.sampling_options`, so that it composes with this
    schema again: `rollout.height` and the rest, and `algo.family_options.temperature`, the
    talker's `algo.family_options.max_frames` and the rest. A flat value equal to the old
    schema's default is dropped (a bound block writes only what differs from its defaults, and a
    text model's config carried the diffusion defaults). Any other key is left as it is; the
    input is not changed."""
    if not isinstance(tree, dict):
        return tree  # not a config: the caller's merge names what it is
    tree = {section: dict(values) if isinstance(values, dict) else values for section, values in tree.items()}
    rollout = tree.get("rollout")
    if not isinstance(rollout, dict):
        return tree
    sampling = dict(rollout.get("sampling_options") or {})
    for name in DIFFUSION_SAMPLING_KEYS:
        if name in rollout:
            value = rollout.pop(name)
            if value != _OLD_ROLLOUT_DEFAULTS[name]:
                sampling[name] = value
    family = (tree.get("algo") or {}).get("family_options")
    if isinstance(family, dict):
        family = dict(family)
        sampling.update({name: family.pop(name) for name in TEXT_SAMPLING_KEYS + SPEECH_SAMPLING_KEYS
                         if name in family})
        tree["algo"]["family_options"] = family
    rollout["sampling_options"] = sampling
    return tree


# The flat rollout fields' defaults before they moved (a saved config wrote every one of them).
_OLD_ROLLOUT_DEFAULTS = {"height": 32, "width": 32, "num_steps": 6, "guidance_scale": 4.5, "negative_prompt": "",
                         "num_frames": 1, "fps": 16.0, "kernel": "sde", "noise_level": 0.7, "sde_window_size": 0,
                         "sde_window_range": None, "sde_window_schedule": "fixed", "sde_window_options": {}}


def moved_key_error(key: str, where: str) -> ConfigError | None:
    """The one-line error for a moved `key` set in `where` (a recipe file, an override), or for a
    key inside a moved block (`model.options.stg_scale`); None for a key that did not move. A list
    item's index (`reward.rewards[0]`, `reward.rewards.0`) is kept in the new key."""
    parts = re.split(r"\.(?![^\[]*\])", re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", key))
    for end in range(len(parts), 0, -1):
        old = ".".join(parts[:end])
        pattern = re.sub(r"\[\d+\]", "[]", old)
        if pattern in MOVED_KEYS or pattern in MOVED_BLOCKS:
            new, owner = MOVED_KEYS.get(pattern) or MOVED_BLOCKS[pattern]
            for index in re.findall(r"\[\d+\]", old):
                new = new.replace("[]", index, 1)
            new += "".join("." + part for part in parts[end:])
            return ConfigError(f"{key} moved: set {new} ({owner}) [{where}]")
    return None


def _is_mapping(node) -> bool:
    return OmegaConf.is_dict(node) or isinstance(node, dict)


def _check_moved_keys(node, where: str) -> None:
    for section, values in node.items():
        if _is_mapping(values):
            for key in values:
                error = moved_key_error(f"{section}.{key}", where)
                if error is not None:
                    raise error
                items = values[key]
                for item_key in items if _is_mapping(items) else ():  # a key that left a block: algo.family_options.top_p
                    error = moved_key_error(f"{section}.{key}.{item_key}", where)
                    if error is not None:
                        raise error
                if OmegaConf.is_list(items) or isinstance(items, list):  # a list of blocks: reward.rewards
                    for i, item in enumerate(items):
                        for item_key in item if (OmegaConf.is_dict(item) or isinstance(item, dict)) else ():
                            error = moved_key_error(f"{section}.{key}[{i}].{item_key}", where)
                            if error is not None:
                                raise error


def _open_blocks(cls: type = OmniConfig, prefix: str = "") -> set[str]:
    """Dotted keys of the schema's open mappings (`model.adapter_options`, `algo.policy_loss_options`, ...): a component's
    options block, whose keys the component's options class checks, not the schema."""
    found: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) is dict:
            found.add(prefix + f.name)
        elif dataclasses.is_dataclass(tp):
            found |= _open_blocks(tp, prefix + f.name + ".")
    return found


def _override(item: str) -> str:
    """Hydra adds a key to an open mapping only when told (`++`): a key of an options block (at
    any depth: `algo.policy_loss_options.flow_dppo.kl_threshold`) is added or replaced (the component's
    options class checks it at load)."""
    key = item.split("=", 1)[0]
    if any(key.startswith(block + ".") for block in _open_blocks()):
        return "++" + item
    return item


def recipe_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("OMNI_RL_RECIPE_PATH", "").split(":") if p]
    return extra + [PROJECT_ROOT / "recipes"]


def available_recipes() -> dict[str, Path]:
    """Recipe name -> file; earlier folders of `recipe_dirs()` win."""
    found: dict[str, Path] = {}
    for folder in reversed(recipe_dirs()):
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                found[path.stem] = path
    return dict(sorted(found.items()))


def _split_recipe(overrides: Sequence[str]) -> tuple[str, list[str]]:
    recipe, rest = DEFAULT_RECIPE, []
    for item in overrides:
        if item.startswith("+"):
            # Hydra's `+key=value` adds keys that bypass the schema; every real key exists.
            raise ConfigError(
                f"override {item!r} adds a key; every config key already exists in the schema, "
                f"so write {item.lstrip('+')!r} (see `python main_omni.py --cfg` for all keys)"
            )
        if item.startswith("recipe="):
            recipe = item.split("=", 1)[1]
        else:
            error = moved_key_error(item.split("=", 1)[0].lstrip("~"), f"override {item!r}")
            if error is not None:
                raise error
            _check_moved_item_keys(item)
            rest.append(_override(item))
    return recipe, rest


def _check_moved_item_keys(item: str) -> None:
    """A list of blocks given whole on the command line (`reward.rewards=[{name: x, kwargs: {}}]`)
    names a moved key of its items as the recipe check does; a value that is no YAML list is left
    to Hydra."""
    key, _, value = item.partition("=")
    if not value.lstrip().startswith("["):
        return
    try:
        items = OmegaConf.create(value)
    except (OmegaConfBaseException, ValueError, yaml.YAMLError):
        return
    if OmegaConf.is_list(items):
        section, _, name = key.partition(".")
        _check_moved_keys({section: {name: items}}, f"override {item!r}")


def _resolve_recipe(recipe: str) -> tuple[str, Path]:
    as_path = Path(recipe)
    if recipe.endswith((".yaml", ".yml")):
        if not as_path.is_file():
            raise ConfigError(f"recipe file {recipe!r} does not exist")
        return as_path.stem, as_path
    recipes = available_recipes()
    if recipe not in recipes:
        raise ConfigError(
            f"unknown recipe {recipe!r}; available: {', '.join(recipes) or '(none)'} "
            f"(recipes are YAML files in {', '.join(str(d) for d in recipe_dirs())}, "
            f"or pass recipe=path/to/file.yaml)"
        )
    return recipe, recipes[recipe]


def _register(recipe_name: str, recipe_path: Path) -> None:
    store = ConfigStore.instance()
    store.store(name=_SCHEMA_NAME, node=OmniConfig)
    try:
        recipe_node = OmegaConf.load(recipe_path)
    except Exception as err:  # YAML syntax errors come in several exception types
        detail = re.sub(r"\s*\n\s*", " ", str(err))
        raise ConfigError(f"recipe {str(recipe_path)!r} is not valid YAML: {detail}") from None
    if not isinstance(recipe_node, dict) and not OmegaConf.is_dict(recipe_node):
        raise ConfigError(f"recipe {str(recipe_path)!r} must be a mapping of config keys")
    if "defaults" in recipe_node:
        raise ConfigError(
            f"recipe {str(recipe_path)!r} has a `defaults` list; recipes only override keys of the schema"
        )
    _check_moved_keys(recipe_node, f"recipe file {recipe_path.name}")
    try:
        # Checked here, not only by compose, so the message names the recipe and the full key.
        OmegaConf.merge(OmegaConf.structured(OmniConfig), recipe_node)
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err, recipe_name, where=f"recipe file {recipe_path.name}")) from None
    store.store(group="recipe", name=recipe_name, node=recipe_node, package="_global_")
    store.store(
        name=_PRIMARY_NAME,
        node={"defaults": [_SCHEMA_NAME, {"recipe": recipe_name}, "_self_"]},
    )


# A prompt file's key -> the inline list it replaces (`load_prompt_items` reads the list when both are set).
_FILE_OVER_LIST = {"data.prompt_file": "data.prompts", "data.val_prompt_file": "data.val_prompts"}


def _file_over_list(overrides: list[str]) -> list[str]:
    """A prompt file named on the command line wins over the recipe's inline list: the list is
    set to null with it. Both given on the command line is one error."""
    given = {item.split("=", 1)[0]: item.split("=", 1)[1] for item in overrides if "=" in item}
    extra = []
    for file_key, list_key in _FILE_OVER_LIST.items():
        if given.get(file_key, "null").strip() in ("null", "None", "~", ""):
            continue
        if given.get(list_key, "null").strip() not in ("null", "None", "~", ""):
            raise ConfigError(
                f"{file_key}={given[file_key]} and {list_key}={given[list_key]} are both given on the command "
                f"line; the prompts come from one of them: drop one"
            )
        if list_key not in given:
            extra.append(f"{list_key}=null")
    return overrides + extra


def compose_config(overrides: Sequence[str] = ()) -> OmniConfig:
    """Compose schema + recipe + overrides into a validated `OmniConfig` (or raise ConfigError).
    A `data.prompt_file` (`data.val_prompt_file`) override replaces the recipe's inline
    `data.prompts` (`data.val_prompts`), as the command line means it to."""
    recipe, rest = _split_recipe(overrides)
    rest = _file_over_list(rest)
    recipe_name, recipe_path = _resolve_recipe(recipe)
    _register(recipe_name, recipe_path)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(recipe_path.parent.resolve()), version_base=None):
            composed = compose(config_name=_PRIMARY_NAME, overrides=rest)
        composed.recipe = recipe_name
        cfg: OmniConfig = OmegaConf.to_object(composed)
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise ConfigError(_one_line(err, recipe_name)) from None
    finally:
        GlobalHydra.instance().clear()
    validate_config(cfg)
    return cfg


def to_yaml(cfg: OmniConfig) -> str:
    """The config as YAML that composes back to it: a bound options block (`omni_rl.compose`
    stores each block's options instance in its place) is written as the recipe's mapping."""
    return OmegaConf.to_yaml(OmegaConf.structured(_as_recipe(cfg)))


def _as_recipe(section, prefix: str = ""):
    """A copy of the config (a section of it) whose options blocks (`_open_blocks`) are mappings again."""
    blocks = _open_blocks()
    changes = {}
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), prefix + f.name
        if key in blocks:
            changes[f.name] = recipe_values(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[f.name] = _as_recipe(value, key + ".")
    return dataclasses.replace(section, **changes)


def _one_line(err: Exception, recipe: str, where: str = "") -> str:
    """Hydra's and OmegaConf's messages span lines and nest causes; keep the informative part."""
    cause = err
    while cause.__cause__ is not None and isinstance(cause.__cause__, (HydraException, OmegaConfBaseException)):
        cause = cause.__cause__
    text = str(cause).strip()
    key = getattr(cause, "full_key", None)
    text = re.sub(r"\s*\n\s*", "; ", text)
    text = re.sub(r"; (full_key|object_type|reference_type|value|child_type)\b.*", "", text)
    origin = where or f"recipe {recipe!r}"
    if isinstance(cause, OmegaConfBaseException) and key:
        return f"bad config key {key!r} ({origin}): {text}"
    return f"bad config ({origin}): {text}"
