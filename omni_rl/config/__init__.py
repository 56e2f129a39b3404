"""Config schema (dataclasses), loading (Hydra) and validation."""
from omni_rl.config.loader import available_recipes, load_config, to_yaml
from omni_rl.config.schema import OmniConfig
from omni_rl.config.validate import ConfigError, validate_config

__all__ = ["ConfigError", "OmniConfig", "available_recipes", "load_config", "to_yaml", "validate_config"]
