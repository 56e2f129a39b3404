"""Pretrain the tiny SD3 that draws shapes (`tiny:sd3_shapes`), from nothing, on synthetic scenes.

    python -m demos.shapes.pretrain --out DIR          # ~37 min on one CPU core (6 VAE + 31 flow)

Two stages, each deterministic (seeded, one torch thread, data drawn by index):

1. **VAE.** An `AutoencoderKL` (16 latent channels, 4 px per latent pixel) learns to reconstruct
   rendered scenes (`demos.shapes.scene`: one to four flat shapes on grey, each centred in
   a cell of a 3 x 3 grid, 32 px): L1 + MSE on
   the pixels plus a small KL term. Its `shift_factor` / `scaling_factor` are then set from the
   latents' mean and std over a held batch, as SD3's are, so the transformer sees unit-scale latents.
2. **Transformer.** An `SD3Transformer2DModel` (4 MMDiT blocks, 96 wide) learns rectified flow
   on (caption, scene) pairs through the adapter's own `encode_prompts` and `predict_velocity`
   (so pretraining, rollout and RL see one model): x_t = (1 - t) x_0 + t n, target n - x_0, t
   from SD3's logit-normal(0, 1), the caption dropped to "" (the rollout's negative prompt) 10%
   of the time so classifier-free guidance works. The text encoders are random two-layer CLIPs
   (the grammar's words as whole tokens, 16 tokens a caption), frozen: the transformer learns to
   read them.

Pair k of step s is `sample_pair(seed + s * batch + k)`, so the data never repeats and a rerun
draws the same batches. The output folder is a `StableDiffusion3Pipeline` (`save_pretrained`),
with `train_log.json` (settings, per-step losses, wall time) and `SHA256SUMS` (every file's
sha256, which `tiny:sd3_shapes` checks before use). The model is meant to be imperfect:
short training leaves counting, colour binding and positions often wrong, which is what the RL
demo then improves.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from demos.shapes.model import MAX_SEQUENCE_LENGTH

SIZE = 32  # pixels


@dataclass
class PretrainConfig:
    seed: int = 0
    size: int = SIZE
    vae_steps: int = 800
    vae_batch: int = 32
    vae_lr: float = 2e-3
    vae_kl: float = 1e-6
    steps: int = 6000
    batch: int = 48
    lr: float = 1e-3
    warmup: int = 200
    caption_dropout: float = 0.1
    # Text tokens: the CLIP tokenizers know the grammar's words whole and pad every caption to
    # `clip_tokens` (the longest takes 12 with its start and end tokens); the absent T5 adds
    # `max_sequence_length` zero tokens. 16 + 8 text tokens instead of 77 + 16 make every
    # forward (pretraining, rollout, RL) about 3x cheaper.
    clip_tokens: int = 16
    patch_size: int = 2  # latent pixels per transformer token side (2: 4 x 4 tokens at 32 px)
    num_layers: int = 4  # MMDiT blocks
    num_heads: int = 3  # of 32 channels each: the transformer is 32 * num_heads wide
    max_sequence_length: int = MAX_SEQUENCE_LENGTH


def scenes(start: int, n: int, size: int):
    """(captions, uint8 images [n, size, size, 3]) of pairs start .. start + n - 1."""
    from demos.shapes.sampling import sample_pair
    from demos.shapes.scene import render

    pairs = [sample_pair(start + k) for k in range(n)]
    return [p.caption for p in pairs], np.stack([render(p.scene, size) for p in pairs])


def to_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [-1, 1] (the VAE's range)."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def untrained_pipeline(cfg: PretrainConfig):
    """The components before training, seeded."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    from adapters.tiny.sd3 import tiny_text_encoders
    from demos.shapes.grammar import VOCABULARY

    torch.manual_seed(cfg.seed)
    encoders = tiny_text_encoders(words=VOCABULARY, max_length=cfg.clip_tokens)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1, norm_num_groups=8,
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32), use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0, scaling_factor=1.0,
    )
    latent = cfg.size // 4
    transformer = SD3Transformer2DModel(
        sample_size=latent, patch_size=cfg.patch_size, in_channels=16, out_channels=16, num_layers=cfg.num_layers,
        attention_head_dim=32, num_attention_heads=cfg.num_heads, joint_attention_dim=64,
        caption_projection_dim=32 * cfg.num_heads, pooled_projection_dim=64, pos_embed_max_size=latent,
    )
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, **encoders,
    )


def train_vae(vae, cfg: PretrainConfig, log: list, stop_after: int | None = None) -> None:
    """Stage 1 on `vae`, appending each step's loss to `log`; `stop_after` ends it early (the
    schedule still spans `cfg.vae_steps`, so the first steps match a whole run's)."""
    torch.manual_seed(cfg.seed + 1)
    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.vae_lr, weight_decay=0.0)
    vae.train()
    for step in range(cfg.vae_steps if stop_after is None else min(stop_after, cfg.vae_steps)):
        _, images = scenes(10_000_000 + step * cfg.vae_batch, cfg.vae_batch, cfg.size)
        x = to_pixels(images)
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        loss = (recon - x).abs().mean() + ((recon - x) ** 2).mean() + cfg.vae_kl * posterior.kl().mean()
        for group in opt.param_groups:
            group["lr"] = cfg.vae_lr * 0.5 * (1 + math.cos(math.pi * step / cfg.vae_steps))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.append(loss.item())
        _progress("vae", step, cfg.vae_steps, log)
    vae.eval()


@torch.no_grad()
def set_latent_scale(vae, cfg: PretrainConfig) -> tuple[float, float]:
    """SD3's convention: latents = (z - shift) * scale with unit std over a held batch."""
    _, images = scenes(20_000_000, 256, cfg.size)
    z = vae.encode(to_pixels(images)).latent_dist.mode()
    shift, scale = float(z.mean()), float(1.0 / z.std())
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    return shift, scale


def train_transformer(model, cfg: PretrainConfig, log: list, stop_after: int | None = None) -> None:
    """Stage 2: rectified flow through the adapter (`model`: the loaded `StableDiffusion3Adapter`);
    `stop_after` as in `train_vae`."""
    torch.manual_seed(cfg.seed + 2)
    params = [p for p in model.transformer.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    vae_config = model.vae.config
    cache: dict[str, object] = {}
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    model.transformer.train()
    for step in range(cfg.steps if stop_after is None else min(stop_after, cfg.steps)):
        captions, images = scenes(cfg.seed + step * cfg.batch, cfg.batch, cfg.size)
        drop = torch.rand(cfg.batch, generator=gen) < cfg.caption_dropout
        captions = ["" if d else c for c, d in zip(captions, drop.tolist())]
        cond = _encode(model, captions, cache)
        with torch.no_grad():
            z = model.vae.encode(to_pixels(images)).latent_dist.mode()
            x0 = (z - vae_config.shift_factor) * vae_config.scaling_factor
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.sigmoid(torch.randn(cfg.batch, generator=gen))  # logit-normal(0, 1)
        xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
        v = model.predict_velocity(xt, t, cond, guidance_scale=1.0)
        loss = ((v - (noise - x0)) ** 2).mean()
        warm = min(1.0, (step + 1) / cfg.warmup)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * warm * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        log.append(loss.item())
        _progress("flow", step, cfg.steps, log)
    model.transformer.eval()


def _progress(stage: str, step: int, total: int, log: list, every: int = 100) -> None:
    """A line per `every` steps (mean loss since the last line), so a 40-minute run shows it is alive."""
    if (step + 1) % every == 0 or step + 1 == total:
        recent = log[-every:]
        print(f"{stage} step {step + 1}/{total}: loss {sum(recent) / len(recent):.4f}", flush=True)


def _encode(model, captions: list[str], cache: dict):
    """The batch's conditioning (positive embeddings only: guidance 1), each caption encoded once."""
    from omni_rl.models import Conditioning

    missing = sorted({c for c in captions if c not in cache})
    if missing:
        with torch.no_grad():
            cond = model.encode_prompts(missing)
        for i, c in enumerate(missing):
            cache[c] = cond.select([i])
    return Conditioning.cat([cache[c] for c in captions])


# The settings stage 1 depends on: a VAE trained with the same ones is the same VAE.
VAE_FIELDS = ("seed", "size", "vae_steps", "vae_batch", "vae_lr", "vae_kl", "clip_tokens")


def pretrain(out: Path, cfg: PretrainConfig, reuse_vae: Path | None = None) -> dict:
    """Both stages into `out` (a new folder); returns the training log. `reuse_vae` names an
    earlier output folder whose stage 1 ran with the same `VAE_FIELDS`: its VAE is taken instead
    of training the same one again (stage 1 is deterministic; only stage 2's settings changed)."""
    from demos.shapes.sampling import LAYOUT
    from omni_rl.config.schema import LoraConfig, ModelConfig
    from omni_rl.models.diffusion import PromptLengthOptions
    from omni_rl.models import build_model
    from omni_rl.models.checksums import write_checksums
    from omni_rl.utils.atomic import atomic_write_json

    torch.set_num_threads(1)  # one thread: the same float sums on every machine with this torch
    out = Path(out)
    start = time.monotonic()
    pipe = untrained_pipeline(cfg)
    if reuse_vae is None:
        vae_log: list[float] = []
        train_vae(pipe.vae, cfg, vae_log)
        shift, scale = set_latent_scale(pipe.vae, cfg)
    else:
        pipe.vae, vae_log, shift, scale, earlier_s = _earlier_vae(Path(reuse_vae), cfg)
        start -= earlier_s  # the record counts stage 1's time as if it had run here
    pipe.save_pretrained(out)
    vae_s = time.monotonic() - start
    # Every weight of the transformer trains (no LoRA): what is saved is a plain SD3 transformer.
    model_cfg = ModelConfig(path=str(out), adapter_options=PromptLengthOptions(max_sequence_length=cfg.max_sequence_length),
                            lora=LoraConfig(enabled=False))
    model = build_model(model_cfg, torch.device("cpu"))
    log: list[float] = []
    train_transformer(model, cfg, log)
    model.transformer.save_pretrained(out / "transformer")
    record = {
        "config": asdict(cfg), "vae_loss": vae_log, "loss": log, "latent_shift": shift, "latent_scale": scale,
        "vae_seconds": round(vae_s, 1), "seconds": round(time.monotonic() - start, 1), "torch": torch.__version__,
        "vae_reused": reuse_vae is not None, "layout": LAYOUT,
    }
    atomic_write_json(out / "train_log.json", record)
    write_checksums(out)
    return record


def _earlier_vae(folder: Path, cfg: PretrainConfig):
    from diffusers import AutoencoderKL

    from demos.shapes.sampling import LAYOUT

    record = json.loads((folder / "train_log.json").read_text())
    differ = [f for f in VAE_FIELDS if record["config"].get(f) != getattr(cfg, f)]
    if record.get("layout") != LAYOUT:  # a VAE of other scenes (a record before layouts had names)
        differ.append(f"scenes (layout {record.get('layout')!r}, not {LAYOUT!r})")
    if differ:
        raise SystemExit(f"error: --reuse-vae {folder} ran stage 1 with other {', '.join(differ)}; train the VAE anew")
    vae = AutoencoderKL.from_pretrained(folder / "vae")
    return vae, record["vae_loss"], record["latent_shift"], record["latent_scale"], record["vae_seconds"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demos.shapes.pretrain", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="a new folder for the pipeline")
    parser.add_argument("--steps", type=int, default=PretrainConfig.steps, help="transformer steps")
    parser.add_argument("--vae-steps", type=int, default=PretrainConfig.vae_steps)
    parser.add_argument("--patch-size", type=int, default=PretrainConfig.patch_size)
    parser.add_argument("--num-layers", type=int, default=PretrainConfig.num_layers, help="MMDiT blocks")
    parser.add_argument("--num-heads", type=int, default=PretrainConfig.num_heads, help="attention heads of 32 channels")
    parser.add_argument("--reuse-vae", help="an earlier output folder whose VAE stage had the same settings")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: --out {out} is not empty; give a new folder")
    record = pretrain(out, PretrainConfig(steps=args.steps, vae_steps=args.vae_steps, patch_size=args.patch_size,
                                     num_layers=args.num_layers, num_heads=args.num_heads), args.reuse_vae)
    print(f"done in {record['seconds']} s: vae loss {record['vae_loss'][-1]:.4f}, flow loss "
          f"{np.mean(record['loss'][-100:]):.4f} (mean of the last 100 steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
