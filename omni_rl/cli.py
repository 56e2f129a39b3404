"""Command line: compose the config, run the trainer, and turn known failures into one line.

Exit codes: 0 done, 2 bad config or command line (an output folder that is a file, in use or
holding another run included), 1 a run that failed (the message names the component: reward,
model weights, rollout engine, prompt file, a full disk), 128 + N a run stopped by signal N
(143 SIGTERM, 130 SIGINT: the training loop saves the step it finished and says where).
The code is the error's own (`omni_rl.errors`): every error reported here derives from
`OmniConfigError` or `OmniRunError`, and those two (plus a Ctrl-C outside the loop) are all
this module catches.

`check_inputs` runs, before anything loads, the checks of what the config points to (device,
prompt files, resume checkpoint, model folder or hub id, rollout Python), each kept with what it
checks and raising its own config error, so those mistakes cost seconds, not a model load.
`--plan` reads the data too when its files are here (`check_plan_data`).
"""
from __future__ import annotations

import logging
import math
import sys
from typing import Sequence

from omni_rl.errors import OmniConfigError, OmniRunError

# What `python main_omni.py` runs when no recipe is named: the newcomer's demo. (The schema's
# own default, for `load_config` in code and tests, is the faster random-weight tiny_sd3_flowgrpo.)
DEMO_RECIPE = "tiny_sd3_shapes_counting"

USAGE = """usage: python main_omni.py [recipe=NAME] [key=value ...] [--cfg] [--plan] [--eval NAME ...]
       python main_omni.py --options KEY=NAME
       python main_omni.py --compare A B

  recipe=NAME   a YAML file in recipes/ (default: tiny_sd3_shapes_counting, the CPU demo)
  key=value     override any config key, e.g. trainer.total_steps=10 rollout.sampling_options.num_steps=8
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
    from omni_rl.config import available_recipes

    from omni_rl.eval.cli_args import USAGE as EVAL_USAGE, take_eval_args

    if "-h" in args or "--help" in args:
        print(USAGE.format(eval_usage=EVAL_USAGE) + "\nrecipes: " + ", ".join(available_recipes()))
        return 0
    try:
        if "--options" in args:
            _print_options([a for a in args if a != "--options"])
            return 0
        show_cfg = "--cfg" in args
        if show_cfg:
            at = args.index("--cfg")
            # Hydra's own spelling, `--cfg job` (or all / hydra): the job's config is what there is.
            if at + 1 < len(args) and args[at + 1] in CFG_WORDS:
                del args[at + 1]
        show_plan = "--plan" in args
        args, plan_kind, plan_memory = _plan_options(args, show_plan)
        args, eval_request, compare_paths = take_eval_args(args)
        _one_mode(show_cfg, show_plan, eval_request is not None)
        if compare_paths is not None:
            from omni_rl.eval.compare import compare

            compare(*compare_paths)
            return 0
        args = [a for a in args if a not in ("--cfg", "--plan")]
        bad = [a for a in args if a.startswith("-")]
        if bad:
            raise OmniConfigError(f"unknown option {bad[0]!r}\n{USAGE.format(eval_usage=EVAL_USAGE)}")
        loose = [a for a in args if "=" not in a]
        if loose:
            raise OmniConfigError(f"{loose[0]!r} is not a key=value override or recipe=NAME (e.g. "
                                  f"trainer.total_steps=10); see `python main_omni.py --help`")
        if not any(a.startswith("recipe=") for a in args):
            args = [f"recipe={DEMO_RECIPE}", *args]
        cfg = _dispatch(args, show_cfg, show_plan, plan_kind, plan_memory, eval_request)
    except (OmniConfigError, OmniRunError) as err:
        # Every failure the command line reports derives from one of the two bases and carries
        # its exit code: 2 bad input, 1 a run that failed, 128 + N a run stopped by signal N
        # (TrainingInterrupted), a hub id neither cached nor reachable 1 (MissingWeightsError).
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    if cfg is not None:
        print(f"done: outputs in {cfg.trainer.output_dir}")
    return 0


def _dispatch(args: list[str], show_cfg: bool, show_plan: bool, plan_kind: str, plan_memory: float | None,
              eval_request):
    """Compose the config and do what the command line asked; the config of a training run that
    finished, None for the other modes."""
    from omni_rl.compose import load_config
    from omni_rl.config import to_yaml

    cfg = load_config(args)
    if show_cfg:
        print(to_yaml(cfg))
    elif show_plan:
        from omni_rl.plan.planner import run_plan

        check_plan_data(cfg)
        print(f"plan: written to {run_plan(cfg, plan_kind, plan_memory)}")
    elif eval_request is not None and eval_request.workers is not None:
        from omni_rl.eval.ray_shards import run_on_ray

        run_on_ray(cfg, eval_request, eval_request.workers)
    elif eval_request is not None:
        from omni_rl.eval.job import run_eval

        run_eval(cfg, eval_request)
    else:
        check_inputs(cfg)
        from omni_rl.trainer import run

        run(cfg)
        return cfg
    return None


def _print_options(args: list[str]) -> None:
    """`--options KEY=NAME [plugins=[...]]`: one component's options (`omni_rl.compose.options_help_for`)."""
    from omni_rl.compose import options_help_for

    plugins = [a.split("=", 1)[1].strip("[]") for a in args if a.startswith("plugins=")]
    wanted = [a for a in args if not a.startswith("plugins=")]
    if len(wanted) != 1 or "=" not in wanted[0]:
        raise OmniConfigError(f"--options takes one KEY=NAME, e.g. --options model.adapter=LTX2Pipeline; "
                              f"got {wanted!r}")
    selector, name = wanted[0].split("=", 1)
    print(options_help_for(selector, name, [p for p in ",".join(plugins).split(",") if p]))


def setup_logging() -> None:
    """The console of a run (`omni_rl.logging.console.setup_console_logging`): records at INFO
    and above on stderr, written through the progress bar so they do not break it; known
    third-party noise left out; transformers' loading bars off. The run's own log,
    OUTPUT/train.log, is attached by the trainer once its output folder is set up."""
    from omni_rl.logging.console import setup_console_logging

    setup_console_logging(logging.INFO)


def check_inputs(cfg) -> None:
    """What the config points to, checked before any model loads (each raises the error the run
    would raise later): trainer.device is on this machine, rollout.backend_options.python (where the
    backend takes one) runs and finds the packages the backend's engine needs (this Python does,
    where the engine runs here), the prompt files read and suit the model and the rewards,
    trainer.resume is a checkpoint, model.path holds a model or can be fetched, and the rollout
    geometry is within what the model's configs allow."""
    from omni_rl.device import check_trainer_device
    from omni_rl.models.geometry import check_model_geometry
    from omni_rl.models.loading import check_model_source
    from omni_rl.rollout.backends import ROLLOUT_BACKENDS, ServerProcessOptions
    from omni_rl.rollout.server.interpreter import check_python
    from omni_rl.rollout.vllm_omni.availability import require
    from omni_rl.trainer.checkpoint import check_resume
    from omni_rl.workers.teacher_pool import check_device_budget

    check_trainer_device(cfg.trainer.device, cfg.trainer.backend)
    check_device_budget(cfg)  # training ranks + reward workers + teacher pools fit the machine
    packages = ROLLOUT_BACKENDS.get(cfg.rollout.backend).packages
    options = cfg.rollout.backend_options
    python = options.python if isinstance(options, ServerProcessOptions) else None
    check_python(python, "rollout.backend_options.python", packages, cfg.rollout.backend)
    if python is None and packages and cfg.trainer.backend == "local":
        # The engine runs in this process (Ray workers may run another Python: they check there).
        require(cfg.rollout.backend, packages)
    _check_prompts(cfg, read_files=True)
    check_resume(cfg.trainer.resume)
    # With Ray the driver holds a weightless view of the model; the workers load the weights.
    check_model_source(cfg.model, weights=cfg.trainer.backend == "local")
    check_model_geometry(cfg)


def check_plan_data(cfg) -> None:
    """`--plan` reads the data as a run does (its rows, their kind, what the rewards need of each,
    without the rewards' own files) when the files it names are here; a recipe whose data the
    user supplies still plans, and a warning names the files that were not read."""
    from omni_rl.data.prompts import absent_prompt_files

    absent = absent_prompt_files(cfg.data)
    if absent:
        logging.getLogger(__name__).warning(
            "plan: %s not here, so the data was not read; its rows are checked when the run starts", ", ".join(absent))
        return
    _check_prompts(cfg, read_files=False)


def _check_prompts(cfg, read_files: bool) -> None:
    """The prompt sources read, of the kind a diffusion adapter takes, and scorable by the rewards."""
    from omni_rl.data.prompts import check_prompt_sources
    from omni_rl.families.base import prompt_limits
    from omni_rl.families.diffusion import check_prompt_kind
    from omni_rl.models.diffusion import DiffusionModelBase
    from omni_rl.models.registry import ADAPTERS, adapter_key
    from omni_rl.reward.prompt_checks import check_reward_prompts

    sources = check_prompt_sources(cfg.data, prompt_limits(cfg))
    adapter_class = ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage))
    if issubclass(adapter_class, DiffusionModelBase):
        for where, items in sources:
            check_prompt_kind(adapter_class, items, where, cfg.model.adapter)
    check_reward_prompts(cfg, sources, read_files=read_files)


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
