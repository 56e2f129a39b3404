"""omni-rl's entry point: `python main_omni.py [recipe=NAME] [key=value ...]`.

With no recipe it runs the CPU demo, `omni_rl.cli.DEMO_RECIPE` (`recipes/tiny_sd3_shapes_counting.yaml`:
FlowGRPO teaches the tiny pretrained shape model to count). `--cfg` prints the composed config
instead of training; `--help` lists the recipes. The command line itself is `omni_rl.cli.main`.
"""
from omni_rl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
