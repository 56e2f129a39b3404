"""The project's own rewards, one module per reward family.

Importing this package registers them (each module decorates its factories with
`register_reward`); `omni_rl.plugins.load_plugins()` does that through the `omni_rl.plugins`
entry point. A new reward module is added to the import list below. Modules that need heavy
packages (OCR engines, CLIP models) import them inside their factories, so importing this
package stays fast.

The helpers several rewards share register nothing and are not listed; each has a file of its
own, which its users import: `answer_extraction` (\\boxed{} and <answer> containers),
`audio_inputs` (the audio input contract), `clip_embedder` (CLIP towers), `geneval_detector`
(GenEval's Mask2Former and CLIP colour stage), `edit_inputs` (the
source image of an image edit, for the edit rewards), `pretrained`
(loading from a hub id, a folder or tiny:NAME), `transcripts` (text normalisation and WER/CER
for the speech rewards). Audio resampling is in the core,
`omni_rl.utils.audio`, so that adapters may use it too.
"""
from rewards import edit_pixels, image_stats, jpeg, video_stats  # noqa: F401  (imported to register)
from rewards import http_scorer, latent_http, vlm_edit_judge  # noqa: F401  (remote scorers over HTTP)
from rewards import latent_scorers  # noqa: F401  (what the reward server serves by name: latent_stats, ...)
from rewards import aesthetic, clap, clip_consistency, clip_directional, clip_score, geneval, hps, imagebind, ocr, pickscore, tiny_models  # noqa: F401  (model-based scorers: heavy imports inside factories)
from rewards import format, math_answer, multiple_choice, text_rules  # noqa: F401  (text rewards: answers, structure, CPU-demo rules)
from rewards import asr_wer, speaker_similarity, speech_rate  # noqa: F401  (speech: what was said, by whom, how fast)
