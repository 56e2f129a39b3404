"""The reward models of a plan: `plan_rewards(cfg)`.

Every configured reward (`reward.rewards`, and `reward.val_rewards` when given: both managers
are built when a run starts and hold their models for the whole run) whose registry declaration
has `device_networks` (`omni_rl.reward.registry.RewardDeclaration`) builds its networks on the
meta device from configuration files alone: a hub id reads the shipped
`recipes/architectures/rewards/<org>--<name>/config.json`, as the policy's build reads its own, and no weights or
network are touched. Their parameters and buffers are counted in the dtypes the reward's loading
gives them.

Where they sit, by how the run scores:
- `reward.workers.num_workers > 0`: on Ray reward workers of their own (`on_training_device`
  false: not added to a training device's peaks; listed);
- a reward whose `device` option is `cpu`: host memory (not added either);
- otherwise (`device: auto` or an accelerator) the accelerator of the process that scores: rank
  0's in a local run, and in a Ray run the driver's, which is a device a rank also uses. Their
  bytes are added to that device's training and rollout peaks, the worst device's.

Rewards with no declaration (rules, remote scorers, RapidOCR's CPU-only engine) hold nothing on a
device and are listed with zero bytes.
"""
from __future__ import annotations

from typing import Any

from omni_rl.config.schema import OmniConfig


def _network_bytes(module) -> tuple[int, int, str]:
    """(parameters, bytes of parameters and buffers, the parameters' dtype) of a meta-built module."""
    params = sum(p.numel() for p in module.parameters())
    size = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in module.parameters()})
    return params, size, "/".join(dtypes)


def _items(cfg: OmniConfig) -> list[tuple[str, Any]]:
    items = [("train", item) for item in cfg.reward.rewards]
    if cfg.reward.val_rewards is not None:
        items += [("validation", item) for item in cfg.reward.val_rewards]
    return items


def plan_rewards(cfg: OmniConfig) -> dict[str, Any]:
    """Each reward's networks and where they sit (module docstring): a JSON-able dict with the
    bytes added to one training device's peaks (`device_bytes`)."""
    from omni_rl.plugins import load_plugins
    from omni_rl.reward.registry import reward_declaration

    load_plugins(cfg.plugins)
    on_workers = cfg.reward.workers.num_workers > 0
    rows, device_bytes = [], 0
    for use, item in _items(cfg):
        options = dict(item.kwargs or {})
        declared = reward_declaration(item.name).device_networks
        networks = declared(**options) if declared is not None else []
        where = ("reward workers" if on_workers and use == "train"
                 else "host" if str(options.get("device", "auto")) == "cpu"
                 else "a training device")
        for source, module in networks:
            params, size, dtype = _network_bytes(module)
            on_device = where == "a training device"
            device_bytes += size if on_device else 0
            rows.append({"reward": item.name, "use": use, "network": source, "parameters": params, "bytes": size,
                         "dtype": dtype, "where": where, "on_training_device": on_device})
        if not networks:
            rows.append({"reward": item.name, "use": use, "network": None, "parameters": 0, "bytes": 0,
                         "dtype": None, "where": "no network on a device", "on_training_device": False})
    return {"models": rows, "device_bytes": device_bytes}


__all__ = ["plan_rewards"]
