"""`counting_encoded_tokens`: how many real tokens a rollout's forwards encode, per row, on a test's
own adapter instance (the prefix a multi-turn engine reuses is not encoded again)."""
from contextlib import contextmanager

import torch


@contextmanager
def counting_encoded_tokens(model):
    """Within the block, every `model.forward_logits` call adds its rows' real (unpadded) new
    tokens to the list it yields; the sum over calls is `torch.stack(counts).sum(0)`."""
    counts: list[torch.Tensor] = []
    forward = model.forward_logits

    def counting(input_ids, attention_mask, *args, **kwargs):
        counts.append(attention_mask[:, -input_ids.shape[1]:].sum(1))
        return forward(input_ids, attention_mask, *args, **kwargs)

    model.forward_logits = counting
    try:
        yield counts
    finally:
        model.forward_logits = forward
