"""What the rewards need of the run's prompts, checked before any model loads.

`check_reward_prompts(cfg, sources)` runs each reward's declared checks (`needs_metadata`,
`check_files`, `check_item`, `check_prompts`: `omni_rl.reward.registry`); a failure is one error
naming the file, row, reward and reason. Left out: scoring anything (no reward is built here).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from omni_rl.errors import ConfigError
from omni_rl.data.prompt_item import PromptFileError
from omni_rl.models.registry import ADAPTERS, adapter_key
from omni_rl.reward.inputs import RewardInputError
from omni_rl.reward.registry import (
    RewardConfigError,
    check_reward_files,
    reward_declaration,
    reward_metadata_needs,
    reward_prompt_check,
)


def check_reward_prompts(cfg, sources, read_files: bool = True) -> None:
    """The prompts are ones the rewards can score (`check_prompts`, `check_item`), and every metadata
    key a reward needs is added by the model or carried by every prompt. Training rewards check the
    training prompts, validation rewards the validation ones; option files are read unless not
    `read_files` (`--plan`)."""
    architecture = adapter_key(cfg.model.adapter, cfg.model.stage)
    adapter_class = ADAPTERS.get(architecture)
    (train_where, train_items), *val = sources
    val_where, val_items = val[0] if val else (train_where, train_items)
    val_key = "reward.val_rewards" if cfg.reward.val_rewards else "reward.rewards"
    for rewards, list_key, where, items in ((cfg.reward.rewards, "reward.rewards", train_where, train_items),
                                            (cfg.reward.val_rewards or cfg.reward.rewards, val_key, val_where, val_items)):
        for index, item in enumerate(rewards):
            key = f"{list_key}[{index}]"
            check_metadata_needs(key, item, architecture, adapter_class, where, items)
            if read_files:
                with _named_entry(key):
                    check_reward_files(item.name, dict(item.reward_options))
            check_items(key, item.name, reward_declaration(item.name).check_item, where, items)
            check = reward_prompt_check(item.name)
            try:
                if check is not None:
                    check([i.prompt for i in items], [i.metadata for i in items])
            except RewardInputError as err:
                raise PromptFileError(f"{where}: {err}") from None


def check_items(key: str, name: str, check, where: str, items) -> None:
    """Every prompt is one the reward can score (`register_reward(check_item=...)`); the first that
    is not fails, naming its file, its line or row and the reason."""
    if check is None:
        return
    for n, item in enumerate(items):
        reason = check(item.prompt, item.metadata)
        if reason is not None:
            at = item.origin or f"prompt {n + 1}"
            raise PromptFileError(f"{where}: {at}: {key}: reward {name!r} cannot score this prompt: it {reason}")


def check_metadata_needs(key: str, item, architecture: str, adapter_class, where: str, items) -> None:
    """Each metadata key the reward `item` needs is added by the model or carried by every prompt."""
    with _named_entry(key):
        needs = reward_metadata_needs(item.name, dict(item.reward_options))
    added = adapter_class.sample_metadata_keys
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


@contextlib.contextmanager
def _named_entry(key: str) -> Iterator[None]:
    """The reward's own error (it names the reward) with the config key of its list entry in front."""
    try:
        yield
    except RewardConfigError as err:
        raise ConfigError(f"{key}.reward_options: {err}") from None
