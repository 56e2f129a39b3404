"""Config schema (dataclasses), composition (Hydra) and validation of values.

The layer imports nothing above it. `omni_rl.compose.load_config` is what runs a job: it calls
`compose_config` and then checks the names of registered components.
"""
from omni_rl.config.loader import available_recipes, compose_config, to_yaml
from omni_rl.config.schema import OmniConfig
from omni_rl.config.validate import validate_config

__all__ = ["OmniConfig", "available_recipes", "compose_config", "to_yaml", "validate_config"]
