"""Chat prompt files for the text / omni path: `.jsonl` and `.parquet` rows -> `PromptItem`s.

`load_chat_items(path)` reads rows of `prompt` (a string or chat messages), optional `images`,
`audio`, `ground_truth` (or verl's `reward_model.ground_truth`) and `metadata`; other fields
reach the metadata as they are, and a literal `<image>` becomes an image part in place. Media
are decoded at load, paths may not leave the data folder, and a bad row raises
`PromptFileError` naming the file, the 1-based row, the field and what was expected.

    {"prompt": "<image>\nWhat is the area?", "images": ["fig1.png"], "ground_truth": "12"}

Left out on purpose: video, lazy decoding, remote URLs, resampling audio.
"""
from __future__ import annotations

import base64
import binascii
import json
import numbers
import re
from pathlib import Path
from typing import Any, Optional

import numpy as np
from PIL import Image

from omni_rl.data.dataset_folder import DatasetFolder, is_base64
from omni_rl.data.image_decode import decode_image
from omni_rl.data.prompt_item import PromptFileError, PromptItem
from omni_rl.data.prompt_text import check_regular_file, is_blank, read_text_lines
from omni_rl.data.row_metadata import row_metadata
from omni_rl.data.wav import read_wav

ROLES = ("system", "user", "assistant", "tool")
MEDIA_KEYS = ("images", "audio")
# verl's reward struct, {"ground_truth": ..., "style": "rule"}, and its image placeholder.
REWARD_MODEL = "reward_model"
IMAGE_PLACEHOLDER = "<image>"
_DATA_URI_RE = re.compile(r"data:[\w/+.-]*;base64,", re.IGNORECASE)


def load_chat_items(path: str | Path, allow_outside: bool = False) -> list[PromptItem]:
    """Read a chat prompt file (`.jsonl` or `.parquet`); see the module docstring for the rows.
    Media paths stay inside the file's folder unless `allow_outside` (`data.allow_paths_outside`)."""
    file, rows = read_rows(path, "chat")
    folder = DatasetFolder(file.parent, allow_outside)
    return [chat_item(row, f"{path}: {where}", folder) for where, row in rows]


def read_rows(path: str | Path, kind: str) -> tuple[Path, list[tuple[str, Any]]]:
    """The file and its (where, row) pairs, for a `.jsonl` or `.parquet` prompt file of `kind`
    (named in errors: "chat", "edit")."""
    file = Path(path).expanduser()
    if not file.exists() or file.is_dir():
        raise PromptFileError(f"{kind} prompt file {str(path)!r} does not exist (looked for {file}); check the path")
    check_regular_file(file, f"{kind} prompt file {str(path)!r}")
    if file.suffix == ".jsonl":
        return file, read_jsonl_rows(file)
    if file.suffix == ".parquet":
        return file, read_parquet_rows(file)
    raise PromptFileError(f"{kind} prompt file {str(path)!r}: expected a .jsonl or .parquet file")


def read_jsonl_rows(file: Path) -> list[tuple[str, Any]]:
    """(where, row) for each non-blank line; `where` is "row N" (plus the line when they differ)."""
    rows = []
    for line_no, line in enumerate(read_text_lines(file, str(file)), start=1):
        if is_blank(line):
            continue
        n = len(rows) + 1
        where = f"row {n}" if n == line_no else f"row {n} (line {line_no})"
        try:
            rows.append((where, json.loads(line)))
        except json.JSONDecodeError as err:
            raise PromptFileError(f"{file}: {where}: not valid JSON ({err.msg} at column {err.colno})") from None
    return rows


def read_parquet_rows(file: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptFileError(
            f"{file}: reading .parquet files needs pyarrow, which is not installed; pip install "
            f"pyarrow (or convert the file to .jsonl)"
        ) from None
    try:
        table = pq.read_table(file)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError subclasses
        raise PromptFileError(f"{file}: not a readable Parquet file ({type(err).__name__}: {err})") from None
    return [(f"row {n}", row) for n, row in enumerate(table.to_pylist(), start=1)]


def is_chat_row(row: Any) -> bool:
    """Whether a .jsonl row needs the chat reader: a list prompt, media, or a reference answer."""
    return isinstance(row, dict) and (
        isinstance(row.get("prompt"), list) or any(key in row for key in (*MEDIA_KEYS, "ground_truth", REWARD_MODEL))
    )


def chat_item(row: Any, where: str, folder: DatasetFolder) -> PromptItem:
    """One row -> PromptItem; `where` ("file: row N") prefixes every error."""
    if not isinstance(row, dict):
        raise PromptFileError(f"{where}: expected an object with a 'prompt', got {type(row).__name__}")
    if row.get("prompt") is None:
        raise PromptFileError(
            f"{where}: missing 'prompt' (keys: {sorted(row)}); every row needs a 'prompt', a string "
            f"or a list of {{role, content}} messages"
        )
    images = _list_field(row, "images", where)
    messages = place_image_parts(chat_messages(row["prompt"], where), len(images), where)
    prompt = chat_last_user_text(messages, where)

    metadata = row_metadata(row, ("prompt", *MEDIA_KEYS), where)
    verl_answer = _reward_model_answer(row.get(REWARD_MODEL), where)
    if verl_answer is not None:
        if metadata.get("ground_truth", verl_answer) != verl_answer:
            raise PromptFileError(
                f"{where}: reward_model.ground_truth is {verl_answer!r} but ground_truth is "
                f"{metadata['ground_truth']!r}; give the reference answer once"
            )
        metadata["ground_truth"] = verl_answer

    media: dict[str, list] = {}
    if images:
        media["images"] = [load_image(image, f"{where}: images[{k}]", folder) for k, image in enumerate(images)]
    audio = _list_field(row, "audio", where)
    if audio:
        media["audio"] = [_load_audio(clip, f"{where}: audio[{k}]", folder) for k, clip in enumerate(audio)]
    return PromptItem(prompt, metadata, messages=messages, media=media or None, origin=where_in_file(where))


def where_in_file(where: str) -> str:
    """The row part of a reader's `where` ("path: row 3 (line 5)" -> "row 3 (line 5)")."""
    return where.rsplit(": ", 1)[-1]


def _reward_model_answer(value: Any, where: str) -> Any:
    """verl's `reward_model.ground_truth`, or None when the row has none."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PromptFileError(
            f"{where}: 'reward_model' has type {type(value).__name__}; expected verl's object "
            f'{{"ground_truth": ..., "style": "rule"}}'
        )
    return value.get("ground_truth")


def place_image_parts(messages: tuple[dict[str, Any], ...], n_images: int, where: str) -> tuple[dict[str, Any], ...]:
    """`messages` with each literal `<image>` of their text turned into an image part (rules in
    the module docstring); unchanged when there is none."""
    placeholders = sum(_text_of(message).count(IMAGE_PLACEHOLDER) for message in messages)
    if placeholders == 0:
        return messages
    parts = sum(1 for m in messages if isinstance(m["content"], list) for part in m["content"] if part["type"] == "image")
    if placeholders + parts != n_images:
        raise PromptFileError(
            f"{where}: the prompt marks {placeholders} {IMAGE_PLACEHOLDER!r} placeholder(s)"
            + (f" and {parts} image part(s)" if parts else "")
            + f" but the row has {n_images} image(s) in 'images'; give one image per placeholder, in order"
        )
    return tuple({**message, "content": _split_placeholders(message["content"])} if IMAGE_PLACEHOLDER in _text_of(message)
                 else message for message in messages)


def _text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part["type"] == "text")


def _split_placeholders(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    out: list[dict[str, Any]] = []
    for part in parts:
        if part["type"] != "text" or IMAGE_PLACEHOLDER not in part["text"]:
            out.append(part)
            continue
        pieces = part["text"].split(IMAGE_PLACEHOLDER)
        for k, piece in enumerate(pieces):
            if k:
                out.append({"type": "image"})
            if piece.strip():
                out.append({**part, "text": piece})
    return out


# ------------------------------------------------------------------------------------------
# Messages
# ------------------------------------------------------------------------------------------



def chat_messages(prompt: Any, where: str) -> tuple[dict[str, Any], ...]:
    """A row's `prompt` (a string or a list of messages), checked, as a tuple of messages (the
    edit reader reads verl-omni's message prompts with it too)."""
    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise PromptFileError(
            f"{where}: 'prompt' is {_short(prompt)} ({type(prompt).__name__}); expected a string or "
            f"a non-empty list of {{role, content}} messages"
        )
    out = []
    for k, message in enumerate(prompt):
        at = f"{where}: prompt[{k}]"
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise PromptFileError(f"{at} is {_short(message)}; expected an object with 'role' and 'content'")
        if message["role"] not in ROLES:
            raise PromptFileError(
                f"{at}: role {message['role']!r} is unknown; expected one of {list(ROLES)} "
                f"(map ShareGPT's human/gpt to user/assistant)"
            )
        content = message["content"]
        if isinstance(content, (list, tuple)):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise PromptFileError(
                        f"{at}: content[{j}] is {_short(part)}; expected a part such as "
                        f'{{"type": "text", "text": "..."}} or {{"type": "image"}}'
                    )
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise PromptFileError(f"{at}: content[{j}] is a text part without a string 'text'")
            content = [dict(part) for part in content]
        elif not isinstance(content, str):
            raise PromptFileError(
                f"{at}: content has type {type(content).__name__}; expected a string or a list of parts"
            )
        out.append({**message, "content": content})
    return tuple(out)


def chat_last_user_text(messages: tuple[dict[str, Any], ...], where: str) -> str:
    """The plain text of the last user message (text parts joined with a newline)."""
    for message in reversed(messages):
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, str):
                return content
            return "\n".join(part["text"] for part in content if part["type"] == "text")
    raise PromptFileError(
        f"{where}: 'prompt' has no message with role 'user' (roles: {[m['role'] for m in messages]}); "
        f"a prompt needs at least one user message"
    )


def _list_field(row: dict[str, Any], key: str, where: str) -> list[Any]:
    value = row.get(key)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise PromptFileError(
            f"{where}: '{key}' has type {type(value).__name__}; expected a list (use [x] for one item)"
        )
    return list(value)


# ------------------------------------------------------------------------------------------
# Images
# ------------------------------------------------------------------------------------------


def load_image(value: Any, where: str, folder: DatasetFolder) -> Image.Image:
    """One image field -> a fully decoded RGB PIL image (transparency composited onto white).

    `value` is bytes, base64 or a `data:` URI, a path relative to `folder`, or a {"bytes", "path"}
    struct; `where` ("file: row N: field") prefixes every `PromptFileError`. Also used by `edit_prompts`.
    """
    data, source = _image_bytes(value, where, folder)
    return decode_image(data, where, source)


def _image_bytes(value: Any, where: str, folder: DatasetFolder) -> tuple[bytes | Path, str]:
    """The encoded image (bytes, or the file holding them) and a description of where it came
    from (for errors)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), f"the image bytes ({len(value)} bytes)"
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            data = value["bytes"]
            if isinstance(data, str):
                return _decode_base64(data, where), "the base64 'bytes'"
            if isinstance(data, (bytes, bytearray, memoryview)):
                return bytes(data), f"the image bytes ({len(data)} bytes)"
            raise PromptFileError(f"{where}: 'bytes' has type {type(data).__name__}; expected bytes or base64")
        if isinstance(value.get("path"), str):
            return folder.file(value["path"], where), f"file {value['path']!r}"
        raise PromptFileError(f"{where}: an image object needs 'bytes' or 'path', got keys {sorted(value)}")
    if isinstance(value, str):
        # What the string is, decided before the filesystem is touched (a long base64 string
        # passed to open() fails with "File name too long").
        if _DATA_URI_RE.match(value):
            return _decode_base64(value[_DATA_URI_RE.match(value).end():], where), "the base64 data URI"
        if is_base64(value):
            return _decode_base64(value, where), "the base64 string"
        return folder.file(value, where, "image path"), f"file {value!r}"
    if value is None:
        raise PromptFileError(f"{where} is null; expected image bytes, a base64 string, a file path, or a "
                              f"{{bytes, path}} object")
    raise PromptFileError(
        f"{where} has type {type(value).__name__}; expected image bytes, a base64 string, a file "
        f"path, or a {{bytes, path}} object"
    )


def _decode_base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as err:
        raise PromptFileError(f"{where}: not valid base64 ({err})") from None


# ------------------------------------------------------------------------------------------
# Audio
# ------------------------------------------------------------------------------------------


def _load_audio(value: Any, where: str, folder: DatasetFolder) -> tuple[np.ndarray, int]:
    if isinstance(value, str):
        return read_wav(_read_path(value, where, folder), f"{where}: file {value!r}")
    if isinstance(value, dict):
        if value.get("array") is not None:
            return _array_clip(value, where)
        if value.get("bytes") is not None:
            data = value["bytes"]
            if isinstance(data, str):
                data = _decode_base64(data, where)
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise PromptFileError(f"{where}: 'bytes' has type {type(data).__name__}; expected WAV bytes")
            return read_wav(bytes(data), f"{where}: the WAV bytes")
        if isinstance(value.get("path"), str):
            return read_wav(_read_path(value["path"], where, folder), f"{where}: file {value['path']!r}")
    raise PromptFileError(
        f"{where} is {_short(value)}; expected a .wav path or {{\"array\": [...], \"sample_rate\": N}}"
    )


def _array_clip(value: dict[str, Any], where: str) -> tuple[np.ndarray, int]:
    rate = value.get("sample_rate", value.get("sampling_rate"))
    if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate <= 0:
        raise PromptFileError(f"{where}: sample_rate is {rate!r}; expected a positive int (Hz), e.g. 16000")
    try:
        array = np.asarray(value["array"], dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise PromptFileError(f"{where}: 'array' is not a list of numbers ({err})") from None
    if array.ndim != 1 or array.size == 0:
        raise PromptFileError(
            f"{where}: 'array' has shape {array.shape}; expected a non-empty 1-D list of mono samples "
            f"(average the channels first)"
        )
    if not np.isfinite(array).all():
        raise PromptFileError(f"{where}: 'array' holds NaN or infinite samples")
    return array, int(rate)


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------


def _read_path(path: str, where: str, folder: DatasetFolder) -> bytes:
    return folder.file(path, where).read_bytes()


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
