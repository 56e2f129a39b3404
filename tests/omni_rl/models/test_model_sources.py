"""model.path checks (omni_rl/models/loading.py): a folder must hold a model, and a hub id is
looked up in the local Hugging Face cache first and never waits on an unreachable hub.

Everything here is local: a hub id's cache is a folder under tmp_path laid out as
huggingface_hub lays it out, and the network is replaced by stubs that fail the test if used.
"""
import json
import socket
import threading

import huggingface_hub.constants as hf_constants
import pytest

from omni_rl.models import loading
from omni_rl.models.loading import (
    MissingWeightsError,
    ModelFolderError,
    check_model_folder,
    check_model_source,
    hub_unreachable,
    resolve_model_path,
)

REPO = "some-org/some-model"


class _Conn:
    def close(self):
        pass


class _Model:
    """Stands for a ModelConfig: check_model_source reads path and revision."""

    def __init__(self, path, revision=None):
        self.path = path
        self.revision = revision


def _transformers_folder(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def _pipeline_folder(folder):
    """A diffusers pipeline as `hf download` writes one (SD3's layout, no T5)."""
    folder.mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusion3Pipeline",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "transformer": ["diffusers", "SD3Transformer2DModel"],
        "text_encoder_3": [None, None],
    }))
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text("{}")
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    _transformers_folder(folder / "transformer")
    (folder / "transformer" / "model.safetensors").rename(folder / "transformer" / "diffusion_pytorch_model.safetensors")
    return folder


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to reach the hub fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the hub was contacted")

    monkeypatch.setattr(loading, "hub_unreachable", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    return cache


def _cache_snapshot(cache, repo_id):
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return _transformers_folder(repo / "snapshots" / commit)


# --- local folders ---------------------------------------------------------------------------
def test_whole_folders_pass(tmp_path):
    pipeline = _pipeline_folder(tmp_path / "sd3")
    text = _transformers_folder(tmp_path / "qwen3")
    assert resolve_model_path(str(pipeline)) == str(pipeline)
    assert resolve_model_path(str(text)) == str(text)


def test_an_empty_folder_says_what_a_model_folder_holds(tmp_path):
    with pytest.raises(ModelFolderError, match=r"is an empty folder; expected a model folder.*model_index.json.*config.json"):
        resolve_model_path(str(tmp_path))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelFolderError, match="has neither model_index.json nor config.json"):
        resolve_model_path(str(tmp_path))


@pytest.mark.parametrize("content, problem", [
    (b"{not json", r"model_index.json is not valid JSON \(.* at line 1, column 2\)"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", r"model_index.json is not UTF-8 text \(byte 0\)"),
    (b"[1, 2]", r"model_index.json holds a JSON list, not an object"),
])
def test_a_broken_model_index_is_named(tmp_path, content, problem):
    (tmp_path / "model_index.json").write_bytes(content)
    with pytest.raises(ModelFolderError, match=rf"model.path='{tmp_path}': {tmp_path}/{problem}; re-download"):
        resolve_model_path(str(tmp_path))


def test_a_missing_component_or_weight_file_is_named(tmp_path):
    folder = _pipeline_folder(tmp_path / "sd3")
    (folder / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match=r"sd3/transformer has a config.json but no weight file"):
        resolve_model_path(str(folder))
    check_model_folder(folder, str(folder), weights=False)  # a weightless view needs no weights

    (folder / "transformer" / "config.json").write_text("{")
    with pytest.raises(ModelFolderError, match=r"transformer/config.json is not valid JSON"):
        check_model_folder(folder, str(folder), weights=False)

    for part in (folder / "transformer").iterdir():
        part.unlink()
    (folder / "transformer").rmdir()
    with pytest.raises(ModelFolderError, match=r"lists the component 'transformer' \(SD3Transformer2DModel\) but .*sd3/transformer is missing"):
        resolve_model_path(str(folder))


def test_a_file_or_a_missing_path_is_bad_input(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelFolderError, match="is a file; expected a model folder or a hub id"):
        resolve_model_path(str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelFolderError, match="no such folder"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(ModelFolderError, match=r"no such folder \(and not a hub id"):
        resolve_model_path("models/sd35/medium")  # two slashes: not ORG/NAME either


# --- hub ids ---------------------------------------------------------------------------------
def test_a_cached_hub_id_is_used_without_the_network(hf_cache, no_network):
    snapshot = _cache_snapshot(hf_cache, REPO)
    check_model_source(_Model(REPO))
    assert resolve_model_path(REPO) == str(snapshot)


def test_an_uncached_hub_id_with_the_hub_offline_says_how_to_get_it(hf_cache, monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("connected while offline"))
    for check in (lambda: check_model_source(_Model(REPO)), lambda: resolve_model_path(REPO)):
        with pytest.raises(MissingWeightsError) as info:
            check()
        message = str(info.value)
        assert not isinstance(info.value, ModelFolderError)
        assert f"model.path='{REPO}'" in message and "HF_HUB_OFFLINE is set" in message
        assert f"hf download {REPO} --local-dir /models/some-model" in message
        assert "model.path=/models/some-model" in message


def test_a_refused_connection_is_reported_at_once(hf_cache, monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", "http://127.0.0.1:1")
    with pytest.raises(MissingWeightsError, match=r"not downloadable from http://127.0.0.1:1 \(no connection to 127.0.0.1:1"):
        check_model_source(_Model(REPO))


def test_the_hub_probe_gives_up_after_its_timeout(monkeypatch):
    """A firewall that drops packets (or a hanging name lookup) costs `timeout`, not the
    minutes of huggingface_hub's own timeouts and retries."""
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", "https://hub.example")
    release = threading.Event()

    def hang(*args, **kwargs):
        release.wait(60)
        return _Conn()

    monkeypatch.setattr(socket, "create_connection", hang)
    try:
        assert hub_unreachable(timeout=0.1) == "no answer from hub.example:443 within 0.1 s"
    finally:
        release.set()


def test_the_hub_probe_goes_through_the_https_proxy(monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", "https://huggingface.co")
    monkeypatch.setenv("https_proxy", "http://proxy.internal:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    tried = []
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout: tried.append(address) or _Conn())
    assert hub_unreachable(timeout=5) is None
    assert tried == [("proxy.internal", 3128)]


def test_diffusers_loads_weights_with_accelerate():
    """Why pyproject.toml declares accelerate although omni-rl imports none of it: diffusers'
    from_pretrained loads into an empty model with it (low_cpu_mem_usage) and falls back to
    building a random model first (slower, twice the host memory) without it."""
    from diffusers.utils import is_accelerate_available

    assert is_accelerate_available()


def _modular_folder(folder):
    """A modular-only pipeline as `hf download` writes one (MiniMax-H3's layout): a
    modular_model_index.json whose entries name their subfolder and point at the hub id."""
    spec = lambda sub: {"pretrained_model_name_or_path": REPO, "subfolder": sub, "revision": None, "variant": None}  # noqa: E731
    folder.mkdir(parents=True)
    (folder / "modular_model_index.json").write_text(json.dumps({
        "_class_name": "MiniMaxH3ModularPipeline", "_blocks_class_name": "MiniMaxH3Blocks",
        "scheduler": ["diffusers", "MiniMaxH3Scheduler", spec("scheduler")],
        "transformer": ["diffusers", "MiniMaxH3Transformer3DModel", spec("transformer")],
        "transformer_ref": [None, None, {"pretrained_model_name_or_path": None, "subfolder": ""}],
    }))
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text("{}")
    (folder / "transformer").mkdir()
    (folder / "transformer" / "config.json").write_text("{}")
    (folder / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"weights")
    return folder


def test_a_modular_pipeline_folder_passes_and_names_a_missing_component(tmp_path):
    folder = _modular_folder(tmp_path / "h3")
    assert resolve_model_path(str(folder)) == str(folder)
    assert loading.index_components(json.loads((folder / "modular_model_index.json").read_text())) == {
        "scheduler": ("MiniMaxH3Scheduler", "scheduler"), "transformer": ("MiniMaxH3Transformer3DModel", "transformer"),
    }
    (folder / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match="transformer has a config.json but no weight file"):
        check_model_folder(folder, "h3")
    check_model_folder(folder, "h3", weights=False)
    for file in (folder / "transformer").iterdir():
        file.unlink()
    (folder / "transformer").rmdir()
    with pytest.raises(ModelFolderError, match=r"modular_model_index.json lists the component 'transformer' "
                                               r"\(MiniMaxH3Transformer3DModel\) but .*transformer is missing"):
        check_model_folder(folder, "h3", weights=False)
