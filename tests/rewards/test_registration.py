"""A reward module registers by being in `rewards/`: `import rewards` imports every module, and
every module that is not a declared helper registers a reward."""
import rewards
from tests.registration import check_every_module_registers


def test_every_reward_module_registers_something():
    check_every_module_registers("rewards", rewards.HELPERS)
