"""BAGEL (ByteDance-Seed/BAGEL-7B-MoT): the network (network.py, its packed sequence in layout.py),
the official checkpoint layout and FLUX's VAE (checkpoint.py), the SigLIP tower (vision.py), the
text-to-image adapter (adapter.py), the editing adapter (edit.py) and the think-then-draw adapter
(think.py). `tiny:bagel` / `tiny:bagel_edit` are in `adapters/tiny/bagel.py`, the planner's view in
`adapters/plan/bagel.py`."""
