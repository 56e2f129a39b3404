"""Prompt datasets for generation RL: inline lists or files, sampled deterministically per step.

Reads `.txt`, `.jsonl` and `.parquet` prompt files (formats in docs/recipes.md, Prompt files;
edit and chat files go to `edit_prompts` / `chat_prompts`). `prompts_for_step(step)` returns the
same prompts for the same step whatever happened before (epoch shuffles keyed by the seed), so
resume is exact. `PromptItem` and `PromptFileError` are re-exported from `prompt_item`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Optional

from omni_rl.data.chat_prompts import is_chat_row, load_chat_items
from omni_rl.data.edit_prompts import is_edit_parquet, is_edit_row, load_edit_items
from omni_rl.data.preference_file import load_preference_file, preference_prompts
from omni_rl.data.prompt_chars import bound_prompt_chars
from omni_rl.data.prompt_length import PromptLimitOptions
from omni_rl.data.prompt_item import PromptFileError, PromptItem
from omni_rl.data.prompt_text import check_prompt_text, check_regular_file, is_blank, read_text_lines
from omni_rl.data.row_metadata import row_metadata

__all__ = ["PromptFileError", "PromptItem", "PromptSampler", "absent_prompt_files", "load_prompt_items", "read_prompt_file",
           "training_prompt_items", "validation_prompt_items"]


# The config key of the file behind each inline-prompt key, for messages.
_FILE_KEYS = {"data.prompts": "data.prompt_file", "data.val_prompts": "data.val_prompt_file"}


def load_prompt_items(prompts: Optional[list[str]], prompt_file: Optional[str], what: str = "data.prompts",
                      allow_outside: bool = False) -> list[PromptItem]:
    """Inline prompts win; otherwise read `prompt_file` (its media paths inside its folder unless
    `allow_outside`, `data.allow_paths_outside`)."""
    if prompts is not None:
        items = [PromptItem(str(p)) for p in prompts]
        where = what
    elif prompt_file is not None:
        key = _FILE_KEYS.get(what, f"{what} file")
        items = read_prompt_file(prompt_file, key, allow_outside)
        where = f"{key}={prompt_file!r}"
        if not items:
            raise PromptFileError(
                f"{where}: no prompts in {_locate(prompt_file)} (blank lines and # comments are "
                f"skipped); add prompts to it or point {key} at another file"
            )
    else:
        raise PromptFileError(f"{what}: no prompts given; set {what} (a list) or a prompt file")
    if not items:
        raise PromptFileError(f"{what}: the prompt list is empty")
    for i, item in enumerate(items):
        if is_blank(item.prompt) and not item.media:  # an image alone can be the question
            raise PromptFileError(f"{where}: prompt {i} is empty")
    check_prompt_text(items, where)
    return items


def training_prompt_items(data, limits: Optional[PromptLimitOptions] = None) -> list[PromptItem]:
    """The training prompts of a `DataConfig`: `data.prompts` or `data.prompt_file`, or with
    `data.preference_file` (offline pairs) the pairs' distinct prompts, every row checked; each
    prompt's characters bounded before any tokenizer sees it (`omni_rl.data.prompt_chars`) by
    `limits`, the model family's prompt limits (`families.base.prompt_limits`; None: the defaults)."""
    limits = limits if limits is not None else PromptLimitOptions()
    if data.preference_file is not None:
        return preference_prompts(load_preference_file(data.preference_file, data.allow_paths_outside,
                                                       limits.max_prompt_tokens))
    items = load_prompt_items(data.prompts, data.prompt_file, allow_outside=data.allow_paths_outside)
    return bound_prompt_chars(items, limits.max_prompt_tokens, limits.overlong_prompts,
                              _where(data.prompts, data.prompt_file, "data.prompts"))


def validation_prompt_items(data, limits: Optional[PromptLimitOptions] = None) -> Optional[list[PromptItem]]:
    """The validation prompts of a `DataConfig` (`data.val_prompts` or `data.val_prompt_file`),
    characters bounded as the training prompts' are; None when neither is set."""
    if data.val_prompts is None and data.val_prompt_file is None:
        return None
    limits = limits if limits is not None else PromptLimitOptions()
    items = load_prompt_items(data.val_prompts, data.val_prompt_file, "data.val_prompts", data.allow_paths_outside)
    return bound_prompt_chars(items, limits.max_prompt_tokens, limits.overlong_prompts,
                              _where(data.val_prompts, data.val_prompt_file, "data.val_prompts"))


def check_prompt_sources(data, limits: Optional[PromptLimitOptions] = None) -> list[tuple[str, list[PromptItem]]]:
    """Read `data.prompt_file` (or `data.preference_file`) and `data.val_prompt_file` (a
    `DataConfig`) as the trainer will (with the family's prompt `limits`), so that a bad file
    stops the run before any model loads; raises `PromptFileError`. Returns (where, items) for
    each source, `where` naming it for messages (e.g. "data.prompt_file='x.jsonl'")."""
    where = (f"data.preference_file={data.preference_file!r}" if data.preference_file is not None
             else _where(data.prompts, data.prompt_file, "data.prompts"))
    sources = [(where, training_prompt_items(data, limits))]
    val_items = validation_prompt_items(data, limits)
    if val_items is not None:
        sources.append((_where(data.val_prompts, data.val_prompt_file, "data.val_prompts"), val_items))
    return sources


def absent_prompt_files(data) -> list[str]:
    """The files a `DataConfig` names that a run would read and that are not here, each as
    "key='path'" (empty when every one is, or the prompts are inline): `--plan` reads the data
    when it is here and says which files it could not read otherwise."""
    named = (("data.preference_file", data.preference_file),
             ("data.prompt_file", data.prompt_file if data.prompts is None else None),
             ("data.val_prompt_file", data.val_prompt_file if data.val_prompts is None else None))
    return [f"{key}={path!r}" for key, path in named if path is not None and not _locate(path).exists()]


# A real recipe whose data is not shipped names, in its header, the public file, its format,
# where to get it and the override that points at it.
_MISSING_HINT = ("check the path, or get the file: a recipe that does not ship its data says in its header "
                 "(recipes/NAME.yaml, under 'Data:') which public file it reads, its format and where to get it; "
                 "then set {key}=PATH")


def _where(prompts, prompt_file, what: str) -> str:
    return what if prompts is not None else f"{_FILE_KEYS[what]}={prompt_file!r}"


def _locate(path: str) -> Path:
    file = Path(path).expanduser()
    if not file.is_absolute() and not file.exists():
        # Recipes name prompt files relative to the project root.
        from omni_rl.config.loader import PROJECT_ROOT

        file = PROJECT_ROOT / path
    return file


def read_prompt_file(path: str, key: Optional[str] = None, allow_outside: bool = False) -> list[PromptItem]:
    """The prompts in file `path`; `key` (e.g. "data.prompt_file") names it in errors. The media
    paths of its rows stay inside its folder unless `allow_outside` (`omni_rl.data.dataset_folder`)."""
    label = f"{key}={path!r}" if key else f"prompt file {path!r}"
    file = _locate(path)
    if file.is_dir():
        raise PromptFileError(f"{label} is a folder, expected a .txt, .jsonl or .parquet file")
    if not file.exists():
        raise PromptFileError(f"{label} does not exist (looked for {file}); {_MISSING_HINT.format(key=key or 'data.prompt_file')}")
    check_regular_file(file, label)
    if file.suffix not in (".txt", ".jsonl", ".parquet"):
        raise PromptFileError(f"{label}: expected a .txt, .jsonl or .parquet file")
    items: list[PromptItem] = []
    if file.suffix == ".parquet":
        return load_edit_items(file, allow_outside) if is_edit_parquet(file) else load_chat_items(file, allow_outside)
    lines = read_text_lines(file, label)
    kind = _jsonl_kind(lines) if file.suffix == ".jsonl" else None
    if kind == "edit":
        return load_edit_items(file, allow_outside)
    if kind == "chat":
        return load_chat_items(file, allow_outside)
    if file.suffix == ".jsonl":
        for n, line in enumerate(lines, start=1):
            if is_blank(line):
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptFileError(f"{path}:{n}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise PromptFileError(f"{path}:{n}: expected an object with a string 'prompt'")
            items.append(PromptItem(row["prompt"], row_metadata(row, ("prompt",), f"{path}:{n}"), origin=f"line {n}"))
    else:  # .txt
        items = [PromptItem(line.strip(), origin=f"line {n}") for n, line in enumerate(lines, start=1)
                 if not is_blank(line) and not line.lstrip().startswith("#")]
    return items


def _jsonl_kind(lines: list[str]) -> Optional[str]:
    """"edit" if any row is an edit row, else "chat" if any is a chat row, else None (plain)."""
    kind = None
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # reported, with its line, by whichever reader reads the file
        if is_edit_row(row):
            return "edit"
        if is_chat_row(row):
            kind = "chat"
    return kind


class PromptSampler:
    """Walks through the prompts in epochs, `per_step` at a time; reshuffled each epoch."""

    def __init__(self, items: list[PromptItem], per_step: int, seed: int, shuffle: bool = True):
        self.items = items
        self.per_step = per_step
        self.seed = seed
        self.shuffle = shuffle

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(f"prompts-{self.seed}-{epoch}").shuffle(order)
        return order

    def prompts_for_step(self, step: int) -> list[PromptItem]:
        """The `per_step` prompts of training step `step` (0-based)."""
        out = []
        n = len(self.items)
        for k in range(step * self.per_step, (step + 1) * self.per_step):
            epoch, pos = divmod(k, n)
            out.append(self.items[self._epoch_order(epoch)[pos]])
        return out
