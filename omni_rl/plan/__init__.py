"""`--plan`: what a recipe needs per device, worked out without weights or a GPU.

The recipe's networks are built on the meta device from configuration files alone (the shipped
`recipes/architectures/<org>--<name>/` of a hub id, a user's local snapshot, or a tiny model's
folder), through the adapter's own weightless build with the recipe's LoRA applied, and their
parameters are counted as the training engine will hold them on `trainer.backend_options.nnodes x
devices_per_node` ranks.

This first part covers the weights: parameters (frozen and trainable), gradients and AdamW state
per device, on the device and on the host (`memory.py`). Still to come (issue 26): the
fake-tensor trace of a rollout forward and a training micro-batch (activations, FLOPs), the
trajectories a step stores, reward models, and the verdict against a device kind.

- `architecture.py`: model.path -> the folder the plan builds from (or a one-line error);
- `memory.py`: per-rank bytes of weights, gradients and optimizer state;
- `weights.py`: the weightless build and the plan of its weights, as a table and `plan.json`.
"""
