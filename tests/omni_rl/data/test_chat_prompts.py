"""omni_rl/data/chat_prompts.py (and the dispatch in prompts.py), on files written to tmp_path."""
import base64
import io
import json
import wave

import numpy as np
import pytest
from PIL import Image

from omni_rl.data.chat_prompts import load_chat_items, read_wav
from omni_rl.data.prompts import PromptFileError, PromptItem, load_prompt_items, read_prompt_file


def _jsonl(path, *rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _png_bytes(colour=(255, 0, 0), size=(4, 3), mode="RGB"):
    buffer = io.BytesIO()
    Image.new(mode, size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _wav_bytes(frames: np.ndarray, rate=16000, width=2):
    """frames: int array [N, channels] already in the sample width's integer range."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(frames.shape[1])
        wav.setsampwidth(width)
        wav.setframerate(rate)
        dtype = {1: np.uint8, 2: "<i2", 4: "<i4"}[width]
        wav.writeframes(frames.astype(dtype).tobytes())
    return buffer.getvalue()


def test_string_prompt_with_ground_truth(tmp_path):
    items = load_chat_items(_jsonl(tmp_path / "d.jsonl", {"prompt": "What is 1+1?", "ground_truth": "2", "id": 7}))
    # Every field beside the prompt reaches the metadata, the id too (issue 38, part 3.1).
    assert items == [PromptItem("What is 1+1?", {"ground_truth": "2", "id": 7}, ({"role": "user", "content": "What is 1+1?"},), None)]
    assert items[0].origin == "row 1"


def test_message_list_prompt_is_the_last_user_text(tmp_path):
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is"}, {"type": "text", "text": "shown?"}]},
    ]
    row = {"prompt": chat, "metadata": {"subject": "geo"}, "ground_truth": {"any": ["json", 1]}}
    (item,) = load_chat_items(_jsonl(tmp_path / "d.jsonl", row))
    assert item.prompt == "What is\nshown?"
    assert item.messages == tuple(chat) and isinstance(item.messages, tuple)
    assert item.metadata == {"subject": "geo", "ground_truth": {"any": ["json", 1]}}
    assert item.media is None


def test_images_from_paths_base64_and_structs(tmp_path):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (4, 3), (0, 255, 0)).save(tmp_path / "img" / "green.png")
    # Transparent pixels become white, not the black stored under alpha 0.
    Image.new("RGBA", (2, 2), (0, 0, 0, 0)).save(tmp_path / "clear.png")
    red = base64.b64encode(_png_bytes((255, 0, 0))).decode()
    blue = "data:image/png;base64," + base64.b64encode(_png_bytes((0, 0, 255))).decode()
    grey = base64.b64encode(_png_bytes(128, mode="L")).decode()
    row = {"prompt": "describe", "images": ["img/green.png", red, blue, {"path": "clear.png", "bytes": None}, {"bytes": grey}]}
    (item,) = load_chat_items(_jsonl(tmp_path / "d.jsonl", row))
    images = item.media["images"]
    assert "audio" not in item.media
    assert all(isinstance(im, Image.Image) and im.mode == "RGB" for im in images)
    pixels = [im.getpixel((0, 0)) for im in images]
    assert pixels == [(0, 255, 0), (255, 0, 0), (0, 0, 255), (255, 255, 255), (128, 128, 128)]
    assert images[0].size == (4, 3)


def test_absolute_image_path(tmp_path):
    Image.new("RGB", (1, 1), (1, 2, 3)).save(tmp_path / "a.png")
    (tmp_path / "sub").mkdir()
    (item,) = load_chat_items(_jsonl(tmp_path / "sub" / "d.jsonl", {"prompt": "x", "images": [str(tmp_path / "a.png")]}),
                              allow_outside=True)
    assert item.media["images"][0].getpixel((0, 0)) == (1, 2, 3)


def test_audio_from_wav_files_and_arrays(tmp_path):
    # 16-bit stereo: left 16384 (0.5), right -16384 (-0.5) then both 32767: mono = mean of channels.
    stereo = np.array([[16384, -16384], [32767, 32767], [-32768, -32768]])
    (tmp_path / "stereo.wav").write_bytes(_wav_bytes(stereo, rate=22050))
    # 8-bit unsigned mono: 128 is silence, 192 is +0.5, 0 is -1.
    (tmp_path / "byte.wav").write_bytes(_wav_bytes(np.array([[128], [192], [0]]), rate=8000, width=1))
    row = {"prompt": "listen", "audio": ["stereo.wav", "byte.wav", {"array": [0.25, -1, 0], "sample_rate": 16000}]}
    (item,) = load_chat_items(_jsonl(tmp_path / "d.jsonl", row))
    (a, rate_a), (b, rate_b), (c, rate_c) = item.media["audio"]
    assert (rate_a, rate_b, rate_c) == (22050, 8000, 16000)
    assert all(x.dtype == np.float32 and x.ndim == 1 for x in (a, b, c))
    np.testing.assert_allclose(a, [0.0, 32767 / 32768, -1.0])
    np.testing.assert_allclose(b, [0.0, 0.5, -1.0])
    np.testing.assert_allclose(c, [0.25, -1.0, 0.0])
    assert "images" not in item.media


def test_read_wav_24_and_32_bit():
    def raw_wav(payload: bytes, width: int) -> bytes:
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(width)
            wav.setframerate(1000)
            wav.writeframes(payload)
        return buffer.getvalue()

    # 24-bit little-endian: 0x400000 = +0.5, 0xC00000 = -0.5, 0x800000 = -1
    data = bytes([0, 0, 0x40, 0, 0, 0xC0, 0, 0, 0x80])
    samples, rate = read_wav(raw_wav(data, 3), "x")
    np.testing.assert_allclose(samples, [0.5, -0.5, -1.0])
    assert rate == 1000
    samples, _ = read_wav(raw_wav(np.array([1 << 30, -(1 << 31)], dtype="<i4").tobytes(), 4), "x")
    np.testing.assert_allclose(samples, [0.5, -1.0])


def test_read_prompt_file_dispatch(tmp_path):
    # Old-style rows (string prompt + metadata) keep the old items: no messages, no media.
    old = _jsonl(tmp_path / "old.jsonl", {"prompt": "a cat", "metadata": {"text": "CAT"}}, {"prompt": "a dog"})
    assert read_prompt_file(str(old)) == [PromptItem("a cat", {"text": "CAT"}), PromptItem("a dog", {})]
    # One chat row makes the whole file a chat file.
    mixed = _jsonl(tmp_path / "chat.jsonl", {"prompt": "a"}, {"prompt": [{"role": "user", "content": "b"}]})
    items = read_prompt_file(str(mixed))
    assert [i.prompt for i in items] == ["a", "b"]
    assert items[0].messages == ({"role": "user", "content": "a"},)
    gt = _jsonl(tmp_path / "gt.jsonl", {"prompt": "1+1", "ground_truth": 2})
    assert read_prompt_file(str(gt))[0].metadata == {"ground_truth": 2}
    assert load_prompt_items(None, str(gt))[0].metadata["ground_truth"] == 2


def test_image_only_prompt_passes_the_empty_check(tmp_path):
    Image.new("RGB", (1, 1)).save(tmp_path / "q.png")
    path = _jsonl(tmp_path / "d.jsonl", {"prompt": [{"role": "user", "content": [{"type": "image"}]}], "images": ["q.png"]})
    (item,) = load_prompt_items(None, str(path))
    assert item.prompt == "" and len(item.media["images"]) == 1
    empty = _jsonl(tmp_path / "e.jsonl", {"prompt": "", "ground_truth": 1})
    with pytest.raises(PromptFileError, match="prompt 0 is empty"):
        load_prompt_items(None, str(empty))


def test_prompt_item_stays_backward_compatible():
    item = PromptItem("p", {"k": 1})
    assert item.messages is None and item.media is None
    assert PromptItem("p").metadata == {}


@pytest.mark.parametrize(
    "row, pattern",
    [
        ({"images": []}, r"row 2: missing 'prompt' \(keys: \['images'\]\)"),
        ({"prompt": None}, "row 2: missing 'prompt'"),
        ({"prompt": 5}, r"row 2: 'prompt' is 5 \(int\); expected a string or a non-empty list"),
        ({"prompt": []}, "row 2: 'prompt' is .*non-empty list"),
        ({"prompt": ["hi"]}, r"row 2: prompt\[0\] is 'hi'; expected an object with 'role' and 'content'"),
        ({"prompt": [{"role": "human", "content": "hi"}]}, r"prompt\[0\]: role 'human' is unknown.*user/assistant"),
        ({"prompt": [{"role": "system", "content": "s"}]}, "row 2: 'prompt' has no message with role 'user'"),
        ({"prompt": [{"role": "user", "content": 3}]}, r"prompt\[0\]: content has type int"),
        ({"prompt": [{"role": "user", "content": [{"type": "text"}]}]}, r"content\[0\] is a text part without a string 'text'"),
        ({"prompt": "x", "metadata": [1]}, "row 2: 'metadata' must be an object, got list"),
        ({"prompt": "x", "metadata": {"ground_truth": 1}, "ground_truth": 2}, "row 2: field 'ground_truth' is 2 but metadata.ground_truth is 1"),
        ({"prompt": "x", "images": "a.png"}, r"row 2: 'images' has type str; expected a list \(use \[x\] for one item\)"),
        ({"prompt": "x", "images": ["missing.png"]}, r"row 2: images\[0\]: image path 'missing.png' does not exist \(looked for .*missing.png\)"),
        ({"prompt": "x", "images": ["corrupt.png"]}, r"row 2: images\[0\]: file 'corrupt.png' is not a readable image"),
        ({"prompt": "x", "images": ["data:image/png;base64,@@@"]}, r"images\[0\]: not valid base64"),
        ({"prompt": "x", "images": [base64.b64encode(b"not an image at all, just some bytes here!!!!!!").decode()]},
         r"images\[0\]: the base64 string is not a readable image"),
        ({"prompt": "x", "images": [{"url": "http://x"}]}, r"images\[0\]: an image object needs 'bytes' or 'path'"),
        ({"prompt": "x", "images": [3]}, r"images\[0\] has type int; expected image bytes"),
        ({"prompt": "x", "audio": ["missing.wav"]}, r"row 2: audio\[0\]: file 'missing.wav' does not exist"),
        ({"prompt": "x", "audio": ["corrupt.png"]}, r"row 2: audio\[0\]: file 'corrupt.png': not a readable WAV file"),
        ({"prompt": "x", "audio": [{"array": [[0.1, 0.2]], "sample_rate": 16000}]}, r"audio\[0\]: 'array' has shape \(1, 2\)"),
        ({"prompt": "x", "audio": [{"array": [0.1], "sample_rate": 0}]}, r"audio\[0\]: sample_rate is 0; expected a positive int"),
        ({"prompt": "x", "audio": [{"array": ["a"], "sample_rate": 8000}]}, r"audio\[0\]: 'array' is not a list of numbers"),
        ({"prompt": "x", "audio": [{"array": [float("nan")], "sample_rate": 8000}]}, r"audio\[0\]: 'array' holds NaN"),
        ({"prompt": "x", "audio": [7]}, r"audio\[0\] is 7; expected a .wav path"),
    ],
)
def test_bad_rows_name_file_row_and_problem(tmp_path, row, pattern):
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    path = _jsonl(tmp_path / "bad.jsonl", {"prompt": "fine", "ground_truth": 1}, row)
    with pytest.raises(PromptFileError, match=pattern) as info:
        load_chat_items(path)
    assert "bad.jsonl" in str(info.value)
    # read_prompt_file sends the same file to the chat reader (the first row is a chat row).
    with pytest.raises(PromptFileError, match=pattern):
        read_prompt_file(str(path))


def test_row_numbers_skip_blank_lines_and_bad_json(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", {"prompt": "a", "ground_truth": 1}, "", {"images": []})
    with pytest.raises(PromptFileError, match=r"d.jsonl: row 2 \(line 3\): missing 'prompt'"):
        load_chat_items(path)
    path = _jsonl(tmp_path / "j.jsonl", {"prompt": "a", "ground_truth": 1}, "{not json")
    with pytest.raises(PromptFileError, match=r"j.jsonl: row 2: not valid JSON"):
        load_chat_items(path)
    with pytest.raises(PromptFileError, match=r"j.jsonl: row 2: not valid JSON"):  # a chat file: the chat reader
        read_prompt_file(str(path))
    old = _jsonl(tmp_path / "old.jsonl", {"prompt": "a"}, "{not json")
    with pytest.raises(PromptFileError, match=r"old.jsonl:2: not valid JSON"):  # the old reader, as before
        read_prompt_file(str(old))


def test_wrong_file_kinds(tmp_path):
    with pytest.raises(PromptFileError, match="does not exist"):
        load_chat_items(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("prompt\nx\n")
    with pytest.raises(PromptFileError, match=r"expected a .jsonl or .parquet file"):
        load_chat_items(tmp_path / "d.csv")
    with pytest.raises(PromptFileError, match=r"expected a .txt, .jsonl or .parquet file"):
        read_prompt_file(str(tmp_path / "d.csv"))


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    wav = _wav_bytes(np.array([[0], [16384]]), rate=16000)
    table = pa.table({
        "prompt": [
            [{"role": "system", "content": "Solve."}, {"role": "user", "content": "<image> area?"}],
            [{"role": "user", "content": "plain"}],
        ],
        "images": [[{"bytes": _png_bytes((9, 8, 7)), "path": None}], None],
        "audio": [None, [{"bytes": wav, "path": None}]],
        "ground_truth": ["12", "B"],
        "subject": ["geometry", "misc"],
    })
    pq.write_table(table, tmp_path / "d.parquet")
    for items in (load_chat_items(tmp_path / "d.parquet"), read_prompt_file(str(tmp_path / "d.parquet"))):
        first, second = items
        # The `<image>` placeholder becomes the image's place in the message; the other columns
        # reach the metadata (issue 38, part 3.1 and 3.3).
        assert first.prompt == " area?" and first.metadata == {"ground_truth": "12", "subject": "geometry"}
        assert first.messages[1]["content"] == [{"type": "image"}, {"type": "text", "text": " area?"}]
        assert first.messages[0] == {"role": "system", "content": "Solve."}
        assert first.media["images"][0].getpixel((0, 0)) == (9, 8, 7)
        assert second.prompt == "plain" and second.metadata == {"ground_truth": "B", "subject": "misc"}
        samples, rate = second.media["audio"][0]
        np.testing.assert_allclose(samples, [0.0, 0.5]) and rate == 16000

    # A corrupt image names the Parquet row.
    bad = pa.table({"prompt": ["ok", "bad"], "images": [None, [b"garbage"]]})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(PromptFileError, match=r"bad.parquet: row 2: images\[0\]: the image bytes \(7 bytes\) is not a readable image"):
        load_chat_items(tmp_path / "bad.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(PromptFileError, match="broken.parquet: not a readable Parquet file"):
        load_chat_items(tmp_path / "broken.parquet")


# verl-omni's MMK12 rows, in the schema its converter writes (verl-project/verl-omni,
# examples/gspo_trainer/data_process/mmk12.py: data_source, prompt = [system, user "<image>\n{question}"],
# images = [{"bytes"}], ability, reward_model = {"style": "rule", "ground_truth"}, extra_info).
MMK12_SYSTEM = "Solve the question. The final answer must be wrapped using the \\boxed{} command."


def _mmk12_parquet(path, questions_answers, images_per_row=1):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = len(questions_answers)
    table = pa.table({
        "data_source": ["mmk12"] * n,
        "prompt": [[{"role": "system", "content": MMK12_SYSTEM}, {"role": "user", "content": f"<image>\n{q}"}]
                   for q, _ in questions_answers],
        "images": [[{"bytes": _png_bytes((10 * k, 0, 0))}] * images_per_row for k in range(n)],
        "ability": ["math_vl"] * n,
        "reward_model": [{"style": "rule", "ground_truth": a} for _, a in questions_answers],
        "extra_info": [{"split": "test", "index": k, "subject": "math"} for k in range(n)],
    })
    pq.write_table(table, path)
    return path


def test_mmk12_parquet_rows_keep_their_answers_and_place_their_image(tmp_path):
    path = _mmk12_parquet(tmp_path / "test.parquet", [("What is the area?", "12"), ("Which is larger?", "B")])
    first, second = read_prompt_file(str(path))
    # reward_model.ground_truth is where math_answer reads the reference (metadata["ground_truth"]).
    assert first.metadata["ground_truth"] == "12" and second.metadata["ground_truth"] == "B"
    assert first.metadata["data_source"] == "mmk12" and first.metadata["extra_info"]["index"] == 0
    # The placeholder is the image's place in the user message, not text.
    assert first.messages[0] == {"role": "system", "content": MMK12_SYSTEM}
    assert first.messages[1] == {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nWhat is the area?"}]}
    assert "<image>" not in first.prompt and first.prompt.strip() == "What is the area?"
    assert first.media["images"][0].getpixel((0, 0)) == (0, 0, 0)
    assert second.media["images"][0].getpixel((0, 0)) == (10, 0, 0)
    assert second.origin == "row 2"


def test_placeholders_must_number_the_images(tmp_path):
    path = _mmk12_parquet(tmp_path / "two.parquet", [("q", "1")], images_per_row=2)
    with pytest.raises(PromptFileError, match=r"two.parquet: row 1: the prompt marks 1 '<image>' placeholder\(s\) but "
                                              r"the row has 2 image\(s\) in 'images'"):
        read_prompt_file(str(path))
    lone = _jsonl(tmp_path / "lone.jsonl", {"prompt": "<image> what?", "ground_truth": "1"})
    with pytest.raises(PromptFileError, match=r"row 1: the prompt marks 1 '<image>' placeholder\(s\) but the row has 0"):
        read_prompt_file(str(lone))
    # Two placeholders in one message, each an image part in its place.
    two = _jsonl(tmp_path / "ok.jsonl", {"prompt": "<image> vs <image>: same?",
                                          "images": [base64.b64encode(_png_bytes()).decode()] * 2})
    (item,) = read_prompt_file(str(two))
    assert item.messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": " vs "}, {"type": "image"},
                                           {"type": "text", "text": ": same?"}]


def test_a_reward_model_answer_that_contradicts_ground_truth_is_refused(tmp_path):
    rows = _jsonl(tmp_path / "d.jsonl", {"prompt": "1+1", "ground_truth": "2", "reward_model": {"ground_truth": "3"}})
    with pytest.raises(PromptFileError, match=r"row 1: reward_model.ground_truth is '3' but ground_truth is '2'"):
        read_prompt_file(str(rows))
    rows = _jsonl(tmp_path / "e.jsonl", {"prompt": "1+1", "reward_model": "2"})
    with pytest.raises(PromptFileError, match=r"row 1: 'reward_model' has type str; expected verl's object"):
        read_prompt_file(str(rows))


def test_mmk12_answers_reach_math_answer(tmp_path):
    from omni_rl.reward import build_reward

    items = read_prompt_file(str(_mmk12_parquet(tmp_path / "test.parquet", [("What is the area?", "12"), ("Which?", "B")])))
    scorer = build_reward("math_answer")
    responses = ["The area is \\boxed{12}.", "\\boxed{A}"]  # right, then wrong
    assert scorer(responses, [i.prompt for i in items], [i.metadata for i in items]) == [1.0, 0.0]

