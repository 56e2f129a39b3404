"""`--plan`: what a recipe needs per device, worked out without weights or a GPU.

The recipe's networks are built on the meta device from configuration files alone (the shipped
`recipes/architectures/<org>--<name>/` of a hub id, a user's local snapshot, or a tiny model's
folder), through the adapter's own weightless build with the recipe's LoRA applied, or, where the
folder lacks what that build reads (tokenizers, encoder configs), the adapter's trained network(s)
alone through its `PlanSpec`. Their parameters are counted as the training engine will hold them
on `trainer.backend_options.nnodes x devices_per_node` ranks, one rollout forward and one
training micro-batch are traced on fake tensors, and the peaks are judged against a device kind.

- `architecture.py`: model.path -> the folder the plan builds from (or a one-line error);
- `spec.py`: what an adapter tells the planner (`PlanSpec`, the `PLAN_SPECS` registry);
- `memory.py`: per-rank bytes of weights, gradients and optimizer state;
- `weights.py`: the weightless build and the plan of its weights;
- `trace.py`: a forward (+ backward) on fake tensors: FLOPs and peak live bytes;
- `steps.py`: the rollout and training traces of a recipe and a step's FLOPs;
- `devices.py`: device kinds (memory, peak bf16 throughput, with sources);
- `planner.py`: the whole plan, the verdict and the knobs re-planned, the table and plan.json.

Not counted anywhere: reward models, the driver process, FSDP2's all-gathered blocks and
communication buffers, allocator fragmentation, the CUDA/NPU context.
"""
