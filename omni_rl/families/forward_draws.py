"""The noise draws of the forward-process losses: a timestep t and a noise eps per sample and chunk.

Chunk j of a sample's forward-process loss (`diffusion_nft`, `diffusion_dpo`) noises its clean
latent x0 with its own (t, eps), drawn from a generator seeded by (the sample's seed, j) alone:
the same whatever the micro-batch, the order or the rank, and a resumed run draws the same. The
sample's seed is its rollout request's (itself derived from trainer.seed, the step and the sample),
so draws differ across steps and samples. t first, then eps (stream after stream).

Timestep samplings (the diffusion family's option `forward_timestep_sampling`), both kept inside [T_EPS, 1 - T_EPS] so
that neither the clean nor the pure-noise end (where the target carries no information about
the policy) is drawn:
  uniform       t = T_EPS + (1 - 2 T_EPS) U,  U ~ U[0, 1)
  logit_normal  t = sigmoid(N(0, 1)), clamped (SD3's training distribution, m = 0, s = 1)
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
