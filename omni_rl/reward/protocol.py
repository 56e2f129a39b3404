"""The omni-rl remote-scorer protocol, version 1: encode/decode helpers for both sides.

`POST /score` sends a batch of B samples as one safetensors file (one tensor, `latents` or
`images`, plus `prompts` and `metadata` JSON lists in its `__metadata__`) and gets back
`{"scores": [B finite numbers], "protocol": 1}`; `GET /health` describes the scorer. A PIL image
in the metadata travels as a PNG data URI (`image_to_wire` / `image_from_wire`). The wire codec
shared with the rollout protocol is `omni_rl.utils.wire`; the whole contract (shapes, statuses,
security) is `docs/reward_protocol.md`. Left out: compression, streaming, per-request options.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from omni_rl.utils.http_transport import check_json_depth, safe_preview
from omni_rl.utils.wire import (  # the codec's names this protocol's callers use are named here too
    CONTENT_TYPE,  # noqa: F401
    ProtocolError,
    error_document,
    error_text as error_message,  # noqa: F401
    load_tensors,
    metadata_json,
    read_metadata,
    version_mismatch,
)

PROTOCOL_VERSION = 1
PROTOCOL_HEADER = "X-Omni-RL-Protocol"
SCORE_PATH = "/score"
HEALTH_PATH = "/health"
# The environment variables of a token: the server reads TOKEN_ENV (without --token-file); a
# client sends it only to the server whose base URL TOKEN_URL_ENV names (a token is bound to
# its server: a recipe that names another URL never receives it).
TOKEN_ENV = "OMNI_RL_REWARD_TOKEN"
TOKEN_URL_ENV = "OMNI_RL_REWARD_TOKEN_URL"

LATENTS = "latents"
IMAGES = "images"
KINDS = (LATENTS, IMAGES)
_DTYPES = {LATENTS: torch.float32, IMAGES: torch.uint8}
WIRE_IMAGE_PREFIX = "data:image/png;base64,"
# safetensors refuses to write or read a header (prompts + metadata JSON) above 100 MB.
MAX_HEADER_BYTES = 100_000_000
_SAFETENSORS_DTYPES = {LATENTS: "F32", IMAGES: "U8"}


@dataclass
class ScoreRequest:
    """One decoded POST /score body.

    kind:     "latents" or "images", the name of the one tensor in the body.
    tensor:   float32 [B, ...] latents or uint8 [B, H, W, C] / [B, T, H, W, C] images (CPU).
    prompts:  B strings.
    metadata: B dicts (JSON values only).
    """

    kind: str
    tensor: torch.Tensor
    prompts: list[str]
    metadata: list[dict[str, Any]]

    @property
    def batch_size(self) -> int:
        return int(self.tensor.shape[0])


def request_headers(body: bytes) -> dict[str, str]:
    """The headers a client sends with a POST /score body."""
    return {
        PROTOCOL_HEADER: str(PROTOCOL_VERSION),
        "Content-Type": CONTENT_TYPE,
        "Content-Length": str(len(body)),
    }


def check_version(header_value: str | None) -> None:
    """Raise ProtocolError unless the X-Omni-RL-Protocol header value is this version."""
    mismatch = version_mismatch(header_value, PROTOCOL_VERSION, PROTOCOL_HEADER, "this server", "the client")
    if mismatch:
        raise ProtocolError(mismatch)


def encode_request(
    tensor: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]], *, kind: str
) -> bytes:
    """Serialise one batch as a safetensors body (layout: docs/reward_protocol.md).

    `tensor` must already have the kind's dtype (float32 latents, uint8 images); it is moved
    to the CPU and made contiguous. Metadata must be JSON-encodable: strip tensors first
    (`metadata_for_wire`). Raises ProtocolError naming the bad value.
    """
    from safetensors.torch import save

    _check_tensor(kind, tensor, source="the tensor to send")
    n = int(tensor.shape[0])
    prompts, metadata = _check_prompts_metadata(prompts, metadata, n)
    try:
        metadata_json = json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ProtocolError(
            f"metadata is not JSON-encodable ({err}); send only strings, numbers, booleans, null, "
            f"lists and objects (metadata_for_wire drops tensors, encodes PIL images and converts "
            f"numpy scalars)"
        ) from err
    # ASCII JSON (non-ASCII as \uXXXX escapes): any prompt text, even a lone surrogate, encodes.
    header = {"prompts": json.dumps(prompts), "metadata": metadata_json}
    size = len(json.dumps(header))  # as safetensors writes it: the two strings escaped once more
    if size > MAX_HEADER_BYTES - 4096:  # room for the tensor's entry and the JSON around them
        raise ProtocolError(
            f"the prompts and metadata of this batch of {n} take {size} bytes as JSON; safetensors "
            f"takes at most {MAX_HEADER_BYTES} in its header. Send fewer samples per request (images "
            f"in the metadata, such as an edit's source_image, take ~1.4x their PNG size each)"
        )
    return save({kind: tensor.detach().to("cpu").contiguous()}, metadata=header)


def decode_request(body: bytes) -> ScoreRequest:
    """Parse and check a POST /score body; raise ProtocolError saying what is wrong."""
    header, extra = read_metadata(body)
    names = list(header)
    if len(names) != 1 or names[0] not in KINDS:
        raise ProtocolError(
            f"the body holds tensors {names}; expected exactly one tensor named 'latents' "
            f"(float32 [B, ...]) or 'images' (uint8 [B, H, W, C])"
        )
    kind = names[0]
    dtype = header[kind].get("dtype") if isinstance(header[kind], dict) else None
    if dtype != _SAFETENSORS_DTYPES[kind]:
        raise ProtocolError(
            f"tensor {kind!r} has safetensors dtype {dtype!r}; expected {_SAFETENSORS_DTYPES[kind]!r} "
            f"({_DTYPES[kind]})"
        )
    hint = "send prompts and metadata as JSON strings under 'prompts' and 'metadata'"
    prompts = metadata_json(extra, "prompts", hint)
    metadata = metadata_json(extra, "metadata", hint)
    tensor = load_tensors(body)[kind]
    _check_tensor(kind, tensor, source="the request")
    prompts, metadata = _check_prompts_metadata(prompts, metadata, int(tensor.shape[0]))
    return ScoreRequest(kind=kind, tensor=tensor, prompts=prompts, metadata=metadata)


def check_scores(scores: Any, batch_size: int, *, source: str = "the scorer") -> list[float]:
    """Return `scores` as B finite Python floats, or raise ProtocolError naming the problem.

    Accepts a sequence of real numbers or a 1-D tensor/array. Booleans are refused (a bool
    "score" is almost always a bug). `source` names who produced the scores in the message.
    """
    if isinstance(scores, (torch.Tensor, np.ndarray)):
        if scores.ndim != 1:
            raise ProtocolError(
                f"{source} returned scores of shape {tuple(scores.shape)}; expected [{batch_size}]"
            )
        scores = scores.tolist()
    if isinstance(scores, (str, bytes)) or not isinstance(scores, Sequence):
        raise ProtocolError(
            f"{source} returned {type(scores).__name__}; expected a list of {batch_size} numbers"
        )
    if len(scores) != batch_size:
        raise ProtocolError(
            f"{source} returned {len(scores)} scores for a batch of {batch_size}; expected exactly "
            f"one score per sample"
        )
    out = []
    for i, value in enumerate(scores):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ProtocolError(f"{source} returned score {i} = {value!r}; expected a number")
        value = float(value)
        if not math.isfinite(value):
            raise ProtocolError(
                f"{source} returned a non-finite score {value} at sample index {i}; scores must be "
                f"finite: fix the scorer or clamp its output"
            )
        out.append(value)
    return out


def encode_response(scores: Sequence[float]) -> bytes:
    """The 200 JSON body for already-checked scores (`check_scores`)."""
    return json.dumps({"scores": list(scores), "protocol": PROTOCOL_VERSION}, allow_nan=False).encode()


def decode_response(body: bytes, batch_size: int) -> list[float]:
    """Parse a 200 response body: B finite floats, else ProtocolError."""
    try:
        check_json_depth(body)
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:
        raise ProtocolError(f"the response is not JSON ({err}); got {safe_preview(body)}") from err
    if not isinstance(payload, dict) or "scores" not in payload:
        raise ProtocolError(f'the response has no "scores" field; got {safe_preview(body)}')
    if payload.get("protocol") != PROTOCOL_VERSION:
        raise ProtocolError(
            f'the response says "protocol": {payload.get("protocol")!r}; expected {PROTOCOL_VERSION}. '
            f"Use a server that speaks protocol {PROTOCOL_VERSION}"
        )
    return check_scores(payload["scores"], batch_size, source="the server")


def encode_error(message: str) -> bytes:
    """The JSON body of an error response."""
    return error_document(message, PROTOCOL_VERSION)


def metadata_for_wire(metadata: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the metadata dicts with what JSON can carry.

    Tensors and arrays are left out (bulk data is the body's tensor), PIL images become PNG data URIs
    (a shared image encoded once), numpy scalars Python numbers; anything else JSON cannot encode
    raises ProtocolError naming the sample and the key.
    """
    out = []
    encoded: dict[int, str] = {}  # id(image) -> its data URI, for this call
    for i, meta in enumerate(metadata):
        if not isinstance(meta, dict):
            raise ProtocolError(f"metadata[{i}] has type {type(meta).__name__}; expected dict")
        clean = {}
        for key, value in meta.items():
            if isinstance(value, (torch.Tensor, np.ndarray)):
                continue
            clean[str(key)] = _jsonable(value, f"metadata[{i}][{key!r}]", encoded)
        out.append(clean)
    return out


def image_to_wire(image: Image.Image) -> str:
    """A PIL image as the protocol carries it in metadata: "data:image/png;base64,<PNG>" (lossless,
    in the image's own mode; prompt-file images are RGB)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return WIRE_IMAGE_PREFIX + base64.b64encode(buffer.getvalue()).decode("ascii")


def image_from_wire(value: Any, where: str = "the value") -> Image.Image:
    """The server side of `image_to_wire`: a PNG data URI -> a decoded RGB PIL image. Raises
    ProtocolError (a 400 when a server lets it through) naming `where` for anything else."""
    if not isinstance(value, str) or not value.startswith(WIRE_IMAGE_PREFIX):
        shown = safe_preview(value if isinstance(value, str) else repr(value), 60)
        raise ProtocolError(
            f"{where} is {shown} ({type(value).__name__}); expected an image as the protocol sends "
            f"it: a string {WIRE_IMAGE_PREFIX!r} + base64 PNG"
        )
    try:
        data = base64.b64decode(value[len(WIRE_IMAGE_PREFIX):], validate=True)
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB") if image.mode != "RGB" else image.copy()
    except (binascii.Error, ValueError, OSError, UnidentifiedImageError) as err:
        raise ProtocolError(f"{where}: not a readable base64 PNG ({type(err).__name__}: {err})") from None


def _jsonable(value: Any, where: str, encoded: dict[int, str]) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, Image.Image):
        if id(value) not in encoded:
            encoded[id(value)] = image_to_wire(value)
        return encoded[id(value)]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(f"{where} = {value} is not finite; JSON cannot carry it")
        return value
    if isinstance(value, np.generic):
        return _jsonable(value.item(), where, encoded)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{j}]", encoded) for j, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{where}[{k!r}]", encoded) for k, v in value.items()}
    raise ProtocolError(
        f"{where} has type {type(value).__name__}, which JSON cannot carry to a remote scorer; "
        f"store strings, numbers, lists, dicts or PIL images in the metadata (tensors are left out)"
    )


def _check_tensor(kind: str, tensor: Any, *, source: str) -> None:
    if kind not in KINDS:
        raise ProtocolError(f"kind {kind!r} is unknown; expected one of {list(KINDS)}")
    if not isinstance(tensor, torch.Tensor):
        raise ProtocolError(f"{source} is a {type(tensor).__name__}; expected a torch tensor")
    if tensor.dtype != _DTYPES[kind]:
        raise ProtocolError(f"{source}: {kind} has dtype {tensor.dtype}; expected {_DTYPES[kind]}")
    shape = tuple(tensor.shape)
    if kind == LATENTS and len(shape) < 2:
        raise ProtocolError(f"{source}: latents have shape {shape}; expected [B, ...] with at least 2 dims")
    if kind == IMAGES and len(shape) not in (4, 5):
        raise ProtocolError(
            f"{source}: images have shape {shape}; expected [B, H, W, C] or [B, T, H, W, C] (channels last)"
        )
    if shape[0] == 0:
        raise ProtocolError(f"{source}: the batch is empty (shape {shape}); send at least one sample")
    if 0 in shape:
        raise ProtocolError(
            f"{source}: {kind} have shape {shape}, with a dim of size 0; every dim must be >= 1 "
            f"(a 0x0 image or an empty latent has nothing to score)"
        )
    if kind == LATENTS:
        finite = torch.isfinite(tensor.reshape(shape[0], -1)).all(dim=1)
        if not bool(finite.all()):
            bad = torch.nonzero(~finite).flatten().tolist()
            shown = ", ".join(map(str, bad[:8])) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
            raise ProtocolError(
                f"{source}: latents hold NaN or inf values in sample(s) {shown} of {shape[0]}; send "
                f"finite latents (a non-finite latent usually means the sampler diverged)"
            )


def _check_prompts_metadata(prompts: Any, metadata: Any, n: int) -> tuple[list[str], list[dict]]:
    if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
        raise ProtocolError(f"prompts must be a list of {n} strings; got {safe_preview(repr(prompts))}")
    if len(prompts) != n:
        raise ProtocolError(f"got {len(prompts)} prompts for a batch of {n}; send one prompt per sample")
    if not isinstance(metadata, (list, tuple)) or not all(isinstance(m, dict) for m in metadata):
        raise ProtocolError(f"metadata must be a list of {n} objects; got {safe_preview(repr(metadata))}")
    if len(metadata) != n:
        raise ProtocolError(
            f"got {len(metadata)} metadata entries for a batch of {n}; send one object per sample ({{}} if none)"
        )
    return list(prompts), [dict(m) for m in metadata]
