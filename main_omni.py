"""omni-rl's entry point: `python main_omni.py [recipe=NAME] [key=value ...]`.

With no arguments it runs the CPU demo (`recipes/tiny_sd3_flowgrpo.yaml`). `--cfg` prints the
composed config instead of training; `--help` lists the recipes.
"""
from omni_rl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
