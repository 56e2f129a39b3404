"""Tiny random-weight models (`tiny:NAME`), one file per adapter: `adapters/tiny/<model>.py`
builds the models of `adapters/<model>.py` from configs with seeded weights; `decoders.py` makes
their random VAE decoders respond to the latents."""
