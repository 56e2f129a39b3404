"""Image-editing prompt files (Qwen-Image-Edit style RL): `.jsonl` / `.parquet` rows -> `PromptItem`s.

`load_edit_items(path)` reads rows of `instruction` and `source_image` with optional captions,
`reference_image` and `metadata`, and the peers' layouts as they ship (docs/recipes.md, Prompt
files). The source reaches the adapter as `media["images"][0]` and the rewards as
`metadata["source_image"]`; images are decoded at load, and a bad row raises `PromptFileError`
naming the file, the 1-based row and the field.

    {"instruction": "make it brighter", "source_image": "dark_red.png", "metadata": {"brightness_direction": 1}}

Left out on purpose: several source images per row, masks, lazy decoding.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from PIL import Image

from omni_rl.data.chat_prompts import IMAGE_PLACEHOLDER, chat_last_user_text, chat_messages, load_image, read_rows, where_in_file
from omni_rl.data.dataset_folder import DatasetFolder, MissingFileError, is_base64
from omni_rl.data.prompt_item import PromptFileError, PromptItem

__all__ = [
    "SOURCE_IMAGE",
    "is_edit_parquet",
    "is_edit_row",
    "item_has_source_image",
    "load_edit_items",
]

SOURCE_IMAGE = "source_image"
REFERENCE_IMAGE = "reference_image"
# The peers' names: Flow-Factory's / verl-omni's `image` field, verl-omni's edit rows' `ability`.
IMAGE = "image"
ABILITY, IMAGE_EDIT = "ability", "image_edit"
_PICTURE_LABEL = re.compile(r"Picture\s+\d+\s*:\s*$")
TEXT_FIELDS = ("target_text", "source_text")
# Keys a row sets itself; its `metadata` object may not hold them too.
ROW_KEYS = (SOURCE_IMAGE, REFERENCE_IMAGE, *TEXT_FIELDS)


def item_has_source_image(item: PromptItem) -> bool:
    """Whether `item` is an image-editing prompt: its metadata holds a decoded `source_image`
    (a PIL image), as every item `load_edit_items` returns does. False for text-to-image and
    chat prompts; the core can use it to tell an edit dataset from a text-to-image one."""
    return isinstance(item.metadata.get(SOURCE_IMAGE), Image.Image)


def is_edit_row(row: Any) -> bool:
    """Whether a `.jsonl` row belongs to an edit file: an object with a `source_image` or `image`
    key, or verl-omni's `ability` "image_edit"."""
    return isinstance(row, dict) and (SOURCE_IMAGE in row or IMAGE in row or row.get(ABILITY) == IMAGE_EDIT)


def is_edit_parquet(file: str | Path) -> bool:
    """Whether a `.parquet` file has a `source_image` column, or an `ability` column of
    "image_edit" on every row (verl-omni's edit files). Reads the schema and that one column;
    False when pyarrow is missing or the file is unreadable (the chat reader then reports that)."""
    try:
        import pyarrow.parquet as pq

        names = pq.read_schema(file).names
        if SOURCE_IMAGE in names:
            return True
        if ABILITY not in names:
            return False
        abilities = pq.read_table(file, columns=[ABILITY]).column(ABILITY).to_pylist()
        return bool(abilities) and all(value == IMAGE_EDIT for value in abilities)
    except Exception:  # ImportError, ArrowInvalid, OSError: left to the reader that reports them
        return False


def load_edit_items(path: str | Path, allow_outside: bool = False) -> list[PromptItem]:
    """Read an edit prompt file (`.jsonl` or `.parquet`); see the module docstring for the rows.
    Image paths stay inside the file's folder unless `allow_outside` (`data.allow_paths_outside`)."""
    file, rows = read_rows(path, "edit")
    folder = DatasetFolder(file.parent, allow_outside)
    return [edit_item(row, f"{path}: {where}", folder) for where, row in rows]


def edit_item(row: Any, where: str, folder: DatasetFolder) -> PromptItem:
    """One row -> PromptItem; `where` ("file: row N") prefixes every error."""
    if not isinstance(row, dict):
        raise PromptFileError(
            f"{where}: expected an object with 'instruction' and 'source_image', got {type(row).__name__}"
        )
    instruction = _instruction(row, where)
    source_key = _source_key(row, where)
    if source_key in row and row[source_key] is None:
        raise PromptFileError(
            f"{where}: {source_key!r} is null; an edit row needs the image to edit: a file path, image "
            f"bytes, a base64 string or a {{bytes, path}} object"
        )
    if row.get(source_key) is None:
        raise PromptFileError(
            f"{where}: missing 'source_image' (keys: {sorted(row)}); an edit row needs the image to "
            f"edit: a file path, image bytes, a base64 string or a {{bytes, path}} object"
        )
    metadata = row.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise PromptFileError(f"{where}: 'metadata' has type {type(metadata).__name__}; expected an object")
    clash = [key for key in ROW_KEYS if key in metadata]
    if clash:
        raise PromptFileError(
            f"{where}: metadata holds {clash}, which an edit row sets itself; give them as top-level "
            f"fields of the row (next to 'instruction'), not inside 'metadata'"
        )
    metadata = dict(metadata)
    for key in TEXT_FIELDS:
        value = row.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise PromptFileError(
                f"{where}: '{key}' is {_short(value)} ({type(value).__name__}); expected a string "
                f"(a caption), or leave it out"
            )
        metadata[key] = value
    source = _source(row, source_key, where, folder)
    metadata[SOURCE_IMAGE] = source
    if row.get(REFERENCE_IMAGE) is not None:
        metadata[REFERENCE_IMAGE] = load_image(row[REFERENCE_IMAGE], f"{where}: {REFERENCE_IMAGE}", folder)
    return PromptItem(instruction, metadata, media={"images": [source]}, origin=where_in_file(where))


def _source_key(row: dict[str, Any], where: str) -> str:
    """The field holding the source image: `source_image`, Flow-Factory's `image`, or verl-omni's
    `images` (in a row of `ability` "image_edit")."""
    if SOURCE_IMAGE in row and IMAGE in row:
        raise PromptFileError(
            f"{where}: both 'source_image' and 'image' are given; 'image' is only the peers' name for the "
            f"source image, so give it once"
        )
    if IMAGE in row:
        return IMAGE
    if SOURCE_IMAGE not in row and row.get(ABILITY) == IMAGE_EDIT and row.get("images") is not None:
        return "images"
    return SOURCE_IMAGE


def _source(row: dict[str, Any], key: str, where: str, folder: DatasetFolder) -> Image.Image:
    value = row[key]
    at = f"{where}: {key}"
    if key == "images":
        if not isinstance(value, (list, tuple)) or len(value) != 1:
            count = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
            raise PromptFileError(
                f"{at}: expected a list of one image (the source of the edit), got {count}; several source "
                f"images per row are not supported"
            )
        return load_image(value[0], f"{at}[0]", folder)
    if key == IMAGE and isinstance(value, str) and not is_base64(value):
        try:
            return load_image(value, at, folder)
        except MissingFileError:
            # Flow-Factory and verl-omni keep a dataset's images in its images/ folder.
            try:
                return load_image(value, at, DatasetFolder(folder.root / "images", folder.allow_outside))
            except MissingFileError:
                raise MissingFileError(
                    f"{at}: image path {value!r} does not exist (looked in {folder.root} and its images/ "
                    f"folder); paths are relative to the data file's folder"
                ) from None
    return load_image(value, at, folder)


def _instruction(row: dict[str, Any], where: str) -> str:
    instruction, prompt = row.get("instruction"), row.get("prompt")
    if isinstance(prompt, (list, tuple)) and instruction is None:
        prompt = _message_instruction(prompt, where)
    if instruction is None and prompt is None:
        raise PromptFileError(
            f"{where}: missing 'instruction' (keys: {sorted(row)}); an edit row needs the edit as a "
            f"string, e.g. \"make it brighter\" ('prompt' is accepted as its alias)"
        )
    if instruction is not None and prompt is not None and instruction != prompt:
        raise PromptFileError(
            f"{where}: 'instruction' is {_short(instruction)} but 'prompt' is {_short(prompt)}; give "
            f"the edit once ('prompt' is only an alias for 'instruction')"
        )
    key, value = ("instruction", instruction) if instruction is not None else ("prompt", prompt)
    if not isinstance(value, str):
        raise PromptFileError(
            f"{where}: '{key}' is {_short(value)} ({type(value).__name__}); expected a string, the "
            f"edit to make, e.g. \"make it brighter\""
        )
    if not value.strip():
        raise PromptFileError(f"{where}: '{key}' is empty; expected the edit to make, e.g. \"make it brighter\"")
    return value


def _message_instruction(messages: Any, where: str) -> str:
    """verl-omni's edit prompt, chat messages, -> the instruction: the last user message's text
    with its `<image>` placeholders and the "Picture N:" label before each removed."""
    user_text = chat_last_user_text(chat_messages(messages, where), where)
    pieces = user_text.split(IMAGE_PLACEHOLDER)
    kept = [_PICTURE_LABEL.sub("", piece) if k < len(pieces) - 1 else piece for k, piece in enumerate(pieces)]
    return " ".join(piece.strip() for piece in kept if piece.strip())


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
