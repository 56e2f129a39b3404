"""BAGEL (ByteDance-Seed/BAGEL-7B-MoT): the network (network.py, its packed sequence in layout.py),
the official checkpoint layout and FLUX's VAE (checkpoint.py), the SigLIP tower (vision.py), the
text-to-image adapter (adapter.py), the editing adapter (edit.py), the think-then-draw adapter (think.py) and `tiny:bagel` /
`tiny:bagel_edit` (tiny.py)."""
from adapters.bagel import adapter, edit, think, tiny  # noqa: F401
