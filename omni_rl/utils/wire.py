"""The wire codec under both HTTP protocols (`omni_rl.reward.protocol`, `omni_rl.rollout.server.protocol`).

A body is one safetensors file: `read_metadata` checks its header and returns its
`__metadata__` without reading a tensor, `load_tensors` reads the tensors. `version_mismatch`
checks a protocol-version header, `error_document` / `error_text` write and quote the
`{"error": ..., "protocol": N}` answer, and every JSON document is depth-checked before parsing.
Left out: what a message means, the transport (`omni_rl.utils.http_transport`) and the paths.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import torch

from omni_rl.utils.http_transport import check_json_depth, printable, safe_preview

CONTENT_TYPE = "application/x-safetensors"


class ProtocolError(ValueError):
    """A request or answer that does not follow its protocol (reward or rollout)."""


def version_mismatch(sent: Optional[str], speaks: int, header: str, who: str, peer: str) -> Optional[str]:
    """None when `sent` (the `header` value `peer` sent, None when absent) is the version `who`
    speaks; else the sentence to answer or raise."""
    if sent is None:
        return f"{peer} sent no {header} header; {who} speaks protocol {speaks}: send '{header}: {speaks}'"
    value = str(sent).strip()
    if value == str(speaks):
        return None
    return (f"protocol version mismatch: {peer} sent {header}: {value!r}; {who} speaks protocol {speaks} and was "
            f"sent protocol {value!r}; use a client and a server of the same protocol version")


def read_metadata(body: bytes) -> tuple[dict[str, Any], dict[str, str]]:
    """The safetensors header of `body` (tensor name -> its entry) and its `__metadata__`; raise
    ProtocolError naming what is wrong. The tensors are not read (`load_tensors` does that)."""
    if len(body) < 8:
        raise ProtocolError(f"the body has {len(body)} bytes; a safetensors file starts with an 8-byte header length")
    size = int.from_bytes(body[:8], "little")
    if size > len(body) - 8:
        raise ProtocolError(f"the safetensors header says {size} bytes but the body has only {len(body) - 8} after "
                            f"the length; the body is truncated or not safetensors")
    try:
        text = bytes(body[8 : 8 + size])
        check_json_depth(text)
        header = json.loads(text)
    except ValueError as err:  # UnicodeDecodeError and a document nested too deep included
        raise ProtocolError(f"the safetensors header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"the safetensors header is a {type(header).__name__}, not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise ProtocolError(f"the safetensors __metadata__ is a {type(meta).__name__}; expected an object "
                            f"__metadata__ (a map of strings)")
    if not all(isinstance(v, str) for v in meta.values()):
        raise ProtocolError("the safetensors __metadata__ values must be strings (JSON documents as text)")
    return header, meta


def metadata_json(meta: dict[str, str], key: str, hint: str) -> Any:
    """The JSON document under `key` of a body's `__metadata__`; `hint` says what to send."""
    if key not in meta:
        raise ProtocolError(f"the safetensors __metadata__ has no {key!r} entry (keys: {sorted(meta)}); {hint}")
    try:
        check_json_depth(meta[key])
        return json.loads(meta[key])
    except ValueError as err:
        raise ProtocolError(f"__metadata__[{key!r}] is not a JSON string ({err})") from None


def load_tensors(body: bytes) -> dict[str, torch.Tensor]:
    """The named tensors of a safetensors body (on the CPU)."""
    from safetensors.torch import load

    try:
        return load(bytes(body))
    except Exception as err:  # noqa: BLE001 (safetensors raises its own error types, e.g. on bad offsets)
        raise ProtocolError(f"the safetensors body could not be read: {err}") from None


def error_document(message: str, version: int) -> bytes:
    """The JSON body of an error answer."""
    return json.dumps({"error": message, "protocol": version}).encode()


def error_text(body: bytes) -> str:
    """The "error" sentence of an error answer (control characters escaped), or a short preview
    of a body that is not one."""
    try:
        check_json_depth(body)
        payload = json.loads(body)
    except ValueError:
        return safe_preview(body)
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return printable(payload["error"])
    return safe_preview(body)
