"""The project's own rewards, one module per reward family.

Importing this package registers them (`omni_rl.plugins` does so through its entry point); a new
reward module joins the import list below. Heavy packages are imported inside factories, so this
stays fast. Shared helpers register nothing and are imported by their users: `answer_extraction`,
`audio_inputs`, `clip_embedder`, `geneval_detector`, `edit_inputs`, `pretrained`, `transcripts`.
"""
from rewards import edit_pixels, image_stats, jpeg, video_stats  # noqa: F401  (imported to register)
from rewards import http_scorer, latent_http, vlm_edit_judge  # noqa: F401  (remote scorers over HTTP)
from rewards import latent_scorers  # noqa: F401  (what the reward server serves by name: latent_stats, ...)
from rewards import aesthetic, clap, clip_consistency, clip_directional, clip_score, geneval, hps, imagebind, ocr, pickscore, tiny_models  # noqa: F401  (model-based scorers: heavy imports inside factories)
from rewards import format, math_answer, multiple_choice, text_rules  # noqa: F401  (text rewards: answers, structure, CPU-demo rules)
from rewards import asr_wer, speaker_similarity, speech_rate  # noqa: F401  (speech: what was said, by whom, how fast)
