"""The composition root: a job's config, checked against everything registered.

`load_config(overrides)` composes the config (`omni_rl.config`: schema + recipe + overrides,
the value rules) and then checks every component it names against the registries of the layers
above the config: a typo in `algo.policy_loss`, a reward, a backend or an engine fails before
minutes of model loading, with the registered names in the message. Each named component's
options block (`OPTION_BLOCKS`: `model.adapter_options` for the adapter, `rollout.backend_options` for the
rollout backend, `trainer.*_options` for the trainer's backend, engine and pipeline,
`algo.policy_loss_options.<loss>`, `algo.advantage_options`, `algo.family_options` and the family's
`rollout.sampling_options`) is bound to the options dataclass it declares, so an unknown key, a wrong type or a bad value fails here with
one line. The blocks that belong to no registry entry (`algo.rollout_correction_options`,
`trainer.logger_options`, `model.compile_options`, and
`reward.worker_options`, the Ray reward workers' block) are bound here too. Each bound instance is stored in the config in its block's
place (`cfg.model.adapter_options` is the adapter's options dataclass after load), and that is what
every component reads: this module is the only one that binds a block
(tests/test_options_bound_once.py). `bind_blocks` binds a config composed and checked elsewhere
(the rollout server's process), and `omni_rl.config.to_yaml` writes the instances back as the
recipe's mappings.
`options_help_for` gives `python main_omni.py --options KEY=NAME`. It also fills what the config
leaves to a component (`trainer.engine: null` becomes the backend's default), runs the rules a
backend keeps for itself (`ActorGroup.check_config`, a rollout backend's `check_config`), and checks that every reward scores what the model makes
(images, video frames via `video_frames`, audio). Plugins (the `omni_rl.plugins` entry points
and `cfg.plugins`) load first, so a user's own rewards, adapters and backends count.

This module sits above every package it checks and nothing in the core imports it: the command
line, tests and benchmarks call it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from omni_rl.agent.checks import check_agent_config, check_agent_names
from omni_rl.agent.components import ENVIRONMENTS, TOOLS
from omni_rl.algos import ADVANTAGE_ESTIMATORS, DIFFUSION_LOSSES, FORWARD_LOSSES, TOKEN_LOSSES
from omni_rl.algos.advantages import AdvantageOptions, needs_group
from omni_rl.config.loader import compose_config
from omni_rl.config.options import bind_options, options_help
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError
from omni_rl.engine.registry import TRAINING_ENGINES
from omni_rl.registry import Registry, RegistryUnion
from omni_rl.families import MODEL_FAMILIES
from omni_rl.families.autoregressive import agent_options_of
from omni_rl.algos.rollout_correction import RolloutCorrectionOptions
from omni_rl.families.base import check_rollout_correction
from omni_rl.families.sampling import DiffusionSampling
from omni_rl.logging import SINK_NAMES, LoggerOptions
from omni_rl.models.compile import CompileOptions
from omni_rl.models.registry import ADAPTERS, adapter_key
from omni_rl.plugins import PluginError, load_plugins
from omni_rl.reward.registry import REWARDS, RewardConfigError, check_reward_options, reward_modalities
from omni_rl.rollout.backends import ROLLOUT_BACKENDS, beside_trainer_problem, check_backend_fits
from omni_rl.trainer import ACTOR_GROUPS  # the package registers the built-in backends
from omni_rl.trainer.pipeline import PIPELINES
from omni_rl.workers.reward_worker import RewardWorkerOptions

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|npu(:\d+)?)$")


@dataclass(frozen=True)
class OptionBlock:
    """A config key that names a registered component (for the model family, which the adapter
    names, its attribute `model.family`), and the block that holds its options. A new kind of
    component with options is one more row of `OPTION_BLOCKS`."""

    selector: str                                # the key naming the component: "model.adapter"
    block: str                                   # where its options live: "model.adapter_options"
    registry: Registry
    name: Callable[[OmniConfig], str]            # the registry name this config selects
    values: Callable[[OmniConfig], Mapping]      # the block's values in this config
    # entry -> its options dataclass: the `options_class` its base class or spec declares
    # (`OmniModelBase`, `RolloutBackend`, `ActorGroup`, `TrainingEngineSpec`, `RolloutProducer`).
    options_class: Callable[[Any], type] = lambda entry: entry.options_class
    # False where the owner binds the block itself at load (the family binds its loss's block,
    # the trainer the advantage estimators'): the row then only serves `--options`.
    bound_here: bool = True
    # The other blocks the same entry owns, (block, entry -> its options class): a model family's
    # sampling (`rollout.sampling_options`); `--options` lists them after the entry's own.
    companions: tuple[tuple[str, Callable[[Any], type]], ...] = ()

    def bind(self, cfg: OmniConfig) -> Any:
        """The block bound to its component's options class, stored in the config in its place."""
        name = self.name(cfg)
        holder, attr = _holder(cfg, self.block)
        return _bind(holder, attr, self.options_class(self.registry.get(name)), self.block, f"{self.registry.kind} {name}")


def _holder(cfg: OmniConfig, block: str) -> tuple[Any, str]:
    """The section object and attribute of a block's dotted key: "model.adapter_options" -> (cfg.model, "options")."""
    *path, attr = block.split(".")
    holder = cfg
    for part in path:
        holder = getattr(holder, part)
    return holder, attr


def _bind(holder: Any, attr: str, options_class: type, key: str, owner: str) -> Any:
    """Bind the block `holder.attr` (`holder[attr]` in a mapping of blocks: `algo.policy_loss_options`), the
    recipe's mapping, to `options_class` and store the instance in its place: the one place a block
    is bound. A block already bound (a config composed before) is kept."""
    mapping = isinstance(holder, dict)
    values = holder.get(attr) if mapping else getattr(holder, attr)
    if type(values) is options_class:
        return values
    options = bind_options(options_class, values, key, owner)
    if mapping:
        holder[attr] = options
    else:
        setattr(holder, attr, options)
    return options


def _bind_loss_options(cfg: OmniConfig, family: type) -> None:
    """Every block of `algo.policy_loss_options` names one of the family's losses and is bound to its
    options (one block per loss, so a recipe may switch `algo.policy_loss` and keep them); the
    block of `algo.policy_loss` is bound even where the recipe sets none (its defaults)."""
    blocks = cfg.algo.policy_loss_options
    names = list(blocks) + ([cfg.algo.policy_loss] if cfg.algo.policy_loss not in blocks else [])
    for name in names:
        if name not in family.losses:
            raise ConfigError(
                f"algo.policy_loss_options.{name}: {name!r} is not a loss of this model's family ({family.__name__}); "
                f"its losses: {', '.join(family.losses.names())} (each block is named after the loss it configures)"
            )
        key, options_class = f"algo.policy_loss_options.{name}", family.losses.get(name).Options
        block = blocks.get(name)
        if block is not None and not isinstance(block, Mapping) and type(block) is not options_class:
            raise ConfigError(f"{key}={block!r}: expected a mapping of the loss's options, e.g. {{clip_range: 1.0e-4}}")
        _bind(blocks, name, options_class, key, f"loss {name}")


OPTION_BLOCKS: tuple[OptionBlock, ...] = (
    OptionBlock("model.adapter", "model.adapter_options", ADAPTERS, lambda c: adapter_key(c.model.adapter, c.model.stage),
                lambda c: c.model.adapter_options),
    OptionBlock("rollout.backend", "rollout.backend_options", ROLLOUT_BACKENDS, lambda c: c.rollout.backend,
                lambda c: c.rollout.backend_options),
    OptionBlock("trainer.backend", "trainer.backend_options", ACTOR_GROUPS, lambda c: c.trainer.backend,
                lambda c: c.trainer.backend_options),
    OptionBlock("trainer.engine", "trainer.engine_options", TRAINING_ENGINES, lambda c: c.trainer.engine,
                lambda c: c.trainer.engine_options),
    OptionBlock("trainer.pipeline", "trainer.pipeline_options", PIPELINES, lambda c: c.trainer.pipeline,
                lambda c: c.trainer.pipeline_options),
    OptionBlock("algo.policy_loss", "algo.policy_loss_options.<loss>",
                RegistryUnion("policy loss", DIFFUSION_LOSSES, TOKEN_LOSSES, FORWARD_LOSSES),
                lambda c: c.algo.policy_loss, lambda c: c.algo.policy_loss_options, options_class=lambda loss: loss.Options,
                bound_here=False),
    OptionBlock("algo.advantage", "algo.advantage_options", ADVANTAGE_ESTIMATORS, lambda c: c.algo.advantage,
                lambda c: c.algo.advantage_options, options_class=lambda estimator: AdvantageOptions, bound_here=False),
    # The family is the adapter's (`OmniModelBase.family`), not a key of its own: `--options
    # model.family=autoregressive` lists what `algo.family_options` and `rollout.sampling_options`
    # take for its models.
    OptionBlock("model.family", "algo.family_options", MODEL_FAMILIES,
                lambda c: ADAPTERS.get(adapter_key(c.model.adapter, c.model.stage)).family,
                lambda c: c.algo.family_options, options_class=lambda family: family.Options, bound_here=False,
                companions=(("rollout.sampling_options", lambda family: family.Sampling),)),
)


def load_config(overrides: Sequence[str] = ()) -> OmniConfig:
    """Compose schema + recipe + overrides into a validated, component-checked `OmniConfig`
    (or raise `ConfigError` with one line naming the key)."""
    cfg = compose_config(overrides)
    check_components(cfg)
    return cfg


def _check_stage(adapter: str, stage) -> None:
    """A `model.stage` the adapter has not (`thinker` on SD3) is named as such, with the stages
    it has, rather than as an unknown adapter `StableDiffusion3Pipeline/thinker`."""
    if not stage or adapter_key(adapter, stage) in ADAPTERS:
        return
    prefix = f"{adapter}/"
    stages = [name[len(prefix):] for name in ADAPTERS.names() if name.startswith(prefix)]
    if not stages and adapter not in ADAPTERS:
        return  # an unknown adapter: the registry's message lists them
    has = (f"its stages: {', '.join(stages)}" + (", or null" if adapter in ADAPTERS else "")) if stages else \
        "it has no stages: leave model.stage null"
    raise ConfigError(f"model.stage={stage!r}: model.adapter={adapter} has no such stage ({has})")


def check_components(cfg: OmniConfig) -> None:
    """Every name the config gives is registered; fills `trainer.engine` when it is null."""
    try:
        load_plugins(cfg.plugins)
    except PluginError as err:
        raise ConfigError(f"plugins={list(cfg.plugins)!r}: {err}") from None
    _check_stage(cfg.model.adapter, cfg.model.stage)
    for key, registry, value in [
        ("model.adapter", ADAPTERS, adapter_key(cfg.model.adapter, cfg.model.stage)),
        ("algo.advantage", ADVANTAGE_ESTIMATORS, cfg.algo.advantage),
        ("rollout.backend", ROLLOUT_BACKENDS, cfg.rollout.backend),
        ("trainer.backend", ACTOR_GROUPS, cfg.trainer.backend),
        ("trainer.pipeline", PIPELINES, cfg.trainer.pipeline),
    ]:
        if value not in registry:
            raise ConfigError(f"{key}={value!r}: unknown {registry.kind}; registered: {', '.join(registry.names())}")
    family = MODEL_FAMILIES.get(ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage)).family)
    # How the family samples, first: the family's and the backends' rules read it.
    _bind(cfg.rollout, "sampling_options", family.Sampling, "rollout.sampling_options", f"model family {family.__name__}")
    try:
        check_backend_fits(cfg.rollout.backend, ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage)),
                           cfg.model.adapter)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    a = cfg.algo
    _bind(a, "advantage_options", AdvantageOptions, "algo.advantage_options", f"advantage estimator {a.advantage}")
    _bind(a, "rollout_correction_options", RolloutCorrectionOptions, "algo.rollout_correction_options", "the rollout correction")
    check_rollout_correction(cfg)
    _bind(cfg.trainer, "logger_options", LoggerOptions, "trainer.logger_options", "the metric sinks")
    family_options = _bind(a, "family_options", family.Options, "algo.family_options", f"model family {family.__name__}")
    # The family's own rules first: they name what its losses cannot be, and why.
    family.check_config(cfg)
    for attr, options_class, key, owner in family.nested_option_blocks(family_options):
        _bind(family_options, attr, options_class, key, owner)
    _check_policy_loss(cfg)
    # The losses' options, bound once here; the family builds its loss from them (`build_policy_loss`).
    _bind_loss_options(cfg, family)
    agent = _bind_agent_blocks(cfg)
    if agent is not None:
        check_agent_config(cfg, agent, ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage)))
    _check_groups(cfg)
    _check_engine(cfg)
    for block in OPTION_BLOCKS:
        if block.bound_here:
            block.bind(cfg)
    _bind(cfg.reward, "worker_options", RewardWorkerOptions, "reward.worker_options", "reward workers on Ray")
    _bind(cfg.model, "compile_options", CompileOptions, "model.compile_options", "the model's compilation")
    _check_pipeline(cfg)
    check_backend = ROLLOUT_BACKENDS.get(cfg.rollout.backend).check_config
    if check_backend is not None:
        try:
            check_backend(cfg)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    try:
        ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage)).check_config(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for key, item in reward_items(cfg):
        if item.name not in REWARDS:
            raise ConfigError(f"{key}.name={item.name!r}: unknown reward; registered: {', '.join(REWARDS.names())}")
        try:
            check_reward_options(item.name, dict(item.reward_options))
        except RewardConfigError as err:
            raise ConfigError(f"{key}.reward_options: {err}") from None
    _check_reward_media(cfg)
    _check_modality_routing(cfg)
    _check_rollout_is(cfg)
    unknown = [name for name in cfg.trainer.loggers if name not in SINK_NAMES]
    if unknown:
        raise ConfigError(f"trainer.loggers={list(cfg.trainer.loggers)!r}: unknown {unknown}; valid: {', '.join(SINK_NAMES)}")
    if not _DEVICE.match(cfg.trainer.device):
        raise ConfigError(f"trainer.device={cfg.trainer.device!r}: expected auto, cpu, cuda[:N] or npu[:N]")


def _bind_agent_blocks(cfg: OmniConfig):
    """The agent loop's tools' and environment's options (`algo.family_options.agent_options`),
    bound to their registered classes' `Options`; the bound agent options, or None without them."""
    agent = agent_options_of(cfg.algo.family_options)
    if agent is None:
        return None
    check_agent_names(agent)
    key = "algo.family_options.agent_options"
    for i, item in enumerate(agent.tools):
        item.setdefault("tool_options", {})
        _bind(item, "tool_options", TOOLS.get(item["name"]).Options, f"{key}.tools[{i}].tool_options",
              f"tool {item['name']}")
    if agent.environment is not None:
        _bind(agent, "environment_options", ENVIRONMENTS.get(agent.environment).Options, f"{key}.environment_options",
              f"environment {agent.environment}")
    return agent


def bind_blocks(cfg: OmniConfig) -> OmniConfig:
    """Bind every options block of a config that was composed and checked elsewhere, in place,
    without the load's rules: the rollout server's process reads the config its trainer wrote
    (`python -m omni_rl.rollout.server`), and a config written in code (a benchmark, a test of one
    engine) gets its blocks bound the same way. A loss block whose loss is not of the model's
    family stays a mapping (nothing here trains with it); an unset `trainer.engine` is the
    backend's default."""
    try:
        load_plugins(cfg.plugins)
    except PluginError as err:
        raise ConfigError(f"plugins={list(cfg.plugins)!r}: {err}") from None
    family = MODEL_FAMILIES.get(ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage)).family)
    a, t = cfg.algo, cfg.trainer
    _bind(a, "advantage_options", AdvantageOptions, "algo.advantage_options", f"advantage estimator {a.advantage}")
    _bind(a, "rollout_correction_options", RolloutCorrectionOptions, "algo.rollout_correction_options", "the rollout correction")
    _bind(cfg.rollout, "sampling_options", family.Sampling, "rollout.sampling_options", f"model family {family.__name__}")
    _bind(t, "logger_options", LoggerOptions, "trainer.logger_options", "the metric sinks")
    family_options = _bind(a, "family_options", family.Options, "algo.family_options", f"model family {family.__name__}")
    for attr, options_class, key, owner in family.nested_option_blocks(family_options):
        _bind(family_options, attr, options_class, key, owner)
    for name in {*a.policy_loss_options, a.policy_loss} & set(family.losses.names()):
        _bind(a.policy_loss_options, name, family.losses.get(name).Options, f"algo.policy_loss_options.{name}", f"loss {name}")
    _bind_agent_blocks(cfg)
    if t.engine is None:
        t.engine = ACTOR_GROUPS.get(t.backend).engines[0]
    for block in OPTION_BLOCKS:
        if block.bound_here:
            block.bind(cfg)
    _bind(cfg.reward, "worker_options", RewardWorkerOptions, "reward.worker_options", "reward workers on Ray")
    _bind(cfg.model, "compile_options", CompileOptions, "model.compile_options", "the model's compilation")
    return cfg


def options_help_for(selector: str, name: str, plugins: Sequence[str] = ()) -> str:
    """The `--options` text of the component `selector=name` (`model.adapter=LTX2Pipeline`): its
    options with their types, defaults and docs. A model with several stages lists each stage's
    adapter. Raises `ConfigError` naming the valid keys or names."""
    try:
        load_plugins(plugins)
    except PluginError as err:
        raise ConfigError(f"plugins={list(plugins)!r}: {err}") from None
    blocks = {block.selector: block for block in OPTION_BLOCKS}
    if selector not in blocks:
        raise ConfigError(f"--options {selector}={name}: expected one of {', '.join(f'{k}=NAME' for k in blocks)}")
    block = blocks[selector]
    names = [name] if name in block.registry else [n for n in block.registry.names() if n.startswith(name + "/")]
    if not names:
        raise ConfigError(f"{selector}={name!r}: unknown {block.registry.kind}; registered: "
                          f"{', '.join(block.registry.names())}")
    return "\n".join(options_help(options_class(block.registry.get(n)), key.replace("<loss>", n), f"{block.registry.kind} {n}")
                     for n in names for key, options_class in ((block.block, block.options_class), *block.companions))


def reward_items(cfg: OmniConfig) -> list[tuple[str, Any]]:
    """(config key, item) for every reward the run scores with: training's, then validation's."""
    items = [(f"reward.rewards[{i}]", item) for i, item in enumerate(cfg.reward.rewards)]
    return items + [(f"reward.val_rewards[{i}]", item) for i, item in enumerate(cfg.reward.val_rewards or [])]


def _check_modality_routing(cfg: OmniConfig) -> None:
    """algo.advantage_options.modality_routing routes one advantage to each latent stream of a
    diffusion model that denoises video and audio together, from the rollout's own samples (not
    offline pairs, not a pairwise loss: they have no advantage)."""
    if not cfg.algo.advantage_options.modality_routing:
        return
    key = "algo.advantage_options.modality_routing=true"
    architecture = adapter_key(cfg.model.adapter, cfg.model.stage)
    adapter_class = ADAPTERS.get(architecture)
    if adapter_class.family != "diffusion" or not adapter_class.makes_audio:
        raise ConfigError(f"{key}: expected a diffusion adapter that denoises video and audio latents together "
                          f"(LTX2Pipeline, MiniMaxH3ModularPipeline); model.adapter={architecture!r} has one stream: "
                          f"set it to false")
    loss = cfg.algo.policy_loss
    pairwise = loss in FORWARD_LOSSES and FORWARD_LOSSES.get(loss).pairwise
    if pairwise or cfg.data.preference_file is not None:
        raise ConfigError(f"{key}: expected a loss that reads advantages; algo.policy_loss={loss!r}"
                          f"{' with data.preference_file' if cfg.data.preference_file is not None else ''} trains on "
                          f"pairs: set it to false")


def _check_reward_media(cfg: OmniConfig) -> None:
    """Every reward scores what the model makes: an image reward on video is given frames
    (`video_frames`), an audio reward needs an adapter that makes audio (its class attribute
    `makes_audio`), a reward scores something the model's family hands its rewards (its
    `sample_modalities`: a talker's audio), and `video_frames` goes only on rewards that score
    images, not video."""
    architecture = adapter_key(cfg.model.adapter, cfg.model.stage)
    adapter_class = ADAPTERS.get(architecture)
    sampling = cfg.rollout.sampling_options
    makes_video = isinstance(sampling, DiffusionSampling) and sampling.num_frames > 1
    makes_audio = adapter_class.makes_audio
    # What the family hands its rewards, where the config does not decide it (a talker: audio).
    family = MODEL_FAMILIES.get(adapter_class.family) if adapter_class.family in MODEL_FAMILIES else None
    handed = family.variant(cfg).sample_modalities if family is not None else None
    for key, item in reward_items(cfg):
        try:
            modalities = reward_modalities(item.name, dict(item.reward_options))
        except RewardConfigError as err:
            raise ConfigError(f"{key}.reward_options: {err}") from None
        scored = ", ".join(sorted(modalities))
        if item.video_frames is not None and "video" in modalities:
            raise ConfigError(
                f"{key}.video_frames={item.video_frames}: reward {item.name!r} scores video itself ({scored}); "
                f"video_frames is for image rewards: remove it"
            )
        if item.video_frames is not None and "image" not in modalities:
            raise ConfigError(
                f"{key}.video_frames={item.video_frames}: reward {item.name!r} scores {scored}, not images; "
                f"video_frames hands an image reward frames of each video: remove it"
            )
        if makes_video and "image" in modalities and not modalities & {"video", "audio"} and item.video_frames is None:
            raise ConfigError(
                f"{key}: reward {item.name!r} scores images but rollout.sampling_options.num_frames={cfg.rollout.sampling_options.num_frames} makes "
                f"video; set {key}.video_frames=4 to score 4 evenly spaced frames of each video and average them, "
                f"or pick a video reward"
            )
        if "audio" in modalities and not makes_audio:
            raise ConfigError(
                f"{key}: reward {item.name!r} scores {scored}, but model.adapter={architecture!r} "
                f"({adapter_class.__name__}) makes no audio; drop the reward or use an audio model's adapter"
            )
        if handed is not None and not modalities & handed:
            raise ConfigError(
                f"{key}: reward {item.name!r} scores {scored}, but model.adapter={architecture!r} (family "
                f"{adapter_class.family}) hands its rewards {', '.join(sorted(handed))} only; drop the reward or pick "
                f"one that scores {' or '.join(sorted(handed))} (a text rule scores a sample's text with "
                f"reward_options.text_key, e.g. spoken_text)"
            )


def _check_rollout_is(cfg: OmniConfig) -> None:
    """`algo.rollout_correction_options.level` is a level of this model's actions: token or sequence for a text model,
    step or sequence for a diffusion model (its family's `rollout_is_levels`)."""
    level = cfg.algo.rollout_correction_options.level
    if level == "none":
        return
    architecture = adapter_key(cfg.model.adapter, cfg.model.stage)
    family = ADAPTERS.get(architecture).family
    levels = MODEL_FAMILIES.get(family).rollout_is_levels
    if level not in levels:
        every = "; ".join(f"{name}: {', '.join(MODEL_FAMILIES.get(name).rollout_is_levels)}" for name in MODEL_FAMILIES.names())
        raise ConfigError(
            f"algo.rollout_correction_options.level={level!r}: expected none, {' or '.join(levels)} for model.adapter={architecture!r} "
            f"of family {family} ({level!r} is not a unit of its actions; levels by family: {every}); set "
            f"algo.rollout_correction_options.level to one of none, {', '.join(levels)}"
        )


def loss_options_class(name: str) -> type:
    """The options dataclass of the policy loss `name`, whatever its kind (step, token or
    forward-process): what `--options algo.policy_loss=NAME` prints."""
    for registry in (DIFFUSION_LOSSES, TOKEN_LOSSES, FORWARD_LOSSES):
        if name in registry:
            return registry.get(name).Options
    every = sorted(DIFFUSION_LOSSES.names() + TOKEN_LOSSES.names() + FORWARD_LOSSES.names())
    raise ConfigError(f"algo.policy_loss={name!r}: unknown loss; registered: {', '.join(every)}")


def _check_policy_loss(cfg: OmniConfig) -> None:
    """`algo.policy_loss` is a loss of this model's actions: one registered in the registry of
    the adapter's family (`ModelFamily.losses`: diffusion losses score denoising steps, token
    losses score tokens)."""
    name = cfg.algo.policy_loss
    architecture = adapter_key(cfg.model.adapter, cfg.model.stage)
    family = ADAPTERS.get(architecture).family
    losses = MODEL_FAMILIES.get(family).losses
    if name in losses:
        return
    owners = [f for f in MODEL_FAMILIES.names() if name in MODEL_FAMILIES.get(f).losses]
    what = f"a {MODEL_FAMILIES.get(owners[0]).losses.kind} (family {owners[0]}), but" if owners else "unknown loss;"
    raise ConfigError(
        f"algo.policy_loss={name!r}: {what} model.adapter={architecture!r} is of family {family}, whose "
        f"losses are: {', '.join(losses.names())}; set algo.policy_loss to one of them"
    )


def _check_groups(cfg: OmniConfig) -> None:
    """A group-relative estimator gives every sample of a one-sample group advantage 0: the run
    would log loss 0 and grad norm 0 on every step and learn nothing."""
    samples, estimator = cfg.trainer.samples_per_prompt, cfg.algo.advantage
    offline = cfg.data.preference_file is not None  # pairs from a file: no rollout, no advantages
    if samples < 2 and needs_group(estimator) and not offline:
        groupless = [name for name in ADVANTAGE_ESTIMATORS.names() if not needs_group(name)]
        alternative = f", or use an algo.advantage that needs no group: {', '.join(groupless)}" if groupless else ""
        raise ConfigError(
            f"trainer.samples_per_prompt={samples!r}: expected >= 2 with algo.advantage={estimator!r}, which "
            f"compares each sample with the other samples of its prompt, so a group of one gets advantage 0 "
            f"(loss 0, grad norm 0) on every step; set trainer.samples_per_prompt to 2 or more (GRPO recipes "
            f"use 8-16){alternative}"
        )


def _check_pipeline(cfg: OmniConfig) -> None:
    """Offline pairs come from their producer, and it trains nothing else; a pipelined run
    samples while the trainer updates: its rollout backend must be able to."""
    t, r = cfg.trainer, cfg.rollout
    offline = t.pipeline == "offline_pairs"
    if offline and cfg.data.preference_file is None:
        raise ConfigError(f"trainer.pipeline={t.pipeline!r}: expected a data.preference_file (the preference pairs this "
                          f"producer trains on); set it, or pick a pipeline that samples (on_policy)")
    if cfg.data.preference_file is not None and not offline:
        raise ConfigError(f"trainer.pipeline={t.pipeline!r}: expected offline_pairs with data.preference_file (the pairs "
                          f"replace the rollout: there is none to run); set trainer.pipeline=offline_pairs")
    if not PIPELINES.get(t.pipeline).samples_ahead:
        return
    problem = beside_trainer_problem(cfg)
    if problem is not None:
        raise ConfigError(
            f"trainer.pipeline={t.pipeline!r}: expected on_policy with rollout.backend={r.backend!r}, which cannot "
            f"sample beside the trainer: {problem}"
        )


def _check_engine(cfg: OmniConfig) -> None:
    """`trainer.engine` is one the backend drives (null: its default); then the backend's rules."""
    t = cfg.trainer
    backend = ACTOR_GROUPS.get(t.backend)
    if t.engine is None:
        t.engine = backend.engines[0]
    if t.engine not in TRAINING_ENGINES:
        raise ConfigError(
            f"trainer.engine={t.engine!r}: unknown {TRAINING_ENGINES.kind}; registered: {', '.join(TRAINING_ENGINES.names())}"
        )
    if t.engine not in backend.engines:
        raise ConfigError(
            f"trainer.engine={t.engine!r}: expected {' or '.join(backend.engines)} with trainer.backend={t.backend!r} "
            f"(or leave trainer.engine unset for the backend's default)"
        )
    backend.check_options_block(cfg)
    next(block for block in OPTION_BLOCKS if block.block == "trainer.backend_options").bind(cfg)
    backend.check_config(cfg)
