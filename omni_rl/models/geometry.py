"""The run's geometry against the model's own configs, checked before the model loads.

`check_model_geometry(cfg)` reads the configs of a model on disk and applies the adapters' rules
and `omni_rl.models.limits`, reporting one `ConfigError` line. Left out: a model not on disk
yet (checked once built).
"""
from __future__ import annotations

from omni_rl.errors import ConfigError
from omni_rl.device import runs_on_cpu
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.models.limits import ComponentConfigs, check_step_memory, model_folder_on_disk
from omni_rl.models.registry import ADAPTERS, adapter_key


def check_model_geometry(cfg) -> None:
    """Before the model loads, when it is already on disk: the settings within what its configs
    say it can take (the adapter's `check_model_limits`: a diffusion model's size and frames, a
    talker's frames), and a diffusion step's memory with its latents (`config_latent_numel`,
    `check_step_memory`), as one `ConfigError` line. A model not on disk yet is checked as the
    trainer builds it (`check_loaded_limits`, `check_built_model`)."""
    adapter_class = ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage))
    folder = model_folder_on_disk(cfg.model)
    if folder is None:
        return
    configs = ComponentConfigs(folder)
    try:
        adapter_class.check_model_limits(cfg, configs)
        # The step's memory with its trajectories, where the configs give the latent's size.
        if issubclass(adapter_class, DiffusionModelBase):
            latent_numel = adapter_class.config_latent_numel(cfg, configs)
            if latent_numel is not None:
                check_step_memory(cfg, latent_numel, on_cpu=runs_on_cpu(cfg.trainer.device))
    except ValueError as err:  # the adapter's rules raise ValueError (they also run on a built model)
        raise ConfigError(str(err)) from None
