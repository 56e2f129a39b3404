"""The noise draws of the forward-process losses: a timestep t and a noise eps per sample and chunk.

Chunk j of a sample draws its (t, eps) from a generator seeded by (the sample's request seed, j)
alone: the same whatever the micro-batch, order or rank, and on resume. t is drawn inside
[T_EPS, 1 - T_EPS] (neither end says anything about the policy), by `forward_timestep_sampling`:
`uniform`, or `logit_normal` (t = sigmoid(N(0, 1)), SD3's training distribution).
"""
from __future__ import annotations

import torch

from omni_rl.algos import latent_streams as ls
from omni_rl.utils.seeding import derive_seed

T_EPS = 1e-3
TIMESTEP_SAMPLINGS = ("uniform", "logit_normal")


def forward_draws(seeds: torch.Tensor, chunk: int, clean: ls.Latents, sampling: str) -> tuple[torch.Tensor, ls.Latents]:
    """(t [B], eps shaped like `clean` [B, ...]) for chunk `chunk` of the samples whose seeds are
    `seeds` [B] (int64), on the CPU in fp32."""
    if sampling not in TIMESTEP_SAMPLINGS:
        raise ValueError(f"timestep sampling {sampling!r}; expected one of {', '.join(TIMESTEP_SAMPLINGS)}")
    shape = ls.shape_of(ls.index(ls.to(clean, "cpu"), 0))
    ts, noises = [], []
    for seed in seeds.tolist():
        gen = torch.Generator().manual_seed(derive_seed(int(seed), "forward-process", chunk))
        if sampling == "uniform":
            t = T_EPS + (1 - 2 * T_EPS) * torch.rand((), generator=gen)
        else:
            t = torch.sigmoid(torch.randn((), generator=gen)).clamp(T_EPS, 1 - T_EPS)
        ts.append(t)
        noises.append(ls.randn(shape, generator=gen))
    return torch.stack(ts).to(torch.float32), ls.stack(noises)


def noised(clean: ls.Latents, noise: ls.Latents, t: torch.Tensor) -> tuple[ls.Latents, torch.Tensor]:
    """(x_t = (1 - t) x0 + t eps shaped like `clean`, the flow target u = eps - x0 flat [B, D])."""
    x0, eps = ls.flat(clean).to(torch.float32), ls.flat(noise).to(device=t.device, dtype=torch.float32)
    x0 = x0.to(t.device)
    x_t = (1 - t[:, None]) * x0 + t[:, None] * eps
    return ls.unflat(x_t, ls.to(clean, t.device)), eps - x0
