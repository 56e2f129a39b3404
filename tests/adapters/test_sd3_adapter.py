"""The SD3 adapter (`StableDiffusion3Pipeline`) on the shared diffusion adapter suite (tests/adapters/diffusion_suite.py)."""
from diffusers import StableDiffusion3Pipeline

from tests.adapters.diffusion_suite import AdapterCase, DiffusionAdapterSuite, fresh_pipeline

SEQ = 16  # the tiny model has no T5 encoder: its text tokens are zero padding


def pipeline(model, fresh: bool):
    if not fresh:
        return model.pipeline
    # The tiny model has no T5 encoder; from_pretrained must be told that its slot is empty.
    return fresh_pipeline(StableDiffusion3Pipeline, model, text_encoder_3=None, tokenizer_3=None)


def pipeline_latents(pipe, prompt, latents, steps, guidance, case):
    return pipe(prompt=prompt, latents=latents, num_inference_steps=steps, guidance_scale=guidance,
                height=case.height, width=case.width, max_sequence_length=SEQ, output_type="latent").images


def load_lora(pipe, folder):
    pipe.load_lora_weights(folder)


class TestSD3(DiffusionAdapterSuite):
    case = AdapterCase(
        adapter="StableDiffusion3Pipeline", tiny="sd3", height=32, width=32, steps=4, guidance=4.5,
        model_options={"max_sequence_length": SEQ}, pipeline=pipeline, pipeline_latents=pipeline_latents,
        load_lora=load_lora,
    )
