"""The reward models of a plan: `plan_rewards(cfg)`.

Every configured reward (training and validation) whose declaration has `device_networks` builds
its networks on the meta device from configuration files alone (a hub id reads
`recipes/architectures/rewards/<org>--<name>/config.json`), counted in the dtypes its loading
gives them. On Ray reward workers or with `device: cpu` they are listed but not added to a
training device; otherwise they are added to the peaks of the device that scores (rank 0's, or
the Ray driver's). Rewards without a declaration hold nothing on a device.
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
    on_workers = cfg.reward.worker_options.num_workers > 0
    rows, device_bytes = [], 0
    for use, item in _items(cfg):
        options = dict(item.reward_options or {})
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
