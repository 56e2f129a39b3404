"""`--plan`: what a recipe needs per device, worked out without weights or a GPU.

Networks are built on the meta device from configs, their parameters counted per rank, one
rollout forward and one training micro-batch traced on fake tensors, and the peaks judged
against a device kind; docs/plan.md shows a plan. Not counted: FSDP2's gathered blocks and
communication buffers, fragmentation, the device context.
"""
