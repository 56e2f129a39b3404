"""omni_rl/utils/wire.py and server_args.py: the one codec and command-line scaffolding under
both HTTP protocols (the reward protocol and the rollout protocol)."""
from __future__ import annotations

import errno
import json

import pytest
import torch
from safetensors.torch import save

from omni_rl.reward import protocol as reward_protocol
from omni_rl.rollout.server import protocol as rollout_protocol
from omni_rl.utils import server_args
from omni_rl.utils.wire import (
    ProtocolError,
    error_document,
    error_text,
    load_tensors,
    metadata_json,
    read_metadata,
    version_mismatch,
)


def test_both_protocols_raise_the_one_protocol_error():
    assert reward_protocol.ProtocolError is ProtocolError is rollout_protocol.ProtocolError
    with pytest.raises(ProtocolError, match="8-byte header length"):
        reward_protocol.decode_request(b"abc")
    with pytest.raises(ProtocolError, match="8-byte header length"):
        rollout_protocol.decode_message(b"abc")


def test_version_mismatch_names_both_sides_and_both_versions():
    assert version_mismatch(" 1 ", 1, "X-V", "this server", "the client") is None
    missing = version_mismatch(None, 1, "X-V", "this server", "the client")
    assert missing == "the client sent no X-V header; this server speaks protocol 1: send 'X-V: 1'"
    other = version_mismatch("2", 1, "X-V", "this server", "the client")
    assert other.startswith("protocol version mismatch: the client sent X-V: '2'; this server speaks protocol 1")


def test_read_metadata_reads_the_header_without_the_tensors():
    body = save({"t": torch.ones(2)}, metadata={"doc": json.dumps({"a": [1, 2]})})
    header, meta = read_metadata(body)
    assert list(header) == ["t"] and header["t"]["shape"] == [2]  # __metadata__ is returned apart
    assert metadata_json(meta, "doc", "send one") == {"a": [1, 2]}
    assert torch.equal(load_tensors(body)["t"], torch.ones(2))
    with pytest.raises(ProtocolError, match=r"has no 'nope' entry \(keys: \['doc'\]\); send one"):
        metadata_json(meta, "nope", "send one")


def _body(header: bytes, length: int | None = None) -> bytes:
    """A safetensors length prefix (`length`, default the header's own), then `header`."""
    return (len(header) if length is None else length).to_bytes(8, "little") + header


@pytest.mark.parametrize("body, match", [
    (_body(b"{}", length=9), "truncated or not safetensors"),
    (_body(b"[1,2,3]"), "is a list, not a JSON object"),
    (_body(b'{"__metadata__": [1]}'), "expected an object __metadata__"),
    (_body(b'{"__metadata__": {"a": 3}}'), "values must be strings"),
    (_body(b"{}"), None),  # an empty header reads: which tensors a message needs is its protocol's business
])
def test_read_metadata_names_what_is_wrong(body, match):
    if match is None:
        assert read_metadata(body) == ({}, {})
        return
    with pytest.raises(ProtocolError, match=match):
        read_metadata(body)


def test_error_documents_round_trip_and_junk_is_quoted():
    assert json.loads(error_document("bad", 3)) == {"error": "bad", "protocol": 3}
    assert error_text(error_document("bad\x1b[2J", 1)) == "bad\\x1b[2J"  # control characters escaped
    assert error_text(b"<html>") == "'<html>'"


def test_a_usage_error_is_one_line_with_exit_2_and_run_main_prints_it(capsys):
    parser = server_args.OneLineParser(prog="python -m some.server")
    parser.add_argument("--port", type=server_args.port, default=0)
    with pytest.raises(server_args.ServerStartError) as info:
        parser.parse_args(["--port", "70000"])
    assert info.value.code == 2 and str(info.value).endswith("(see python -m some.server --help)")
    assert "70000 is out of range; expected a port 0..65535" in str(info.value)

    def serve(argv):
        raise server_args.bind_failure("127.0.0.1", 80, OSError(errno.EADDRINUSE, "in use"))

    assert server_args.run_main(serve, []) == 1  # a port in use is a run-time failure
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: cannot listen on 127.0.0.1:80: the port is in use")
    assert server_args.bind_failure("127.0.0.1", 80, OSError(errno.EACCES, "denied")).code == 2
