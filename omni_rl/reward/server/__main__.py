"""`python -m omni_rl.reward.server`: the command line (`omni_rl.reward.server.serve`)."""
import sys

from omni_rl.reward.server.serve import main

if __name__ == "__main__":
    sys.exit(main())
