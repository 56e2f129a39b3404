"""Image-editing prompt files (Qwen-Image-Edit style RL): `.jsonl` / `.parquet` rows -> `PromptItem`s.

`load_edit_items(path)` reads one file; each row (a JSON object per line, or a Parquet row) has

    instruction      required: a non-empty string, the edit to make ("make it brighter").
                     `prompt` is accepted as its alias when `instruction` is absent.
    source_image     required: the image to edit: a file path (relative paths are relative to
                     the data file's folder), raw bytes (Parquet binary), a base64 string (a
                     `data:image/...;base64,` URI or bare base64), or a {"bytes", "path"}
                     struct as Hugging Face `datasets` writes its Image feature.
    target_text      optional string: a caption of the wanted result ("a bright red square").
    source_text      optional string: a caption of the source image.
    reference_image  optional: a second image (e.g. a wanted result), in the same forms.
    metadata         optional object, merged into the item's metadata (e.g.
                     {"brightness_direction": 1} for the `edit_brightness` reward).

Other keys are ignored; a null optional field counts as absent. `read_prompt_file` sends a
`.jsonl` file here when any of its rows has a `source_image` key, and a `.parquet` file when it
has a `source_image` column (other Parquet files are chat files, `omni_rl.data.chat_prompts`).

Each row becomes

    PromptItem(prompt=instruction,
               metadata={**row["metadata"], "source_image": <RGB PIL image>,
                         "target_text": ..., "source_text": ..., "reference_image": <RGB PIL>},
               media={"images": [<the same source RGB PIL image>]})

with the three optional keys present only when the row gives them. The edit adapters read the
source from `media["images"][0]`; the edit rewards (`rewards/edit_pixels.py`,
`clip_directional`, `vlm_edit_judge`) read `metadata["source_image"]`, so it reaches them
with every sample as the rest of the metadata does. The metadata keys `source_image`,
`reference_image`, `target_text` and `source_text` are the row's own: a row whose `metadata`
object holds one of them is refused. `item_has_source_image(item)` tells an edit item from a
text-to-image one.

Images are fully decoded at load with the chat reader's `load_image` (transparency composited
onto white, then RGB), so a corrupt file fails now, naming its row. Every bad row (bad JSON, a
missing or unreadable image, an instruction that is not a non-empty string, a caption that is
not a string, a `metadata` that is not an object) raises `PromptFileError` naming the file,
the 1-based row, the field and what was expected. Parquet needs `pyarrow`.

Left out on purpose: several source images per row (multi-image edits), masks, and lazy
decoding (a whole file's images are held in memory).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from omni_rl.data.chat_prompts import load_image, read_rows
from omni_rl.data.dataset_folder import DatasetFolder
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
TEXT_FIELDS = ("target_text", "source_text")
# Keys a row sets itself; its `metadata` object may not hold them too.
ROW_KEYS = (SOURCE_IMAGE, REFERENCE_IMAGE, *TEXT_FIELDS)


def item_has_source_image(item: PromptItem) -> bool:
    """Whether `item` is an image-editing prompt: its metadata holds a decoded `source_image`
    (a PIL image), as every item `load_edit_items` returns does. False for text-to-image and
    chat prompts; the core can use it to tell an edit dataset from a text-to-image one."""
    return isinstance(item.metadata.get(SOURCE_IMAGE), Image.Image)


def is_edit_row(row: Any) -> bool:
    """Whether a `.jsonl` row belongs to an edit file: an object with a `source_image` key."""
    return isinstance(row, dict) and SOURCE_IMAGE in row


def is_edit_parquet(file: str | Path) -> bool:
    """Whether a `.parquet` file has a `source_image` column. Reads only the schema; False when
    pyarrow is missing or the file is unreadable (the chat reader then reports that)."""
    try:
        import pyarrow.parquet as pq

        return SOURCE_IMAGE in pq.read_schema(file).names
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
    if SOURCE_IMAGE in row and row[SOURCE_IMAGE] is None:
        raise PromptFileError(
            f"{where}: 'source_image' is null; an edit row needs the image to edit: a file path, image "
            f"bytes, a base64 string or a {{bytes, path}} object"
        )
    if row.get(SOURCE_IMAGE) is None:
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
    source = load_image(row[SOURCE_IMAGE], f"{where}: {SOURCE_IMAGE}", folder)
    metadata[SOURCE_IMAGE] = source
    if row.get(REFERENCE_IMAGE) is not None:
        metadata[REFERENCE_IMAGE] = load_image(row[REFERENCE_IMAGE], f"{where}: {REFERENCE_IMAGE}", folder)
    return PromptItem(instruction, metadata, media={"images": [source]})


def _instruction(row: dict[str, Any], where: str) -> str:
    instruction, prompt = row.get("instruction"), row.get("prompt")
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


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
