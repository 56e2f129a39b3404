"""omni-rl: reinforcement-learning post-training for diffusion and omni-modal models.

Importing the package sets `OMP_WAIT_POLICY=PASSIVE` unless the environment names a policy, so
idle OpenMP threads sleep on a busy machine (docs/benchmarks.md, "Busy machines"); import
omni_rl before torch for it to take effect.
"""
import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
