"""Token files (issue 45, M2): mode 0600 or refused naming the mode, written 0600 whatever the
umask, never overwritten, bound to one server by scheme, host and port."""
from __future__ import annotations

import json
import os
import stat

import pytest

from omni_rl.utils.token_files import TokenFileError, read_token_file, same_origin, write_token_file

TOKEN = "t" * 40


def test_a_written_file_is_0600_under_a_lax_umask_and_reads_back(tmp_path):
    old = os.umask(0o000)
    try:
        path = write_token_file(str(tmp_path / "tok.json"), TOKEN, "http://127.0.0.1:8000")
        temp = write_token_file(None, TOKEN, "http://127.0.0.1:8001")
    finally:
        os.umask(old)
    try:
        for p in (path, temp):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
        found = read_token_file(path)
        assert (found.token, found.url) == (TOKEN, "http://127.0.0.1:8000")
        assert read_token_file(temp).url == "http://127.0.0.1:8001"
        with pytest.raises(FileExistsError):  # never overwritten
            write_token_file(path, "u" * 40, "http://127.0.0.1:9")
        assert read_token_file(path).token == TOKEN
    finally:
        os.remove(temp)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_file_others_can_read_is_refused_naming_its_mode(tmp_path, mode):
    path = tmp_path / "tok.json"
    path.write_text(json.dumps({"url": "http://127.0.0.1:8000", "token": TOKEN}))
    path.chmod(mode)
    with pytest.raises(TokenFileError, match=f"has mode {mode:04o}: other local users can read the token; "
                                             f"expected 0600 \\(run: chmod 600 "):
        read_token_file(str(path))


@pytest.mark.parametrize("content, match", [
    ("not json", "is not a JSON object with a \"token\" string"),
    (json.dumps({"url": "http://127.0.0.1:1"}), "is not a JSON object"),
    (json.dumps({"token": "short"}), "holds a token of 5 characters; expected at least 16"),
    (json.dumps({"token": TOKEN, "url": 5}), "\"url\" is a int"),
])
def test_a_malformed_file_is_refused(tmp_path, content, match):
    path = tmp_path / "tok.json"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(TokenFileError, match=match):
        read_token_file(str(path))


def test_a_missing_file_or_a_symlink_is_refused(tmp_path):
    with pytest.raises(TokenFileError, match="does not exist"):
        read_token_file(str(tmp_path / "none.json"))
    real = write_token_file(str(tmp_path / "real.json"), TOKEN, "http://127.0.0.1:1")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(TokenFileError, match="cannot be opened"):
        read_token_file(str(link))


def test_same_origin_is_scheme_host_and_port():
    assert same_origin("http://127.0.0.1:8000", "http://127.0.0.1:8000/prefix/score")
    assert same_origin("http://EXAMPLE.org", "http://example.org:80")
    assert same_origin("https://example.org/", "https://example.org:443")
    assert not same_origin("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    assert not same_origin("http://127.0.0.1:8000", "https://127.0.0.1:8000")
    assert not same_origin("http://localhost:8000", "http://127.0.0.1:8000")
    assert not same_origin("http://127.0.0.1:8000", "http://127.0.0.1:bad")
