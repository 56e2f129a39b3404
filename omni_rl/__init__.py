"""omni-rl: reinforcement-learning post-training for diffusion and omni-modal models.

Importing the package sets `OMP_WAIT_POLICY=PASSIVE` unless the environment already names a
policy: OpenMP threads then sleep between parallel regions instead of spinning, which keeps a
run near its fair share of a busy machine (docs/benchmarks.md, "Busy machines"). It takes effect
only where the OpenMP runtime has not started yet, so import omni_rl before torch; the command
line and every process the project starts do.
"""
import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
