"""`load_pretrained`: one module of a checkpoint, with its weights or as a weightless skeleton.

With weights it is `from_pretrained` on the host; with `weights=False` the module is built from
its config on the meta device (how the Ray driver holds a model). Diffusers and transformers alike.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from omni_rl.device import weightless_device


def is_diffusers_class(cls: type) -> bool:
    """diffusers' models carry ConfigMixin's `load_config`; transformers' do not."""
    return hasattr(cls, "load_config")


def load_pretrained(
    cls: Any, path: str, dtype: torch.dtype, subfolder: Optional[str] = None, weights: bool = True
) -> nn.Module:
    """The module of class `cls` stored at `path` (in `subfolder`), in `dtype`; on the meta device
    and without reading any weight file when `weights` is false."""
    diffusers = is_diffusers_class(cls)
    where = {"subfolder": subfolder} if subfolder else {}
    if weights:
        dtype_kw = {"torch_dtype": dtype} if diffusers else {"dtype": dtype}
        return cls.from_pretrained(path, **where, **dtype_kw)
    if diffusers:
        config = cls.load_config(path, **where)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, **where)
    # diffusers builds in the default dtype (casting afterwards makes it warn about fp32 modules);
    # transformers builds in the config's dtype, so its skeleton is cast (free on the meta device).
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with weightless_device():
            module = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    finally:
        torch.set_default_dtype(default)
    return module if diffusers else module.to(dtype)
