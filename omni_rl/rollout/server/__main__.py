"""`python -m omni_rl.rollout.server`. Guarded: vLLM starts its workers with `spawn`, whose
children import the parent's main module again (as `__mp_main__`), and must not serve there."""
import sys

from omni_rl.rollout.server.serve import main

if __name__ == "__main__":
    sys.exit(main())
