"""Command line: compose the config, run the trainer, and turn known failures into one line.

Exit codes: 0 done, 2 bad config or command line (an output folder that is a file, in use or
holding another run included), 1 a run that failed (the message names the component: reward,
model weights, rollout engine, prompt file, a full disk), 128 + N a run stopped by signal N
(143 SIGTERM, 130 SIGINT: the training loop saves the step it finished and says where).
The code is the error's own (`omni_rl.errors`): every error reported here derives from
`OmniConfigError` or `OmniRunError`, and those two (plus a Ctrl-C outside the loop) are all
this module catches.

`check_inputs` looks at what the config points to (device, prompt files, resume checkpoint,
model folder or hub id) before anything loads, so those mistakes cost seconds, not a model load;
the prompts are checked row by row against what each reward declares it needs (`check_item`).
`--plan` reads the data too when its files are here (`check_plan_data`).
"""
from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Sequence

from omni_rl.errors import OmniConfigError, OmniRunError

# What `python main_omni.py` runs when no recipe is named: the newcomer's demo. (The schema's
# own default, for `load_config` in code and tests, is the faster random-weight tiny_sd3_flowgrpo.)
DEMO_RECIPE = "tiny_sd3_shapes_counting"

USAGE = """usage: python main_omni.py [recipe=NAME] [key=value ...] [--cfg] [--plan] [--eval NAME ...]
       python main_omni.py --options KEY=NAME
       python main_omni.py --compare A B

  recipe=NAME   a YAML file in recipes/ (default: tiny_sd3_shapes_counting, the CPU demo)
  key=value     override any config key, e.g. trainer.total_steps=10 rollout.num_steps=8
  --cfg         print the composed config and exit (`--cfg job` too, as in Hydra)
  --plan        build the recipe's model without weights, trace a rollout forward and a training
                micro-batch on fake tensors, print each device's memory, FLOPs per step and
                whether it fits; writes plan.json in trainer.output_dir, a folder holding no other
                run (omni_rl/plan); no training; not with --cfg or --eval
  --device-kind NAME   with --plan: H800 (default), H100, H200 or Ascend910B
  --device-memory GB   with --plan: judge against this memory instead of the kind's
  --options     print a component's options (set under its block) with their defaults and docs,
                e.g. --options model.adapter=LTX2Pipeline, rollout.backend=server, trainer.engine=fsdp2
{eval_usage}
"""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C outside the training loop (loading, importing, exporting); inside it the loop
        # stops after the step and raises TrainingInterrupted instead.
        print("error: interrupted by SIGINT outside a training step; no checkpoint was written for it",
              file=sys.stderr)
        return 130


CFG_WORDS = ("job", "all", "hydra")


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    from omni_rl.compose import load_config
    from omni_rl.config import available_recipes, to_yaml

    from omni_rl.eval.cli_args import USAGE as EVAL_USAGE, take_eval_args

    if "-h" in args or "--help" in args:
        print(USAGE.format(eval_usage=EVAL_USAGE) + "\nrecipes: " + ", ".join(available_recipes()))
        return 0
    if "--options" in args:
        return _print_options([a for a in args if a != "--options"])
    show_cfg = "--cfg" in args
    if show_cfg:
        at = args.index("--cfg")
        # Hydra's own spelling, `--cfg job` (or all / hydra): the job's config is what there is.
        if at + 1 < len(args) and args[at + 1] in CFG_WORDS:
            del args[at + 1]
    show_plan = "--plan" in args
    try:
        args, plan_kind, plan_memory = _plan_options(args, show_plan)
        args, eval_request, compare_paths = take_eval_args(args)
        _one_mode(show_cfg, show_plan, eval_request is not None)
        if compare_paths is not None:
            from omni_rl.eval.compare import compare

            compare(*compare_paths)
            return 0
    except OmniConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args = [a for a in args if a not in ("--cfg", "--plan")]
    bad = [a for a in args if a.startswith("-")]
    if bad:
        print(f"error: unknown option {bad[0]!r}\n{USAGE.format(eval_usage=EVAL_USAGE)}", file=sys.stderr)
        return 2
    loose = [a for a in args if "=" not in a]
    if loose:
        print(f"error: {loose[0]!r} is not a key=value override or recipe=NAME (e.g. trainer.total_steps=10); "
              f"see `python main_omni.py --help`", file=sys.stderr)
        return 2
    if not any(a.startswith("recipe=") for a in args):
        args = [f"recipe={DEMO_RECIPE}", *args]
    try:
        cfg = load_config(args)
        if show_cfg:
            print(to_yaml(cfg))
            return 0
        if show_plan:
            from omni_rl.plan.planner import run_plan

            check_plan_data(cfg)
            print(f"plan: written to {run_plan(cfg, plan_kind, plan_memory)}")
            return 0
        if eval_request is not None:
            if eval_request.workers is not None:
                from omni_rl.eval.ray_shards import run_on_ray

                run_on_ray(cfg, eval_request, eval_request.workers)
            else:
                from omni_rl.eval.job import run_eval

                run_eval(cfg, eval_request)
            return 0
        check_inputs(cfg)
        from omni_rl.trainer import run

        run(cfg)
    except (OmniConfigError, OmniRunError) as err:
        # Every failure the command line reports derives from one of the two bases and carries
        # its exit code: 2 bad input, 1 a run that failed, 128 + N a run stopped by signal N
        # (TrainingInterrupted), a hub id neither cached nor reachable 1 (MissingWeightsError).
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(f"done: outputs in {cfg.trainer.output_dir}")
    return 0


def _print_options(args: list[str]) -> int:
    """`--options KEY=NAME [plugins=[...]]`: one component's options (`omni_rl.compose.options_help_for`)."""
    from omni_rl.compose import options_help_for
    from omni_rl.errors import ConfigError

    plugins = [a.split("=", 1)[1].strip("[]") for a in args if a.startswith("plugins=")]
    wanted = [a for a in args if not a.startswith("plugins=")]
    if len(wanted) != 1 or "=" not in wanted[0]:
        print(f"error: --options takes one KEY=NAME, e.g. --options model.adapter=LTX2Pipeline; got {wanted!r}",
              file=sys.stderr)
        return 2
    selector, name = wanted[0].split("=", 1)
    try:
        print(options_help_for(selector, name, [p for p in ",".join(plugins).split(",") if p]))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def setup_logging() -> None:
    """The console of a run (`omni_rl.logging.console.setup_console_logging`): records at INFO
    and above on stderr, written through the progress bar so they do not break it; known
    third-party noise left out; transformers' loading bars off. The run's own log,
    OUTPUT/train.log, is attached by the trainer once its output folder is set up."""
    from omni_rl.logging.console import setup_console_logging

    setup_console_logging(logging.INFO)


def check_inputs(cfg) -> None:
    """What the config points to, checked before any model loads (each raises the error the run
    would raise later): trainer.device is on this machine, the prompt files read, trainer.resume
    is a checkpoint, model.path holds a model or can be fetched, rollout.options.python (where the backend takes one) runs
    and finds the packages the backend's engine needs (this Python does, where the engine runs here)."""
    from omni_rl.data.prompts import check_prompt_sources
    from omni_rl.device import check_trainer_device
    from omni_rl.families.base import prompt_limits
    from omni_rl.models.loading import check_model_source
    from omni_rl.rollout.backends import ROLLOUT_BACKENDS
    from omni_rl.rollout.server.interpreter import check_python
    from omni_rl.rollout.vllm_omni.availability import require

    check_trainer_device(cfg.trainer.device, cfg.trainer.backend)
    packages = ROLLOUT_BACKENDS.get(cfg.rollout.backend).packages
    python = getattr(cfg.rollout.options, "python", None)
    check_python(python, "rollout.options.python", packages, cfg.rollout.backend)
    if python is None and packages and cfg.trainer.backend == "local":
        # The engine runs in this process (Ray workers may run another Python: they check there).
        require(cfg.rollout.backend, packages)
    sources = check_prompt_sources(cfg.data, prompt_limits(cfg))
    check_prompt_kind(cfg, sources)
    check_reward_prompts(cfg, sources)
    check_resume(cfg.trainer.resume)
    # With Ray the driver holds a weightless view of the model; the workers load the weights.
    check_model_source(cfg.model, weights=cfg.trainer.backend == "local")
    check_model_geometry(cfg)


def check_plan_data(cfg) -> None:
    """`--plan` reads the data as a run does (its rows, their kind, what the rewards need of each:
    `check_prompt_kind`, `check_reward_prompts` without the rewards' own files) when the files
    it names are here; a recipe whose data the user supplies still plans, and a warning names
    the files that were not read."""
    from omni_rl.data.prompts import absent_prompt_files, check_prompt_sources
    from omni_rl.families.base import prompt_limits

    absent = absent_prompt_files(cfg.data)
    if absent:
        logging.getLogger(__name__).warning(
            "plan: %s not here, so the data was not read; its rows are checked when the run starts", ", ".join(absent))
        return
    sources = check_prompt_sources(cfg.data, prompt_limits(cfg))
    check_prompt_kind(cfg, sources)
    check_reward_prompts(cfg, sources, read_files=False)


def check_prompt_kind(cfg, sources) -> None:
    """The prompts are the kind the diffusion adapter takes (source images for an editing model,
    none for text-to-image): `DiffusionModelBase.check_prompt_items`, as the trainer does later."""
    from omni_rl.data.prompts import PromptFileError
    from omni_rl.models.diffusion import DiffusionModelBase
    from omni_rl.models.registry import ADAPTERS, adapter_key

    adapter_class = ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage))
    if issubclass(adapter_class, DiffusionModelBase):
        for where, items in sources:
            try:
                adapter_class.check_prompt_items(items, where, cfg.model.adapter)
            except ValueError as err:
                raise PromptFileError(str(err)) from None


def check_model_geometry(cfg) -> None:
    """The settings within what the model's configs say it can take (`check_model_limits`: a
    diffusion model's size and frames, a talker's frames), and a diffusion step's memory with its latents
    (`config_latent_numel`, `omni_rl.models.limits.check_step_memory`), when the model is already on disk; the trainer
    checks the built model the same way otherwise (`omni_rl.models.limits`)."""
    from omni_rl.errors import ConfigError
    from omni_rl.models.diffusion import DiffusionModelBase
    from omni_rl.device import runs_on_cpu
    from omni_rl.models.limits import ComponentConfigs, check_step_memory, model_folder_on_disk
    from omni_rl.models.registry import ADAPTERS, adapter_key

    adapter_class = ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage))
    folder = model_folder_on_disk(cfg.model)
    if folder is not None:
        configs = ComponentConfigs(folder)
        try:
            adapter_class.check_model_limits(cfg, configs)
            # The step's memory with its trajectories, where the configs give the latent's size.
            latent_numel = (adapter_class.config_latent_numel(cfg, configs)
                            if issubclass(adapter_class, DiffusionModelBase) else None)
            if latent_numel is not None:
                check_step_memory(cfg, latent_numel, on_cpu=runs_on_cpu(cfg.trainer.device))
        except ValueError as err:
            raise ConfigError(str(err)) from None


def check_reward_prompts(cfg, sources, read_files: bool = True) -> None:
    """The prompts are ones the rewards can score (`register_reward(check_prompts=...)`), and
    every metadata key a reward needs (`register_reward(needs_metadata=...)`: the text a speech
    sample was asked to say) is one the model adds to its samples (`sample_metadata_keys` of its
    adapter) or in every prompt's metadata. The training rewards check the training prompts, and
    the validation rewards (or the training ones) the validation prompts (the training ones when
    none are given); each reward's `check_item` runs on every prompt. The files a reward's options
    name (a reference voice) are read here too, unless not `read_files` (`--plan`)."""
    from omni_rl.data.prompts import PromptFileError
    from omni_rl.models.registry import ADAPTERS, adapter_key
    from omni_rl.reward.inputs import RewardInputError
    from omni_rl.reward.registry import reward_declaration, reward_prompt_check

    architecture = adapter_key(cfg.model.adapter, cfg.model.stage)
    adapter_class = ADAPTERS.get(architecture)
    (train_where, train_items), *val = sources
    val_where, val_items = val[0] if val else (train_where, train_items)
    val_key = "reward.val_rewards" if cfg.reward.val_rewards else "reward.rewards"
    for rewards, list_key, where, items in ((cfg.reward.rewards, "reward.rewards", train_where, train_items),
                                            (cfg.reward.val_rewards or cfg.reward.rewards, val_key, val_where, val_items)):
        for index, item in enumerate(rewards):
            _check_metadata_needs(f"{list_key}[{index}]", item, architecture, adapter_class, where, items)
            if read_files:
                _check_reward_files(f"{list_key}[{index}]", item)
            _check_items(f"{list_key}[{index}]", item.name, reward_declaration(item.name).check_item, where, items)
            check = reward_prompt_check(item.name)
            if check is None:
                continue
            try:
                check([i.prompt for i in items], [i.metadata for i in items])
            except RewardInputError as err:
                raise PromptFileError(f"{where}: {err}") from None


def _check_items(key: str, name: str, check, where: str, items) -> None:
    """Every prompt is one the reward can score (`register_reward(check_item=...)`); the first that
    is not fails, naming its file, its line or row and the reason."""
    from omni_rl.data.prompts import PromptFileError

    if check is None:
        return
    for n, item in enumerate(items):
        reason = check(item.prompt, item.metadata)
        if reason is not None:
            at = item.origin or f"prompt {n + 1}"
            raise PromptFileError(f"{where}: {at}: {key}: reward {name!r} cannot score this prompt: it {reason}")


def _check_reward_files(key: str, item) -> None:
    """The files a reward's options name read (`register_reward(check_files=...)`)."""
    from omni_rl.errors import ConfigError
    from omni_rl.reward.registry import RewardConfigError, check_reward_files

    try:
        check_reward_files(item.name, dict(item.kwargs))
    except RewardConfigError as err:
        raise ConfigError(f"{key}.kwargs: {err}") from None


def _check_metadata_needs(key: str, item, architecture: str, adapter_class, where: str, items) -> None:
    """Each metadata key the reward `item` needs is added by the model or carried by every prompt."""
    from omni_rl.errors import ConfigError
    from omni_rl.data.prompts import PromptFileError
    from omni_rl.reward.registry import RewardConfigError, reward_metadata_needs

    try:
        needs = reward_metadata_needs(item.name, dict(item.kwargs))
    except RewardConfigError as err:
        raise ConfigError(f"{key}.kwargs: {err}") from None
    added = frozenset(getattr(adapter_class, "sample_metadata_keys", ()))
    for name in sorted(needs - added):
        lacking = next((n for n, i in enumerate(items) if name not in i.metadata), None)
        if lacking is None:
            continue
        adds = ", ".join(sorted(added)) or "nothing"
        at = f" at {items[lacking].origin}" if items[lacking].origin else ""
        raise PromptFileError(
            f"{where}: {key}: reward {item.name!r} needs metadata[{name!r}] on every sample, but "
            f"model.adapter={architecture!r} ({adapter_class.__name__}) does not add it (it adds: {adds}) and "
            f"prompt {lacking} ({items[lacking].prompt[:40]!r}){at} does not carry it; give every prompt a "
            f"metadata.{name} (a .jsonl prompt file), or use a model stage that adds it (a talker: spoken_text)"
        )


def check_resume(path: str | None) -> None:
    """`trainer.resume` is a checkpoint folder, or an output folder with checkpoints
    (`CheckpointError` otherwise; the trainer's own `find_checkpoint` decides)."""
    if not path:
        return
    from omni_rl.trainer.checkpoint import CheckpointError, find_checkpoint

    expected = "a checkpoint folder (OUTPUT/checkpoints/step_NNNNNN) or a run's output folder"
    folder = Path(path).expanduser()
    if not folder.exists():
        raise CheckpointError(f"trainer.resume={path!r}: no such folder; expected {expected}")
    if not folder.is_dir():
        raise CheckpointError(f"trainer.resume={path!r} is a file; expected {expected}")
    find_checkpoint(path)


def _one_mode(show_cfg: bool, show_plan: bool, evaluate: bool) -> None:
    """`--cfg`, `--plan` and `--eval` each do something else with the config: two of them together
    would silently drop one, so they are refused."""
    given = [flag for flag, on in (("--cfg", show_cfg), ("--plan", show_plan), ("--eval", evaluate)) if on]
    if len(given) > 1:
        raise OmniConfigError(
            f"{' and '.join(given)} do not combine (--cfg prints the config, --plan plans the run without "
            f"weights, --eval evaluates a model); give one of them"
        )


def _plan_options(args: list[str], show_plan: bool) -> tuple[list[str], str, float | None]:
    """`--device-kind NAME` / `--device-memory GB` (also `--opt=VALUE`), taken out of `args`;
    each checked here so bad input is one line before any recipe loads."""
    from omni_rl.plan.devices import DEFAULT_DEVICE_KIND, device_kind

    values: dict[str, str] = {}
    rest, i = [], 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name in ("--device-kind", "--device-memory"):
            if not eq:
                if i + 1 >= len(args):
                    raise OmniConfigError(f"{name}: expected a value after it")
                value, i = args[i + 1], i + 1
            values[name] = value
        else:
            rest.append(a)
        i += 1
    if values and not show_plan:
        raise OmniConfigError(f"{next(iter(values))}: only with --plan")
    kind = values.get("--device-kind", DEFAULT_DEVICE_KIND)
    device_kind(kind)
    memory = values.get("--device-memory")
    if memory is None:
        return rest, kind, None
    try:
        gb = float(memory)
    except ValueError:
        raise OmniConfigError(f"--device-memory={memory!r}: expected a positive number of GB (e.g. 80)") from None
    if not 0 < gb < math.inf:  # inf (or a figure past float's range) would overflow the plan's byte counts
        raise OmniConfigError(f"--device-memory={memory!r}: expected a positive number of GB (finite, e.g. 80)")
    return rest, kind, gb
