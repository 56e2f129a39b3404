"""`Protocol`: everything that decides a benchmark's number besides the model, pinned and recorded.

It holds the sampling fields, `samples_per_prompt`, `seed` (sample k of row i comes from
`sample_seed(i, k)`) and the scorers; two results are compared only when their protocols are
equal (`differences`).

    protocol.with_overrides(["num_steps=4", "geneval.detector=tiny:x"])
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import yaml

from omni_rl.errors import OmniConfigError
from omni_rl.utils.seeding import derive_seed

_SAMPLING = ("num_steps", "guidance_scale", "height", "width", "num_frames", "fps", "temperature", "top_p",
             "max_new_tokens", "speech_temperature", "max_frames")


class ProtocolError(OmniConfigError):
    """A protocol override that names no field, or a value of the wrong kind."""


@dataclass(frozen=True)
class ScorerSpec:
    """One reward that scores a benchmark's samples: its registered name and options."""

    reward: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    video_frames: Optional[int] = None

    def as_reward_spec(self) -> dict[str, Any]:
        return {"name": self.reward, "weight": 1.0, "kwargs": dict(self.kwargs), "video_frames": self.video_frames}

    def to_dict(self) -> dict[str, Any]:
        # video_frames only where set, so results of image benchmarks read as they always have.
        out: dict[str, Any] = {"reward": self.reward, "kwargs": dict(self.kwargs)}
        if self.video_frames is not None:
            out["video_frames"] = self.video_frames
        return out


@dataclass(frozen=True)
class Protocol:
    samples_per_prompt: int
    seed: int = 0
    num_steps: Optional[int] = None
    guidance_scale: Optional[float] = None
    height: Optional[int] = None
    width: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_new_tokens: Optional[int] = None
    num_frames: Optional[int] = None
    fps: Optional[float] = None
    speech_temperature: Optional[float] = None
    max_frames: Optional[int] = None
    scorers: tuple[ScorerSpec, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if isinstance(self.samples_per_prompt, bool) or not isinstance(self.samples_per_prompt, int) \
                or self.samples_per_prompt < 1:
            raise ProtocolError(f"samples_per_prompt={self.samples_per_prompt!r}: expected an int >= 1")
        for name in ("num_steps", "height", "width", "max_new_tokens", "num_frames", "max_frames"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ProtocolError(f"{name}={value!r}: expected an int >= 1 (or null: the recipe's)")
        for name in ("guidance_scale", "temperature", "top_p", "fps", "speech_temperature"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and 0 <= value < float("inf")):
                raise ProtocolError(f"{name}={value!r}: expected a finite number >= 0 (or null: the recipe's)")

    def sample_seed(self, prompt_index: int, sample_index: int) -> int:
        """The seed of sample `sample_index` of the prompt in row `prompt_index` of the file."""
        return derive_seed(self.seed, "eval", prompt_index, sample_index)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "scorers"}
        out["scorers"] = [s.to_dict() for s in self.scorers]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Protocol":
        raw = dict(raw)
        scorers = tuple(ScorerSpec(s["reward"], tuple(sorted(s.get("kwargs", {}).items())), s.get("video_frames"))
                        for s in raw.pop("scorers", []))
        return cls(**raw, scorers=scorers)

    def filled(self, sampling: dict[str, Any]) -> "Protocol":
        """This protocol with the fields it leaves open (None) taken from `sampling` (the recipe's)."""
        return dataclasses.replace(self, **{k: v for k, v in sampling.items() if getattr(self, k) is None})

    def with_overrides(self, overrides: Sequence[str]) -> "Protocol":
        """`key=value` changes (YAML values): a sampling field, `samples_per_prompt`, `seed`, or
        `<reward>.<option>` for a scorer's option."""
        changes: dict[str, Any] = {}
        scorers = {s.reward: dict(s.kwargs) for s in self.scorers}
        fields_ = {f.name for f in dataclasses.fields(self)} - {"scorers"}
        for item in overrides:
            key, sep, text = item.partition("=")
            if not sep or not key:
                raise ProtocolError(f"--protocol {item!r}: expected key=value, e.g. num_steps=40")
            value = yaml.safe_load(text)
            if key in fields_:
                changes[key] = value
            elif "." in key and key.split(".", 1)[0] in scorers:
                reward, option = key.split(".", 1)
                scorers[reward][option] = value
            else:
                raise ProtocolError(
                    f"--protocol {item!r}: {key!r} is no protocol field; expected one of {sorted(fields_)} or "
                    f"<scorer>.<option> for a scorer of this benchmark ({', '.join(sorted(scorers)) or 'none'})")
        frames = {s.reward: s.video_frames for s in self.scorers}
        changes["scorers"] = tuple(ScorerSpec(name, tuple(sorted(kw.items())), frames[name]) for name, kw in scorers.items())
        return dataclasses.replace(self, **changes)


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Each field where two protocols (as `to_dict` writes them) differ, as "key: A vs B"."""
    out = []
    for key in sorted(set(a) | set(b)):
        if json.dumps(a.get(key), sort_keys=True) != json.dumps(b.get(key), sort_keys=True):
            out.append(f"{key}: {json.dumps(a.get(key), sort_keys=True)} vs {json.dumps(b.get(key), sort_keys=True)}")
    return out


SAMPLING_FIELDS = _SAMPLING
