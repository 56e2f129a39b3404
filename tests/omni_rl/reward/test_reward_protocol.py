"""omni_rl/reward/protocol.py: the remote-scorer wire format, both directions, no server."""
import json
import math

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save

from omni_rl.reward.protocol import (
    CONTENT_TYPE,
    PROTOCOL_HEADER,
    ProtocolError,
    check_scores,
    check_version,
    decode_request,
    decode_response,
    encode_error,
    encode_request,
    encode_response,
    error_message,
    image_from_wire,
    image_to_wire,
    metadata_for_wire,
    request_headers,
)


def _body(tensors, prompts='["a"]', metadata="[{}]"):
    meta = {}
    if prompts is not None:
        meta["prompts"] = prompts
    if metadata is not None:
        meta["metadata"] = metadata
    return save(tensors, metadata=meta)


def test_latents_round_trip_exactly_with_prompts_and_metadata():
    latents = torch.randn(3, 4, 5, 6)
    prompts = ["a cat", "ünïcödé «quotes» \"and\" \\ slashes", ""]
    metadata = [{"target": "OPEN"}, {}, {"n": 3, "nested": {"xs": [1, 2.5, None, True]}}]
    request = decode_request(encode_request(latents, prompts, metadata, kind="latents"))
    assert request.kind == "latents" and request.batch_size == 3
    assert torch.equal(request.tensor, latents)
    assert request.prompts == prompts and request.metadata == metadata


@pytest.mark.parametrize("shape", [(2, 8, 9, 3), (2, 4, 8, 9, 3)])
def test_images_and_video_round_trip(shape):
    images = torch.randint(0, 256, shape, dtype=torch.uint8)
    request = decode_request(encode_request(images, ["x", "y"], [{}, {}], kind="images"))
    assert request.kind == "images" and request.tensor.dtype == torch.uint8
    assert torch.equal(request.tensor, images)


def test_the_body_is_plain_safetensors_that_any_reader_opens():
    # a server in another language reads it with its own safetensors library
    from safetensors.torch import load

    body = encode_request(torch.ones(1, 2), ["p"], [{"k": "v"}], kind="latents")
    assert list(load(body)) == ["latents"]
    header_len = int.from_bytes(body[:8], "little")
    header = json.loads(body[8 : 8 + header_len])
    assert header["latents"]["dtype"] == "F32" and header["latents"]["shape"] == [1, 2]
    assert json.loads(header["__metadata__"]["prompts"]) == ["p"]
    assert json.loads(header["__metadata__"]["metadata"]) == [{"k": "v"}]


@pytest.mark.parametrize(
    "tensor, kind, match",
    [
        (torch.zeros(2, 3, dtype=torch.float64), "latents", "dtype torch.float64; expected torch.float32"),
        (torch.zeros(2, 4, 4, 3, dtype=torch.uint8), "latents", "expected torch.float32"),
        (torch.zeros(2, 4, 4, 3), "images", "expected torch.uint8"),
        (torch.zeros(4, 4, 3, dtype=torch.uint8), "images", r"expected \[B, H, W, C\]"),
        (torch.zeros(5), "latents", "at least 2 dims"),
        (torch.zeros(0, 3), "latents", "the batch is empty"),
        (torch.zeros(1, 3), "audio", "kind 'audio' is unknown"),
    ],
)
def test_encode_refuses_a_wrong_tensor(tensor, kind, match):
    with pytest.raises(ProtocolError, match=match):
        encode_request(tensor, ["p"] * max(1, tensor.shape[0]), [{}] * max(1, tensor.shape[0]), kind=kind)


def test_encode_refuses_mismatched_prompts_metadata_and_non_json_values():
    latents = torch.zeros(2, 3)
    with pytest.raises(ProtocolError, match="got 1 prompts for a batch of 2"):
        encode_request(latents, ["p"], [{}, {}], kind="latents")
    with pytest.raises(ProtocolError, match="got 3 metadata entries for a batch of 2"):
        encode_request(latents, ["p", "q"], [{}, {}, {}], kind="latents")
    with pytest.raises(ProtocolError, match="prompts must be a list of 2 strings"):
        encode_request(latents, ["p", 3], [{}, {}], kind="latents")
    with pytest.raises(ProtocolError, match="not JSON-encodable"):
        encode_request(latents, ["p", "q"], [{"x": object()}, {}], kind="latents")
    with pytest.raises(ProtocolError, match="not JSON-encodable"):
        encode_request(latents, ["p", "q"], [{"x": float("nan")}, {}], kind="latents")


def test_decode_names_what_is_wrong_with_a_bad_body():
    good = encode_request(torch.zeros(1, 2), ["p"], [{}], kind="latents")
    with pytest.raises(ProtocolError, match="8-byte header length"):
        decode_request(b"abc")
    with pytest.raises(ProtocolError, match="truncated or not safetensors"):
        decode_request(good[:20])
    with pytest.raises(ProtocolError, match="not JSON"):
        decode_request((5).to_bytes(8, "little") + b"{nope")
    with pytest.raises(ProtocolError, match="could not be read"):
        decode_request(good[:-3])  # header intact, data short
    with pytest.raises(ProtocolError, match="exactly one tensor named 'latents'"):
        decode_request(_body({"latents": torch.zeros(1, 2), "images": torch.zeros(1, 2, 2, 3, dtype=torch.uint8)}))
    with pytest.raises(ProtocolError, match=r"tensors \['pixels'\]"):
        decode_request(_body({"pixels": torch.zeros(1, 2)}))
    with pytest.raises(ProtocolError, match="dtype 'F64'; expected 'F32'"):
        decode_request(_body({"latents": torch.zeros(1, 2, dtype=torch.float64)}))
    with pytest.raises(ProtocolError, match="no 'prompts' entry"):
        decode_request(_body({"latents": torch.zeros(1, 2)}, prompts=None))
    with pytest.raises(ProtocolError, match=r"__metadata__\['metadata'\] is not a JSON string"):
        decode_request(_body({"latents": torch.zeros(1, 2)}, metadata="{oops"))
    with pytest.raises(ProtocolError, match="got 2 prompts for a batch of 1"):
        decode_request(_body({"latents": torch.zeros(1, 2)}, prompts='["a", "b"]'))


def test_version_header():
    check_version("1")
    check_version(" 1 ")
    with pytest.raises(ProtocolError, match="no X-Omni-RL-Protocol header.*speaks protocol 1"):
        check_version(None)
    with pytest.raises(ProtocolError, match="protocol version mismatch: the client sent .*'2'.*speaks protocol 1"):
        check_version("2")


def test_request_headers():
    assert request_headers(b"12345") == {
        PROTOCOL_HEADER: "1", "Content-Type": CONTENT_TYPE, "Content-Length": "5",
    }
    assert CONTENT_TYPE == "application/x-safetensors" and PROTOCOL_HEADER == "X-Omni-RL-Protocol"


def test_check_scores_accepts_numbers_and_1d_tensors_only():
    assert check_scores([1, 2.5, np.float32(0.5)], 3) == [1.0, 2.5, 0.5]
    assert check_scores(torch.tensor([1.0, -2.0]), 2) == [1.0, -2.0]
    with pytest.raises(ProtocolError, match="returned 2 scores for a batch of 3"):
        check_scores([1.0, 2.0], 3)
    with pytest.raises(ProtocolError, match="non-finite score nan at sample index 1"):
        check_scores([1.0, math.nan], 2)
    with pytest.raises(ProtocolError, match="non-finite score inf at sample index 0"):
        check_scores(np.array([np.inf]), 1)
    with pytest.raises(ProtocolError, match="score 0 = True; expected a number"):
        check_scores([True], 1)
    with pytest.raises(ProtocolError, match=r"shape \(1, 2\)"):
        check_scores(torch.zeros(1, 2), 2)
    with pytest.raises(ProtocolError, match="returned str"):
        check_scores("12", 2)


def test_response_round_trips_floats_exactly():
    scores = [0.1, -1e-30, 123456.789, 1 / 3]
    assert decode_response(encode_response(scores), 4) == scores
    assert json.loads(encode_response([1.5])) == {"scores": [1.5], "protocol": 1}


def test_decode_response_refuses_bad_replies():
    with pytest.raises(ProtocolError, match="not JSON"):
        decode_response(b"<html>busy</html>", 1)
    with pytest.raises(ProtocolError, match='no "scores" field'):
        decode_response(b'{"score": [1]}', 1)
    with pytest.raises(ProtocolError, match='"protocol": None; expected 1'):
        decode_response(b'{"scores": [1]}', 1)
    with pytest.raises(ProtocolError, match='"protocol": 2; expected 1'):
        decode_response(b'{"scores": [1], "protocol": 2}', 1)
    with pytest.raises(ProtocolError, match="the server returned 1 scores for a batch of 2"):
        decode_response(b'{"scores": [1], "protocol": 1}', 2)
    # Python's json reads the non-standard NaN token; it must still be refused
    with pytest.raises(ProtocolError, match="non-finite score nan at sample index 1"):
        decode_response(b'{"scores": [1, NaN], "protocol": 1}', 2)


def test_error_bodies():
    assert error_message(encode_error("bad thing")) == "bad thing"
    assert json.loads(encode_error("x")) == {"error": "x", "protocol": 1}
    assert error_message(b"plain text") == "'plain text'"
    assert error_message(b"x" * 1000).endswith("...'")


def test_metadata_for_wire_drops_arrays_and_converts_numpy_scalars():
    metadata = [
        {"latent": torch.zeros(4), "mask": np.zeros(3), "target": "OPEN", "k": np.int64(3), "w": [np.float32(0.5)]},
        {},
    ]
    assert metadata_for_wire(metadata) == [{"target": "OPEN", "k": 3, "w": [0.5]}, {}]
    assert "latent" in metadata[0]  # the caller's dicts are left alone
    with pytest.raises(ProtocolError, match=r"metadata\[1\]\['when'\] has type set"):
        metadata_for_wire([{}, {"when": {1, 2}}])
    with pytest.raises(ProtocolError, match=r"metadata\[0\]\['x'\] = nan is not finite"):
        metadata_for_wire([{"x": float("nan")}])


def test_pil_images_in_metadata_travel_as_png_data_uris():
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    source = Image.fromarray(pixels)
    metadata = [{"source_image": source, "n": 1}, {"source_image": source, "nested": [source]}]
    wire = metadata_for_wire(metadata)
    uri = wire[0]["source_image"]
    assert uri.startswith("data:image/png;base64,") and wire[1]["source_image"] == uri == wire[1]["nested"][0]
    assert wire[1]["source_image"] is uri  # a source shared by samples is encoded once
    png = base64.b64decode(uri.split(",", 1)[1], validate=True)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), pixels)  # any PNG reader, lossless
    request = decode_request(encode_request(torch.zeros(2, 1, 1, 3, dtype=torch.uint8), ["a", "b"], wire, kind="images"))
    decoded = image_from_wire(request.metadata[1]["source_image"])
    assert decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), pixels)
    assert np.asarray(image_from_wire(image_to_wire(Image.new("L", (2, 2), 9)))).tolist() == [[[9] * 3] * 2] * 2
    with pytest.raises(ProtocolError, match=r"metadata\[0\]\['source_image'\] is 'a.png' \(str\); expected an image as the protocol sends it"):
        image_from_wire("a.png", "metadata[0]['source_image']")
    with pytest.raises(ProtocolError, match=r"x: not a readable base64 PNG"):
        image_from_wire("data:image/png;base64,bm90IGEgcG5n", "x")


def test_a_request_whose_header_would_pass_safetensors_limit_is_refused_with_advice():
    huge = [{"blob": "x" * 60_000_000}, {"blob": "y" * 60_000_000}]
    with pytest.raises(ProtocolError, match=r"batch of 2 take \d+ bytes as JSON; safetensors takes at most 100000000 .* Send fewer samples per request"):
        encode_request(torch.zeros(2, 1, 1, 3, dtype=torch.uint8), ["a", "b"], huge, kind="images")
