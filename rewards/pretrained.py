"""Loading a reward's transformers model, processor or tokenizer from where the options say.

`load_pretrained(cls, source, what, reward)` is `cls.from_pretrained(...)` for one of three
kinds of `source`:

- `tiny:NAME`: a tiny random-weight model registered with `omni_rl.models.register_tiny_model`
  (e.g. `tiny:clip-reward`), built into the cache folder once (`resolve_source`);
- a local folder;
- a hub id, downloaded by transformers on first use.

When transformers cannot load it (`OSError`: no such folder, no network, a gated repo), the
error is raised again, chained, with a message that names the reward and its option (`what`)
and says how to fetch the weights to a folder. Used by the CLIP-based rewards, CLAP and
ImageBind (its tokenizer).

Not to be confused with `omni_rl.models.pretrained.load_pretrained`, which loads an adapter's
networks (with a dtype, or as a weightless skeleton).
"""
from __future__ import annotations

from typing import Any


def resolve_source(source: str, what: str) -> str:
    """`tiny:NAME` -> the folder of that tiny model (built once); anything else unchanged
    (a local folder or a hub id, handed to `from_pretrained`)."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"{what}={source!r}; expected a hub id, a local folder or tiny:NAME")
    if source.startswith("tiny:"):
        from omni_rl.models.loading import build_tiny_model

        return str(build_tiny_model(source[len("tiny:"):]))
    return source


def load_pretrained(cls: Any, source: str, what: str, reward: str) -> Any:
    """`cls.from_pretrained(source)` with an error that says how to get the weights."""
    try:
        return cls.from_pretrained(resolve_source(source, what))
    except OSError as err:
        raise OSError(
            f"{reward}: could not load {what}={source!r} with {cls.__name__}.from_pretrained ({err}). "
            f"Pass a local folder, or fetch it where the hub is reachable: "
            f"`hf download {source} --local-dir /models/{source.split('/')[-1]}` and set "
            f"{what}=/models/{source.split('/')[-1]}"
        ) from err
