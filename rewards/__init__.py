"""The project's own rewards, one module per reward family.

`import rewards` imports every module of this package (and of `rewards/imagebind/`), so a new
reward module registers itself (its factories decorated with `register_reward`) with no second
edit; `omni_rl.plugins.load_plugins()` does that through the `omni_rl.plugins` entry point.
Modules that need heavy packages (OCR engines, CLIP models) import them inside their
factories, so importing this package stays fast.

The helpers several rewards share register nothing and are listed in `HELPERS` (not imported
here; their users import them): `answer_extraction` (\\boxed{} and <answer> containers),
`audio_inputs` (the audio input contract), `clip_embedder` (CLIP towers), `geneval_detector`
(GenEval's Mask2Former and CLIP colour stage), `edit_inputs` (the source image of an image
edit, for the edit rewards), `pretrained` (loading from a hub id, a folder or tiny:NAME),
`transcripts` (text normalisation and WER/CER for the speech rewards), and ImageBind's network
and input pipeline. Audio resampling is in the core, `omni_rl.utils.audio`, so that adapters
may use it too.
"""
from omni_rl.plugins import import_package_modules

# tests/rewards/test_registration.py checks that these register nothing and every other module
# registers something.
HELPERS = (
    "answer_extraction", "audio_inputs", "clip_embedder", "edit_inputs", "geneval_detector", "pretrained",
    "transcripts", "imagebind.data", "imagebind.model",
)

import_package_modules(__name__, __path__, HELPERS)
