"""The images the `draw` tool made, by id, for the `judge` tool and the trajectory's record.

A bounded, thread-safe store (the oldest images leave first): tools answer calls from several
trajectories at once. An id is `img-N`, what the model reads and passes back to `judge`.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Any, Optional

_LOCK = threading.Lock()
_IMAGES: "OrderedDict[str, tuple[Any, str]]" = OrderedDict()
_IDS = itertools.count(1)
# Images kept at most (tiny images are a few KB; a real model's 1024^2 RGB are 3 MB each).
CAPACITY = 256


def keep(image: Any, prompt: str) -> str:
    """Store an image and the prompt it was drawn from; return its id."""
    with _LOCK:
        key = f"img-{next(_IDS)}"
        _IMAGES[key] = (image, prompt)
        while len(_IMAGES) > CAPACITY:
            _IMAGES.popitem(last=False)
        return key


def find(key: str) -> Optional[tuple[Any, str]]:
    """(image, prompt) of an id, or None when it is unknown or has left the store."""
    with _LOCK:
        return _IMAGES.get(key)
