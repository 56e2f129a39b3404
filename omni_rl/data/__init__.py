"""Prompt datasets and the batch containers the trainer loop and the model families pass along."""
