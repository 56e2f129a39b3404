import sys

from omni_rl.rollout.server.serve import main

sys.exit(main())
