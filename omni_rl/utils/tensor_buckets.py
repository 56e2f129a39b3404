"""Named tensors in buckets of bounded size: how weights travel (to a rollout engine, out of FSDP shards).

`named_buckets(tensors, bucket_bytes)` takes a dict or an iterable of `(name, tensor)` pairs
(a generator is consumed lazily, so tensors can be materialised one at a time, e.g. gathered
from shards) and yields dicts of at most `bucket_bytes` each; a larger tensor travels alone.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Union

import torch

NamedTensors = Union[Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]


def named_buckets(tensors: NamedTensors, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """Named tensors in dicts of at most `bucket_bytes` each (a larger tensor travels alone)."""
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = tensor
        size += nbytes
    if bucket:
        yield bucket
