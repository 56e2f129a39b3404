"""Loading a reward's transformers model, processor or tokenizer from where the options say.

`load_pretrained(cls, source, what, reward)` loads a `tiny:NAME` model (built into the cache
once), a local folder or a hub id; a failure is raised again naming the reward, its option and
how to fetch the weights. `weightless_network(...)` builds the same network on the meta device
from its config alone (a hub id reads `recipes/architectures/rewards/<org>--<name>/`), for
`--plan`. Not `omni_rl.models.pretrained.load_pretrained`, which loads an adapter's networks.
"""
from __future__ import annotations

from typing import Any


def resolve_source(source: str, what: str) -> str:
    """`tiny:NAME` -> the folder of that tiny model (built once); anything else unchanged
    (a local folder or a hub id, handed to `from_pretrained`)."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"{what}={source!r}; expected a hub id, a local folder or tiny:NAME")
    if source.startswith("tiny:"):
        from omni_rl.models.loading import build_tiny_model

        return str(build_tiny_model(source[len("tiny:"):]))
    return source


def load_pretrained(cls: Any, source: str, what: str, reward: str) -> Any:
    """`cls.from_pretrained(source)` with an error that says how to get the weights."""
    try:
        return cls.from_pretrained(resolve_source(source, what))
    except OSError as err:
        raise OSError(
            f"{reward}: could not load {what}={source!r} with {cls.__name__}.from_pretrained ({err}). "
            f"Pass a local folder, or fetch it where the hub is reachable: "
            f"`hf download {source} --local-dir /models/{source.split('/')[-1]}` and set "
            f"{what}=/models/{source.split('/')[-1]}"
        ) from err


def config_folder(source: str, what: str, reward: str) -> str:
    """The folder whose `config.json` describes `source`: a tiny model's, a local folder, or the
    shipped `recipes/architectures/rewards/<org>--<name>/` of a hub id (no network)."""
    from pathlib import Path

    from omni_rl.errors import ConfigError
    from omni_rl.plan.architecture import PROJECT_ROOT, REWARD_ARCHITECTURES, shipped_folder

    resolved = resolve_source(source, what)
    if Path(resolved).expanduser().is_dir():
        return str(Path(resolved).expanduser())
    try:
        folder = shipped_folder(source, REWARD_ARCHITECTURES)
    except ConfigError:
        folder = None
    if folder is None or not (folder / "config.json").is_file():
        where = f" (no {folder.relative_to(PROJECT_ROOT)}/config.json)" if folder is not None else ""
        raise ConfigError(
            f"reward {reward}: {what}={source!r} is neither a local folder nor a hub id with a shipped "
            f"architecture{where}; point {what} at a folder holding the checkpoint's config.json (no weights needed)"
        )
    return str(folder)


def weightless_network(cls: Any, source: str, what: str, reward: str) -> Any:
    """`cls` built on the meta device from `source`'s config.json, in the config's dtype (what
    `from_pretrained`'s default `dtype="auto"` gives; float32 when it names none)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(config_folder(source, what, reward))
    dtype = getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    with torch.device("meta"):
        model = cls(config)
    return model.to(dtype)


def device_network(cls_name: str, what: str, default: str, reward: str) -> Any:
    """A `device_networks` declaration for a reward that loads one transformers `cls_name` from
    its option `what` (default `default`): `(**options) -> [(source, weightless network)]`."""

    def networks(**options: Any) -> list[tuple[str, Any]]:
        import transformers

        source = options.get(what) or default
        return [(source, weightless_network(getattr(transformers, cls_name), source, what, reward))]

    return networks
