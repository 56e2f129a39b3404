"""A small two-stream generator for the tests of the multi-stream contract (video + audio latents).

Not a stand-in for any adapter: a real (if tiny) `DiffusionModelBase` whose one forward denoises
a video latent [C, T, H, W] and an audio latent [C, L] together, each stream's velocity depending
on both streams and on its own sample's prompt embedding, with classifier-free guidance, as LTX-2
does. It is what the engine, the batch, the kernels and the family are tested against, so the
tests need no large model; LTX-2's adapter is tested on the same properties with its own tiny
model.
"""
from __future__ import annotations

import torch
from torch import nn

from omni_rl.config.schema import ModelConfig
from omni_rl.models import Conditioning, DiffusionModelBase
from omni_rl.algos.latent_streams import LatentStreams

VIDEO = (4, 2, 4, 4)
AUDIO = (2, 8)


class _Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        d_video, d_audio = 4 * 2 * 4 * 4, 2 * 8
        self.video = nn.Linear(d_video + d_audio + 8 + 1, d_video)
        self.audio = nn.Linear(d_video + d_audio + 8 + 1, d_audio)

    def forward(self, video, audio, sigma, text):
        h = torch.cat([video.flatten(1), audio.flatten(1), text, sigma[:, None]], dim=1)
        return torch.tanh(self.video(h)).reshape(video.shape), torch.tanh(self.audio(h)).reshape(audio.shape)


class TwoStreamModel(DiffusionModelBase):
    makes_audio = True
    def __init__(self, num_train_timesteps: int = 1000):
        super().__init__(ModelConfig(), "two-stream", torch.device("cpu"))
        from diffusers import FlowMatchEulerDiscreteScheduler

        self.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
        self.net = _Mixer()
        self.net.eval()

    def trainable_module(self):
        return self.net

    def latent_shape(self, height, width, num_frames=1):
        return {"video": VIDEO, "audio": AUDIO}

    def encode_prompts(self, prompts, negative_prompt=""):
        def embed(text):
            codes = torch.tensor([float(ord(c) % 17) for c in (text + " " * 8)[:8]]) / 17.0
            return codes
        pos = torch.stack([embed(p) for p in prompts])
        neg = embed(negative_prompt)[None].expand(len(prompts), -1).clone()
        return Conditioning({"text": pos, "negative_text": neg})

    def predict_velocity(self, latents, sigma, conditioning, guidance_scale):
        video, audio = latents["video"].float(), latents["audio"].float()
        text, neg = conditioning["text"], conditioning["negative_text"]
        v_c, a_c = self.net(video, audio, sigma.float(), text)
        if guidance_scale > 1.0:
            v_u, a_u = self.net(video, audio, sigma.float(), neg)
            v_c, a_c = v_u + guidance_scale * (v_c - v_u), a_u + guidance_scale * (a_c - a_u)
        return LatentStreams({"video": v_c, "audio": a_c})

    def decode(self, latents):
        video = latents["video"]
        frames = ((video.mean(1, keepdim=True).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return frames.permute(0, 2, 3, 4, 1).expand(-1, -1, -1, -1, 3).contiguous()

    def decode_audio(self, latents):
        audio = latents["audio"].float()  # [B, 2, 8] -> a mono waveform of 32 samples at 16 kHz
        return torch.tanh(audio.mean(1, keepdim=True)).repeat_interleave(4, dim=-1), 16000

    def save_lora(self, folder):
        raise NotImplementedError("the two-stream test model has no LoRA format")
