"""The latent scorers the reward server serves by name: the DiNa-LRM idea (score clean latents,
no VAE decode) as a demo of the remote-scorer protocol, and the scorers its tests use.

    python -m omni_rl.reward.server --scorer latent_stats --port 8000

`latent_stats` scores -mean(latent**2) (fp64); `latent_reward_model` serves a tiny conv net
(`LatentRewardModel`, seeded or loaded from safetensors): plumbing, not a trained model. Both
register with `register_served_scorer`; the client side is `latent_http`.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from omni_rl.reward.protocol import LATENTS
from omni_rl.reward.server import HttpStatusError, OneKindScorer, ServedScorer, register_served_scorer


class LatentStats(OneKindScorer):
    """The `latent_stats` scorer: -mean(latent**2) per sample, in float64."""

    accepts = LATENTS

    def __call__(self, latents: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> list[float]:
        _check_latents(latents, "latent_stats")
        flat = latents.detach().to(torch.float64).reshape(latents.shape[0], -1)
        return (-(flat * flat).mean(dim=1)).tolist()

    def __repr__(self) -> str:  # the name the server's health check reports
        return "latent_stats"


@register_served_scorer("latent_stats")
def latent_stats() -> ServedScorer:
    """Factory of the `latent_stats` scorer (`LatentStats`)."""
    return LatentStats()


class LatentRewardModel(torch.nn.Module):
    """A tiny conv net scoring clean latents [B, C, H, W] -> [B] (no VAE decode).

    conv3x3(C -> hidden) -> SiLU -> conv3x3 stride 2 -> SiLU -> conv3x3 stride 2 -> SiLU ->
    mean over H, W -> linear(hidden -> 1). No normalisation layers, so a sample's score does
    not depend on the rest of its batch.
    """

    def __init__(self, in_channels: int = 16, hidden: int = 32):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("hidden", hidden)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LatentRewardModel: {name}={value!r}; expected an int >= 1")
        self.in_channels = in_channels
        self.hidden = hidden
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(in_channels, hidden, 3, padding=1),
            torch.nn.SiLU(),
            torch.nn.Conv2d(hidden, hidden, 3, stride=2, padding=1),
            torch.nn.SiLU(),
            torch.nn.Conv2d(hidden, hidden, 3, stride=2, padding=1),
            torch.nn.SiLU(),
        )
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        if latents.ndim != 4 or latents.shape[1] != self.in_channels:
            raise ValueError(
                f"LatentRewardModel takes latents [B, {self.in_channels}, H, W]; got shape "
                f"{tuple(latents.shape)}. Build the model with in_channels matching the VAE's latent "
                f"channels (video latents [B, C, T, H, W] need a different model)"
            )
        return self.head(self.body(latents).mean(dim=(2, 3))).squeeze(-1)

    def save_safetensors(self, path: str) -> None:
        """Write the weights and the shape (`in_channels`, `hidden`) to one safetensors file."""
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, path, metadata={
            "model": "LatentRewardModel", "in_channels": str(self.in_channels), "hidden": str(self.hidden),
        })

    @classmethod
    def from_safetensors(cls, path: str) -> "LatentRewardModel":
        """Load a model written by `save_safetensors` (its shape is read from the file)."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(path, framework="pt") as handle:
            meta = handle.metadata() or {}
        if meta.get("model") != "LatentRewardModel":
            raise ValueError(
                f"{path}: its safetensors metadata says model={meta.get('model')!r}; expected "
                f"'LatentRewardModel' (write the file with LatentRewardModel.save_safetensors)"
            )
        try:
            model = cls(int(meta["in_channels"]), int(meta["hidden"]))
        except (KeyError, ValueError) as err:
            raise ValueError(f"{path}: bad in_channels/hidden in its metadata {meta!r} ({err})") from err
        try:
            model.load_state_dict(load_file(path))
        except RuntimeError as err:
            raise ValueError(
                f"{path}: the weights do not fit LatentRewardModel(in_channels={model.in_channels}, "
                f"hidden={model.hidden}): {err}"
            ) from err
        return model.eval()


class LatentModelScorer(OneKindScorer):
    """Serves a LatentRewardModel: float32 latents [B, C, H, W] -> B floats (inference mode)."""

    accepts = LATENTS

    def __init__(self, model: LatentRewardModel):
        self.model = model.eval()

    @torch.inference_mode()
    def __call__(self, latents: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> list[float]:
        _check_latents(latents, "latent_reward_model")
        if latents.ndim != 4 or latents.shape[1] != self.model.in_channels:
            raise HttpStatusError(
                400, f"latent_reward_model takes latents [B, {self.model.in_channels}, H, W]; got shape "
                f"{tuple(latents.shape)}"
            )
        param = next(self.model.parameters())
        return self.model(latents.to(param.device, param.dtype)).double().cpu().tolist()

    def __repr__(self) -> str:
        return f"LatentModelScorer(in_channels={self.model.in_channels}, hidden={self.model.hidden})"


@register_served_scorer("latent_reward_model")
def latent_reward_model(
    *, path: str | None = None, in_channels: int = 16, hidden: int = 32, seed: int = 0
) -> LatentModelScorer:
    """Factory: load `path` (a LatentRewardModel safetensors file) or build one from `seed`."""
    if path is not None:
        return LatentModelScorer(LatentRewardModel.from_safetensors(path))
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LatentRewardModel(in_channels, hidden)
    finally:
        torch.random.set_rng_state(generator_state)
    return LatentModelScorer(model)


def _check_latents(latents: Any, name: str) -> None:
    if not isinstance(latents, torch.Tensor) or not latents.is_floating_point() or latents.ndim < 2:
        raise HttpStatusError(
            400, f"{name} scores float latents [B, ...]; got "
            f"{type(latents).__name__} {getattr(latents, 'dtype', '')} {tuple(getattr(latents, 'shape', ()))}"
        )
