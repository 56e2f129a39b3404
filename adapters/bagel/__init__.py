"""BAGEL (ByteDance-Seed/BAGEL-7B-MoT), text-to-image: the network (network.py), the official
checkpoint layout and FLUX's VAE (checkpoint.py), the adapter (adapter.py) and `tiny:bagel` (tiny.py)."""
from adapters.bagel import adapter, tiny  # noqa: F401
