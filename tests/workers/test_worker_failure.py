"""A worker killed mid-step fails the run at once: exit code 1, one line naming it and the step."""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_killed_worker_exits_nonzero_naming_worker_and_step(tmp_path):
    env = dict(os.environ)
    # Rank 1 exits abruptly as it starts step 2's update (rank 0 is then blocked in a collective).
    env["OMNI_RL_FAULT_INJECT"] = "exit:1:2:update_shard"
    cmd = [
        sys.executable, str(ROOT / "main_omni.py"), "recipe=tiny_qwen3_grpo", "trainer.progress_bar=false",
        "trainer.loggers=[jsonl]", "trainer.val_every=0", "trainer.total_steps=3", "trainer.micro_batch_size=8",
        "rollout.max_new_tokens=8", f"trainer.output_dir={tmp_path / 'run'}", "trainer.backend=ray",
        "trainer.engine=fsdp2", "trainer.devices_per_node=2", "trainer.worker_timeout_s=50",
    ]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    ended = time.time()
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "rank 1" in errors[0] and "pid" in errors[0] and "step 2" in errors[0] and "update" in errors[0]
    # Step 1's metrics were written just before step 2 began: from then to the exit is the
    # rollout and old log-probs of step 2, the kill, and the shutdown.
    since_step1 = ended - (tmp_path / "run" / "metrics.jsonl").stat().st_mtime
    assert since_step1 < 60, since_step1
