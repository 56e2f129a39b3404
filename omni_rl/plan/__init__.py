"""`--plan`: what a recipe needs per device, worked out without weights or a GPU.

The recipe's networks are built on the meta device from configuration files alone (through the
adapter's own weightless build, or its `PlanSpec` where the folder lacks tokenizers or encoder
configs), their parameters counted as the training engine will hold them per rank, one rollout
forward and one training micro-batch traced on fake tensors, and the peaks judged against a
device kind. Modules: `architecture` (model.path -> folder), `spec`, `memory`, `weights`,
`trace`, `steps`, `devices`, `planner`; docs/plan.md shows a plan.

Not counted: FSDP2's gathered blocks and communication buffers, fragmentation, the device context.
"""
