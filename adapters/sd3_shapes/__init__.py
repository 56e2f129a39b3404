"""The tiny SD3 that draws shapes, pretrained by omni-rl (`adapters/sd3_shapes/pretrain.py`)."""
