"""Prompt datasets and the batch containers the trainer loop and the model families pass along.

`omni_rl.data.shapes` is the synthetic data of the GenEval-style demo: flat-shape scenes, their
caption grammar and matching (caption, scene) pairs.
"""
