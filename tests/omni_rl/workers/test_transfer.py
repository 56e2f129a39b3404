"""`to_host`: a worker's rollout results leave it with every tensor on the host, their types and
values kept. CUDA tensors are fake ones (`FakeTensorMode` makes them without a GPU), so the walk
is checked on the device a GPU run returns from."""
import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from omni_rl.algos.latent_streams import LatentStreams
from omni_rl.models.autoregressive import PromptInputs
from omni_rl.models.conditioning import Conditioning
from omni_rl.rollout.text_types import TextResult
from omni_rl.rollout.types import DiffusionResult
from omni_rl.workers.transfer import to_host


def tensors_of(value):
    out = []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, LatentStreams):
        return list(value.streams.values())
    if isinstance(value, Conditioning):
        return list(value.tensors.values())
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            out += tensors_of(getattr(value, f.name))
    elif isinstance(value, (list, tuple)):
        for v in value:
            out += tensors_of(v)
    elif isinstance(value, dict):
        for v in value.values():
            out += tensors_of(v)
    return out


def diffusion_result(device) -> DiffusionResult:
    def t(*shape, dtype=torch.float32):
        return torch.zeros(shape, dtype=dtype, device=device)

    return DiffusionResult(
        request_id=3, prompt="a cat", window=(0, 2), latents=LatentStreams({"video": t(3, 4, 2, 2), "audio": t(3, 8)}),
        log_probs=t(2), sigmas=t(2), sigmas_next=t(2), noise_levels=t(2), final_latent=t(4, 2, 2),
        conditioning=Conditioning({"prompt_embeds": t(1, 5, 6), "mask": t(1, 5, dtype=torch.long)}, {"prompt_embeds": "mask"}),
        image=torch.zeros(8, 8, 3, dtype=torch.uint8), guidance_scale=4.5, kernel="sde", audio=t(2, 100),
        sample_rate=16000, weight_version=7)


def test_every_tensor_of_a_cuda_result_comes_to_the_host_with_its_types_and_fields():
    with FakeTensorMode():
        results = [diffusion_result("cuda"),
                   TextResult(request_id=1, prompt=PromptInputs(torch.zeros(4, dtype=torch.long, device="cuda"),
                                                                {"pixel_values": torch.zeros(1, 3, device="cuda")}),
                              response_ids=torch.zeros(5, dtype=torch.long, device="cuda"),
                              log_probs=torch.zeros(5, device="cuda"), finish_reason="stop", text="hi", temperature=1.0)]
        before = [t for r in results for t in tensors_of(r)]
        assert before and all(t.device.type == "cuda" for t in before if t.dtype != torch.uint8)
        moved = to_host(results)
    after = [t for r in moved for t in tensors_of(r)]
    assert len(after) == len(before)
    assert all(t.device.type == "cpu" for t in after)
    assert [(t.shape, t.dtype) for t in after] == [(t.shape, t.dtype) for t in before]
    d, text = moved
    assert type(d) is DiffusionResult and type(text) is TextResult
    assert isinstance(d.latents, LatentStreams) and d.latents.names == ("video", "audio")
    assert d.conditioning.masks == {"prompt_embeds": "mask"}
    assert (d.request_id, d.window, d.kernel, d.sample_rate, d.weight_version) == (3, (0, 2), "sde", 16000, 7)
    assert type(text.prompt) is PromptInputs and list(text.prompt.media) == ["pixel_values"]


def test_a_host_tensor_is_kept_not_copied():
    result = diffusion_result("cpu")
    moved = to_host(result)
    assert moved.log_probs is result.log_probs and moved.image is result.image
