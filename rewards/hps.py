"""HPS v2.1 (Human Preference Score v2, Wu et al. 2023): an open_clip ViT-H-14 fine-tuned on
human preferences between generated images.

    hpsv2 = cos(text_embedding(prompt), image_embedding(image))        (typically 0.2..0.35)

as HPSv2's own scorer computes it, with open_clip's validation preprocessing and its fixed
77-token context, so batching does not change a score. Options: `checkpoint` (a local state
dict, or None to download `HPS_v2.1_compressed.pt` from `xswu/HPSv2`; keys must match exactly),
`architecture` (an open_clip name, default `ViT-H-14`, or a model-config JSON), `device`.

Extra: `pip install open_clip_torch` (the `clip` extra).
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from omni_rl.device import pick_device
from omni_rl.reward import Images, check_batch, register_reward, to_pil_list

HPS_REPO = "xswu/HPSv2"
HPS_FILE = "HPS_v2.1_compressed.pt"


def _import_open_clip():
    try:
        import open_clip
    except ImportError as err:
        raise ImportError(
            f"the hpsv2 reward needs open_clip, which is not installed ({err}); install it with "
            f"`pip install open_clip_torch` (or `pip install -e .[clip]`)"
        ) from err
    return open_clip


def _model_name(open_clip: Any, architecture: str) -> str:
    """A name open_clip can build: a built-in one, or a config JSON registered under its stem."""
    path = Path(architecture).expanduser()
    if architecture.endswith(".json"):
        if not path.is_file():
            raise FileNotFoundError(f"hpsv2: architecture={architecture!r}: no such open_clip config file")
        open_clip.add_model_config(path)
        return path.stem
    if architecture not in open_clip.list_models():
        raise ValueError(
            f"hpsv2: architecture={architecture!r} is not an open_clip model; expected a built-in name such "
            f"as 'ViT-H-14' (HPS v2.1) or the path of an open_clip model-config .json file"
        )
    return architecture


def _checkpoint_path(checkpoint: str | None) -> Path:
    if checkpoint is not None:
        path = Path(checkpoint).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"hpsv2: checkpoint={checkpoint!r}: no such file; expected the HPS weights file")
        return path
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(HPS_REPO, HPS_FILE))
    except Exception as err:
        raise OSError(
            f"hpsv2: could not get {HPS_FILE} from the hub repo {HPS_REPO} ({type(err).__name__}: {err}). "
            f"Fetch it where the hub is reachable (`hf download {HPS_REPO} {HPS_FILE} --local-dir /models/hps`) "
            f"and pass checkpoint=/models/hps/{HPS_FILE}"
        ) from err


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def _without_random_init_message() -> Iterator[None]:
    """open_clip logs "No pretrained weights loaded ... initialized randomly" on the root logger
    when it builds a model: true at that moment, misleading here, where the weights are loaded
    next (the scorer) or never (the plan's weightless build)."""
    quiet = _DropMessage("No pretrained weights loaded")
    logging.getLogger().addFilter(quiet)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(quiet)


class HpsScorer:
    def __init__(self, checkpoint: str | None, architecture: str, device: str):
        open_clip = _import_open_clip()
        name = _model_name(open_clip, architecture)
        path = _checkpoint_path(checkpoint)
        self.device = pick_device(device)
        with _without_random_init_message():  # the HPS weights are loaded next
            model, _, self.preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"hpsv2: checkpoint {str(path)!r} does not match the open_clip model {name!r}: "
                f"{len(missing)} missing key(s) {missing[:5]}, {len(unexpected)} unexpected key(s) {unexpected[:5]}; "
                f"pass the architecture the checkpoint was trained with (HPS v2.1: ViT-H-14)"
            )
        self.model = model.to(self.device).eval()
        self.tokenizer = open_clip.get_tokenizer(name)

    @torch.no_grad()
    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        pixels = torch.stack([self.preprocess(image) for image in to_pil_list(images)]).to(self.device)
        image = self.model.encode_image(pixels, normalize=True).float()
        text = self.model.encode_text(self.tokenizer(list(prompts)).to(self.device), normalize=True).float()
        return (image * text).sum(dim=-1).cpu().tolist()


def _device_networks(*, architecture: str = "ViT-H-14", **_: Any) -> list[tuple[str, torch.nn.Module]]:
    """The open_clip model as the scorer builds it (no pretrained weights), on the meta device;
    fp32, as the HPS weights are loaded."""
    open_clip = _import_open_clip()
    name = _model_name(open_clip, architecture)
    # Built under the meta device so that nothing is allocated, and named `device="meta"` so that
    # open_clip's final move goes nowhere (from meta it cannot copy to the CPU).
    with _without_random_init_message(), torch.device("meta"):
        model = open_clip.create_model(name, pretrained=None, device="meta")
    return [(f"open_clip {name}", model)]


@register_reward("hpsv2", device_networks=_device_networks)
def hpsv2(*, checkpoint: str | None = None, architecture: str = "ViT-H-14", device: str = "auto") -> HpsScorer:
    """HPS v2.1: cosine of open_clip image and prompt features after HPS fine-tuning."""
    return HpsScorer(checkpoint, architecture, device)
