"""Prompt datasets and the batch containers passed between trainer stages."""
