"""Preference-pair files for offline Diffusion-DPO: JSONL, one pair a row.

    {"prompt": "a red cube", "chosen": "imgs/0_w.png", "rejected": "imgs/0_l.png"}

`load_preference_file` checks every row (fields, two different decodable images) before any
model loads, raising `PreferenceFileError` naming the file, row and field.
Not here: encoding into latents, batching, which pairs a step trains (`omni_rl.families`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from omni_rl.data.dataset_folder import DatasetFolder, MissingFileError
from omni_rl.data.image_decode import decode_image, pixel_digest
from omni_rl.data.prompt_chars import prompt_char_limit
from omni_rl.data.prompt_item import PromptFileError, PromptItem

FIELDS = ("prompt", "chosen", "rejected")


class PreferenceFileError(PromptFileError):
    """A preference file or one of its rows is unusable; the message names the file, row and field."""


@dataclass(frozen=True)
class PreferenceRow:
    prompt: str
    chosen: Path
    rejected: Path
    where: str  # "FILE, row N": for the errors of later reads


def load_preference_file(path: str | Path, allow_outside: bool = False,
                         max_prompt_tokens: Optional[int] = None) -> list[PreferenceRow]:
    """Every row of the file, checked (see the module docstring); image paths stay inside the
    file's folder unless `allow_outside` (`data.allow_paths_outside`), prompts within the
    character bound of `max_prompt_tokens` (`omni_rl.data.prompt_chars`)."""
    max_chars, max_chars_text = prompt_char_limit(max_prompt_tokens)
    file = Path(path)
    if not file.is_file():
        raise PreferenceFileError(f"{file}: no such preference file (expected JSONL rows with {', '.join(FIELDS)})")
    folder = DatasetFolder(file.parent, allow_outside)
    digests: dict[Path, str] = {}  # a file named by several rows is decoded once
    rows = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file}, row {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise PreferenceFileError(f"{where}: not JSON ({err.msg}); expected one object a line") from None
        if not isinstance(row, dict):
            raise PreferenceFileError(f"{where}: a {type(row).__name__}; expected an object with {', '.join(FIELDS)}")
        for field in FIELDS:
            value = row.get(field)
            if not isinstance(value, str) or not value.strip():
                raise PreferenceFileError(f"{where}: field {field!r} is {value!r}; expected a non-empty string")
        if len(row["prompt"]) > max_chars:  # a pair's prompt is never cut: refused before any tokenizer
            raise PreferenceFileError(f"{where}: field 'prompt' is {len(row['prompt']):,} characters, over the bound "
                                      f"of {max_chars:,} ({max_chars_text}); shorten it or remove the row")
        images = {field: _image_file(folder, row[field], f"{where}: field {field!r}") for field in ("chosen", "rejected")}
        _check_distinct(images["chosen"], images["rejected"], row, where, digests)
        rows.append(PreferenceRow(row["prompt"], images["chosen"], images["rejected"], where))
    if not rows:
        raise PreferenceFileError(f"{file}: no rows; expected JSONL rows with {', '.join(FIELDS)}")
    return rows


def _image_file(folder: DatasetFolder, value: str, where: str) -> Path:
    try:
        return folder.file(value, where)
    except MissingFileError:
        raise PreferenceFileError(f"{where}: {folder.root / value} is not a file (no such file; paths are relative "
                                  f"to the preference file's folder)") from None
    except PromptFileError as err:
        raise PreferenceFileError(f"{err} (paths are relative to the preference file's folder)") from None


def _check_distinct(chosen: Path, rejected: Path, row: dict, where: str, digests: dict[Path, str]) -> None:
    """Decode both images (readable, under the pixel cap) and refuse a pair of one picture: its
    DPO loss is ln 2 whatever the model does, so a file of such pairs would train on nothing."""
    if chosen == rejected:
        raise PreferenceFileError(
            f"{where}: 'chosen' and 'rejected' are the same file ({row['chosen']!r}, {row['rejected']!r}); a pair "
            f"needs two different images: fix or remove the row"
        )
    for field, image in (("chosen", chosen), ("rejected", rejected)):
        if image not in digests:
            try:
                digests[image] = pixel_digest(decode_image(image, f"{where}: field {field!r}", str(image)))
            except PromptFileError as err:
                raise PreferenceFileError(str(err)) from None
    if digests[chosen] == digests[rejected]:
        raise PreferenceFileError(
            f"{where}: 'chosen' ({row['chosen']!r}) and 'rejected' ({row['rejected']!r}) hold the same pixels; a "
            f"pair needs two different images (the DPO loss of a pair of one picture is ln 2 whatever the model "
            f"does): fix or remove the row"
        )


def preference_prompts(rows: list[PreferenceRow]) -> list[PromptItem]:
    """The rows' distinct prompts, in the order they first appear."""
    return [PromptItem(prompt) for prompt in dict.fromkeys(row.prompt for row in rows)]


def read_pair_images(row: PreferenceRow, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The row's (chosen, rejected) images as uint8 [height, width, 3], RGB, resized bicubically."""
    from PIL import Image

    out = []
    for field in ("chosen", "rejected"):
        path = getattr(row, field)
        try:
            rgb = decode_image(path, f"{row.where}: field {field!r}", str(path)).resize((width, height), Image.BICUBIC)
        except PromptFileError as err:  # the file changed since it was checked at load
            raise PreferenceFileError(str(err)) from None
        out.append(torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()))
    return out[0], out[1]
