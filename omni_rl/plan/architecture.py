"""Where a plan finds a model's configuration files: `architecture_folder(model_path)`.

- `tiny:NAME`: the tiny model's folder (built once into the cache, as a run does);
- a local folder: used as it is (a user planning a custom checkpoint needs only its config files);
- a hub id `org/name`: the shipped `recipes/architectures/org--name/` (the hub id with "/" written
  "--", as Hugging Face's cache names it; a reward model's under `recipes/architectures/rewards/`).
  No network: a hub id without a shipped folder is a one-line `ConfigError`.
"""
from __future__ import annotations

from pathlib import Path

from omni_rl.config.loader import PROJECT_ROOT
from omni_rl.errors import ConfigError

ARCHITECTURES = PROJECT_ROOT / "recipes" / "architectures"
# The reward models' configs (`omni_rl.plan.rewards`), kept apart from the policies'.
REWARD_ARCHITECTURES = ARCHITECTURES / "rewards"
TINY_PREFIX = "tiny:"


def shipped_folder(hub_id: str, root: Path = ARCHITECTURES) -> Path:
    """recipes/architectures/org--name (under `root`) for the hub id `org/name`."""
    org, sep, name = hub_id.partition("/")
    if not sep or not org or not name or "/" in name:
        raise ConfigError(
            f"model.path={hub_id!r}: expected a hub id 'org/name', a local folder or tiny:NAME to plan from"
        )
    return root / f"{org}--{name}"


def architecture_folder(model_path: str) -> Path:
    """The folder whose configuration files the plan builds `model_path` from (module docstring)."""
    if model_path.startswith(TINY_PREFIX):
        from omni_rl.models.loading import resolve_model_path

        return Path(resolve_model_path(model_path))
    local = Path(model_path).expanduser()
    if local.is_dir():
        return local
    folder = shipped_folder(model_path)
    if not folder.is_dir():
        raise ConfigError(
            f"model.path={model_path!r}: no architecture folder {folder.relative_to(PROJECT_ROOT)} and no local "
            f"folder of that name; point model.path at a snapshot holding the checkpoint's config files "
            f"(no weights needed) or add the folder"
        )
    return folder
