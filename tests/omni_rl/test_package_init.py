"""`import omni_rl` names an OpenMP wait policy for the runtime that starts after it, and keeps the
user's own."""
import os
import subprocess
import sys

PRINT_POLICY = "import omni_rl, os; print(os.environ['OMP_WAIT_POLICY'])"


def _policy_in_child(env_policy):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    out = subprocess.run([sys.executable, "-c", PRINT_POLICY], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_sets_a_passive_wait_policy_when_none_is_named():
    assert _policy_in_child(None) == "PASSIVE"


def test_the_users_wait_policy_wins():
    assert _policy_in_child("ACTIVE") == "ACTIVE"
