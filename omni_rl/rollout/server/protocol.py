"""The omni-rl rollout-server protocol, version 1: message encoding for both sides.

A message is one safetensors file whose `__metadata__["message"]` is a JSON document pointing
at its tensors (`{"$tensor": name}`); dataclasses, `LatentStreams`, tuples and dicts travel as
tagged objects (`$type`, `$streams`, `$tuple`, `$dict`), so a result comes back as the very
dataclass the engine made. Weight buckets are plain safetensors files of named tensors. The
shared codec is `omni_rl.utils.wire`; the whole protocol is `docs/rollout_protocol.md`.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from safetensors.torch import save as save_safetensors

from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.models.autoregressive import PromptInputs
from omni_rl.models.conditioning import Conditioning
from omni_rl.rollout.text_types import TextRequest, TextResult
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult
from omni_rl.utils.wire import CONTENT_TYPE  # noqa: F401  (this protocol's too, named here for its callers)
from omni_rl.utils.wire import ProtocolError, load_tensors, metadata_json, read_metadata

PROTOCOL_VERSION = 1
PROTOCOL_HEADER = "X-Omni-RL-Rollout-Protocol"
# Where the trainer hands the server its per-run secret (the environment: readable by this user only).
TOKEN_ENV = "OMNI_RL_ROLLOUT_TOKEN"
MESSAGE_TYPES = {
    cls.__name__: cls
    for cls in (DiffusionRequest, DiffusionResult, TextRequest, TextResult, PromptInputs, Conditioning)
}


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        # A dense copy: safetensors refuses shared storage and non-contiguous strides (a
        # channels-last view of pixels).
        tensors[name] = value.detach().cpu().clone(memory_format=torch.contiguous_format)
        return {"$tensor": name}
    if isinstance(value, LatentStreams):
        return {"$streams": {k: _encode(v, tensors) for k, v in value.streams.items()}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if MESSAGE_TYPES.get(name) is not type(value):
            raise ProtocolError(f"cannot send a {name}: the protocol carries {sorted(MESSAGE_TYPES)}")
        return {"$type": name, "fields": {f.name: _encode(getattr(value, f.name), tensors) for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ProtocolError(f"cannot send a dict with keys {list(value)[:3]}: keys must be strings")
        return {"$dict": {k: _encode(v, tensors) for k, v in value.items()}}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ProtocolError(f"cannot send a value of type {type(value).__name__}")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "$tensor" in value:
        return tensors[value["$tensor"]]
    if "$streams" in value:
        return LatentStreams({k: _decode(v, tensors) for k, v in value["$streams"].items()})
    if "$tuple" in value:
        return tuple(_decode(v, tensors) for v in value["$tuple"])
    if "$dict" in value:
        return {k: _decode(v, tensors) for k, v in value["$dict"].items()}
    if "$type" in value:
        cls = MESSAGE_TYPES.get(value["$type"])
        if cls is None:
            raise ProtocolError(f"unknown message type {value['$type']!r}: expected one of {sorted(MESSAGE_TYPES)}")
        return cls(**{k: _decode(v, tensors) for k, v in value["fields"].items()})
    raise ProtocolError(f"untagged JSON object with keys {sorted(value)[:5]}")


def encode_message(payload: Any) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    doc = json.dumps(_encode(payload, tensors))
    return save_safetensors(tensors, metadata={"message": doc})


def decode_message(body: bytes) -> Any:
    _, meta = read_metadata(body)
    doc = metadata_json(meta, "message", "a message is its JSON document under 'message'")
    try:  # _decode recurses as deep as the document does: metadata_json has bounded its depth
        return _decode(doc, load_tensors(body))
    except (KeyError, TypeError, AttributeError) as err:
        raise ProtocolError(f"malformed message: {err!r}") from None


def encode_weights(tensors: dict[str, torch.Tensor], version: int, kind: str, bucket: int, last: bool) -> bytes:
    """One bucket of an update: the named tensors as they are, the rest in the metadata."""
    contiguous = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    meta = {"version": str(version), "kind": kind, "bucket": str(bucket), "last": "true" if last else "false"}
    return save_safetensors(contiguous, metadata=meta)


def decode_weights(body: bytes) -> tuple[dict[str, torch.Tensor], int, str, int, bool]:
    _, meta = read_metadata(body)
    try:
        version, kind, bucket, last = int(meta["version"]), meta["kind"], int(meta["bucket"]), meta["last"] == "true"
    except (KeyError, ValueError) as err:
        raise ProtocolError(f"a weight bucket needs metadata version, kind, bucket and last: {err!r}") from None
    return load_tensors(body), version, kind, bucket, last
