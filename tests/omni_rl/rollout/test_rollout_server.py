"""`rollout.backend=server`: the native engine in a process of its own, behind the rollout protocol.

A run with the server trains like the in-process native engine (the same seeds, the same
weights synced as named tensors); it reports the weight version it samples with; a server that
dies fails the run within `rollout.backend_options.server_timeout_s`, naming it; a client and a server of
different protocol versions refuse each other; `rollout.backend_options.python` picks the server's interpreter.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from omni_rl.cli import main as cli_main
from omni_rl.compose import load_config
from omni_rl.rollout.base import RolloutEngine
from omni_rl.rollout.base import RolloutEngineError
from omni_rl.rollout.server.app import RolloutServer
from omni_rl.rollout.server.client import ServerRolloutEngine
from omni_rl.rollout.server.protocol import CONTENT_TYPE, decode_message, encode_message, encode_weights
from omni_rl.rollout.types import DiffusionRequest
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_SD3

QUIET = ["trainer.val_every=0", "trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.save_every=0"]
SD3 = ["recipe=tiny_sd3_flowgrpo", *TINY_SD3, "trainer.total_steps=2", "trainer.save_every=0"]
QWEN3 = ["recipe=tiny_qwen3_grpo", "trainer.total_steps=2", "rollout.sampling_options.max_new_tokens=8", *QUIET]
SERVER = ["rollout.backend=server", "rollout.backend_options.server_timeout_s=60"]


def train(tmp_path, name, base, *overrides):
    """Run `base` + `overrides`; returns the trainer, its metrics and, per weight sync, what the
    rollout engine then reported (the server's own stats) and the versions the results carried."""
    trainer = PPOTrainer(load_config([*base, f"trainer.output_dir={tmp_path / name}", *overrides]))
    synced, sampled = [], []
    sync, wait = trainer.actors.sync_rollout, trainer.rollout_engine.wait

    def spy_sync(version):
        sync(version)
        stats = trainer.rollout_engine.stats
        synced.append((version, stats.get("weight_version"), stats.get("weight_kind")))

    def spy_wait(requests, futures, timeout_s):
        results = wait(requests, futures, timeout_s)
        sampled.append(sorted({r.weight_version for r in results}))
        return results

    trainer.actors.sync_rollout, trainer.rollout_engine.wait = spy_sync, spy_wait
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return trainer, records, synced, sampled


def assert_same_training(native, server):
    (a, a_records, *_), (b, b_records, *_) = native, server
    rewards = [[r["reward/total/mean"], r["reward/total/std"]] for r in a_records]
    torch.testing.assert_close([[r["reward/total/mean"], r["reward/total/std"]] for r in b_records], rewards,
                               atol=1e-6, rtol=0)
    wa, wb = a.model.named_trainable_tensors(), b.model.named_trainable_tensors()
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], atol=1e-6, rtol=0, msg=name)


def test_sd3_server_trains_like_native_and_syncs_lora(tmp_path):
    native = train(tmp_path, "native", SD3)
    server = train(tmp_path, "server", SD3, *SERVER)
    assert_same_training(native, server)
    # LoRA only: the server reports each version the trainer synced, and samples with it.
    assert server[2] == [(1, 1, "lora"), (2, 2, "lora")]
    assert server[3] == [[0], [1]]
    assert native[3] == [[0], [1]]


def test_qwen3_server_trains_like_native_with_full_weights(tmp_path):
    native = train(tmp_path, "native", QWEN3)
    server = train(tmp_path, "server", QWEN3, *SERVER)
    assert_same_training(native, server)
    assert server[2] == [(1, 1, "full"), (2, 2, "full")]  # the recipe trains every weight (lora off)
    assert server[3] == [[0], [1]]


def other_python(tmp_path):
    """The python of a fresh venv (no pip) whose site-packages point at this interpreter's."""
    import site
    import sysconfig

    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                          timeout=120)
    if made.returncode != 0:
        pytest.skip(f"python -m venv failed here ({made.stderr.strip()[-200:]}); rollout.backend_options.python not checked")
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    ours = [p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if os.path.isdir(p)]
    with open(os.path.join(purelib, "omni_rl_test_parent.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys(ours)) + "\n")
    return python


# A stopped (silent) server waits out its deadline: `long` (CI time); a killed one runs by default.
@pytest.mark.parametrize("how", ["killed", pytest.param("stopped", marks=pytest.mark.long)])
def test_a_dead_or_silent_server_fails_the_run_within_the_deadline_naming_it(tmp_path, how):
    # killed: its connections drop at once; stopped (SIGSTOP): it holds them open and answers
    # nothing, so the health checks of `wait` give up after rollout.backend_options.server_timeout_s.
    timeout_s = 60 if how == "killed" else 5
    overrides = [*SD3, f"trainer.output_dir={tmp_path / how}", *SERVER, f"rollout.backend_options.server_timeout_s={timeout_s}",
                 "trainer.total_steps=3"]
    if how == "killed":
        # rollout.backend_options.python names another interpreter: a venv made here, seeing this one's packages.
        python = other_python(tmp_path)
        overrides.append(f"rollout.backend_options.python={python}")
    trainer = PPOTrainer(load_config(overrides))
    engine = trainer.rollout_engine
    pid = engine.pid
    if how == "killed":
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[0] == str(python).encode()
    submit, calls = engine.submit_many, []

    def stop_on_second(requests):
        futures = submit(requests)
        calls.append(time.monotonic())
        if len(calls) == 2:  # mid-rollout: its answer never comes
            os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        return futures

    engine.submit_many = stop_on_second
    try:
        with pytest.raises(RolloutEngineError) as err:
            trainer.fit()
        assert len(calls) == 2
        assert time.monotonic() - calls[1] < timeout_s + 20  # the deadline, plus slack for a slow machine
        assert f"pid {pid}" in str(err.value) and engine.url in str(err.value), str(err.value)
        assert "generating 8 requests" in str(err.value), str(err.value)
    finally:
        if how == "stopped" and engine.process.poll() is None:
            os.kill(pid, signal.SIGKILL)
            engine.process.wait(timeout=30)


def test_a_server_that_cannot_start_exits_the_cli_with_one_error_line(tmp_path, capsys):
    code = cli_main([*SD3, f"trainer.output_dir={tmp_path / 'cli'}", *SERVER, "rollout.backend_options.python=/bin/false"])
    assert code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rollout server" in errors[0] and "exited with code 1" in errors[0], errors


class _EchoEngine(RolloutEngine):
    """Answers a request with itself; no model (the protocol tests need none)."""

    def submit_many(self, requests):
        raise NotImplementedError

    def wait(self, requests, futures, timeout_s):
        raise NotImplementedError

    def generate(self, requests, timeout_s=1800.0):
        return list(requests)

    def update_weights(self, tensors, version, kind):
        self.weight_version = version


@pytest.fixture
def echo_server():
    import threading

    server = RolloutServer(_EchoEngine())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_protocol_version_mismatch_is_refused_on_both_sides(echo_server, monkeypatch):
    client = ServerRolloutEngine(echo_server.url, timeout_s=10)
    req = DiffusionRequest("a cat", 1, 32, 32, 4, 4.5, sde_window_range=(0, 3), initial_noise=torch.randn(4, 4, 4))
    (back,) = client.generate([req], timeout_s=10)
    assert back.request_id == req.request_id and torch.equal(back.initial_noise, req.initial_noise)
    client.update_weights({"w": torch.ones(2)}, 3, "lora")
    assert client.stats["weight_version"] == 3 and client.stats["weight_kind"] == "lora"

    client.protocol_version = 2
    with pytest.raises(RolloutEngineError, match="speaks protocol 1 and was sent protocol '2'") as err:
        client.generate([req], timeout_s=10)
    assert echo_server.url in str(err.value) and "HTTP 400" in str(err.value)

    client.protocol_version, echo_server.protocol_version = 1, 7
    with pytest.raises(RolloutEngineError, match="this rollout server speaks protocol 7 and was sent protocol '1'"):
        client.stats
    # A server that (wrongly) takes any version still answers with its own: the client refuses it.
    from omni_rl.rollout.server import app

    monkeypatch.setattr(app, "version_mismatch", lambda *args: None)
    with pytest.raises(RolloutEngineError, match="this rollout client speaks protocol 1 and was sent protocol '7'"):
        client.stats


def test_messages_carry_every_result_field():
    from omni_rl.algos.latent_streams import LatentStreams
    from omni_rl.models.conditioning import Conditioning
    from omni_rl.rollout.types import DiffusionResult

    cond = Conditioning({"emb": torch.randn(1, 3, 2), "mask": torch.tensor([[1, 1, 0]])}, {"emb": "mask"})
    latents = LatentStreams({"video": torch.randn(3, 2, 4), "audio": torch.randn(3, 5)})
    res = DiffusionResult(
        request_id=7, prompt="p", window=(1, 3), latents=latents, log_probs=torch.randn(2), sigmas=torch.rand(2),
        sigmas_next=torch.rand(2), noise_levels=torch.full((2,), 0.7), final_latent=latents.map(lambda t: t[0]),
        conditioning=cond, image=torch.randint(0, 255, (4, 4, 3), dtype=torch.uint8), guidance_scale=4.5,
        kernel="sde", fps=24.0, audio=torch.randn(2, 10), sample_rate=16000, weight_version=5,
    )
    (back,) = decode_message(encode_message({"results": [res]}))["results"]
    assert type(back) is DiffusionResult and back.window == (1, 3) and back.weight_version == 5
    assert back.conditioning.masks == {"emb": "mask"} and isinstance(back.latents, LatentStreams)
    for name in ("log_probs", "sigmas", "sigmas_next", "noise_levels", "image", "audio"):
        assert torch.equal(getattr(back, name), getattr(res, name)), name
    for name in ("video", "audio"):
        assert torch.equal(back.latents[name], latents[name]) and torch.equal(back.final_latent[name], latents[name][0])
    assert torch.equal(back.conditioning["mask"], cond["mask"]) and back.image.dtype == torch.uint8


def test_requests_carry_an_edit_models_condition_images():
    from omni_rl.rollout.diffusion_sampling import encoding_key
    from omni_rl.rollout.types import DiffusionRequest

    images = (torch.randint(0, 255, (32, 48, 3), dtype=torch.uint8),)
    req = DiffusionRequest(prompt="make it red", seed=3, height=32, width=32, num_steps=2, guidance_scale=4.0,
                           images=images)
    (back,) = decode_message(encode_message({"requests": [req]}))["requests"]
    assert isinstance(back.images, tuple) and torch.equal(back.images[0], images[0])
    assert back.images[0].dtype == torch.uint8
    assert encoding_key(back) == encoding_key(req)  # the server shares a group's encoding too


def test_health_answers_while_a_generate_runs(echo_server):
    # The client tells a busy server from a silent one by /health: it must not wait for the engine.
    import threading

    generate = echo_server.engine.generate
    started, release = threading.Event(), threading.Event()

    def slow(requests, timeout_s=1800.0):
        started.set()
        release.wait(30)
        return generate(requests, timeout_s)

    echo_server.engine.generate = slow
    client = ServerRolloutEngine(echo_server.url, timeout_s=10)
    req = DiffusionRequest("a cat", 1, 32, 32, 4, 4.5)
    futures = client.submit_many([req])
    assert started.wait(30)
    t0 = time.monotonic()
    assert client._json("GET", "/health", what="checking its health")["status"] == "ok"
    assert time.monotonic() - t0 < 5
    release.set()
    assert client.wait([req], futures, timeout_s=30)[0].request_id == req.request_id


def test_weights_travel_in_buckets_and_the_version_lands_with_the_last(echo_server):
    loaded = []
    update = echo_server.engine.update_weights

    def spy(tensors, version, kind):
        loaded.append((sorted(tensors), version))
        update(tensors, version, kind)

    echo_server.engine.update_weights = spy
    client = ServerRolloutEngine(echo_server.url, timeout_s=10, bucket_bytes=16)  # 4 floats a bucket
    client.update_weights(iter([("a", torch.ones(4)), ("b", torch.ones(2)), ("c", torch.ones(2)), ("d", torch.ones(3))]), 4, "full")
    assert loaded == [(["a"], 0), (["b", "c"], 0), (["d"], 4)]
    assert client.stats["weight_version"] == 4 and client.weight_version == 4
    with pytest.raises(RolloutEngineError, match="HTTP 400.*kind='delta'"):
        client._call("POST", "/update_weights", encode_weights({}, 5, "delta", 0, True), CONTENT_TYPE, what="sending a bad kind")
