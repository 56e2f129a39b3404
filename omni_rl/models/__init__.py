"""Model adapter contracts, their registry, and model loading."""
from omni_rl.models.base import OmniModelBase
from omni_rl.models.conditioning import Conditioning
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.models.factory import build_model
from omni_rl.models.loading import MissingWeightsError, resolve_model_path
from omni_rl.models.think_draw import ThinkDrawModelBase
from omni_rl.models.speech import SpeechModelBase, SpeechSample
from omni_rl.models.registry import ADAPTERS, TINY_MODELS, register_adapter, register_tiny_model

__all__ = [
    "ADAPTERS", "TINY_MODELS", "Conditioning", "DiffusionModelBase", "MissingWeightsError",
    "OmniModelBase", "SpeechModelBase", "SpeechSample", "ThinkDrawModelBase", "build_model", "register_adapter", "register_tiny_model", "resolve_model_path",
]
