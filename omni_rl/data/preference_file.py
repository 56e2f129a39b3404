"""Preference-pair files for offline Diffusion-DPO: JSONL, one pair a row.

    {"prompt": "a red cube", "chosen": "imgs/0_w.png", "rejected": "imgs/0_l.png"}

`chosen` and `rejected` are image paths (anything PIL reads), relative to the file's folder
unless absolute. `load_preference_file` checks every row before anything loads a model; a bad
row raises `PreferenceFileError` naming the file, the row (1-based) and the field.
`read_pair_images` reads one pair as uint8 [H, W, 3] tensors at the size the model encodes them;
`preference_prompts` gives the file's distinct prompts (what validation samples by default).
`PreferenceFileError` is a `PromptFileError`, so the command line reports it as one of bad input.

Not here: encoding the images into latents (`DiffusionModelBase.encode_images`), the pairs'
batch (`omni_rl.families.preference_pairs.PairBatch.from_images`) and which pairs a step trains
(`omni_rl.families.offline_pairs`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

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


def load_preference_file(path: str | Path) -> list[PreferenceRow]:
    file = Path(path)
    if not file.is_file():
        raise PreferenceFileError(f"{file}: no such preference file (expected JSONL rows with {', '.join(FIELDS)})")
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
        images = {}
        for field in ("chosen", "rejected"):
            image = Path(row[field]).expanduser()
            image = image if image.is_absolute() else file.parent / image
            if not image.is_file():
                raise PreferenceFileError(f"{where}: field {field!r}: {image} is not a file (paths are relative to "
                                          f"the preference file's folder)")
            images[field] = image
        rows.append(PreferenceRow(row["prompt"], images["chosen"], images["rejected"], where))
    if not rows:
        raise PreferenceFileError(f"{file}: no rows; expected JSONL rows with {', '.join(FIELDS)}")
    return rows


def preference_prompts(rows: list[PreferenceRow]) -> list[PromptItem]:
    """The rows' distinct prompts, in the order they first appear."""
    return [PromptItem(prompt) for prompt in dict.fromkeys(row.prompt for row in rows)]


def read_pair_images(row: PreferenceRow, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The row's (chosen, rejected) images as uint8 [height, width, 3], RGB, resized bicubically."""
    from PIL import Image, UnidentifiedImageError

    out = []
    for field in ("chosen", "rejected"):
        path = getattr(row, field)
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB").resize((width, height), Image.BICUBIC)
        except (UnidentifiedImageError, OSError) as err:
            raise PreferenceFileError(f"{row.where}: field {field!r}: {path} is not a readable image ({err})") from None
        out.append(torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()))
    return out[0], out[1]
