"""A worker killed mid-step fails the run at once: exit code 1, one line naming it and the step."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


COMMON = ["trainer.logger_options.progress_bar=false", "trainer.loggers=[jsonl]", "trainer.val_every=0", "trainer.total_steps=3",
          "trainer.backend=ray", "trainer.engine=fsdp2", "trainer.backend_options.devices_per_node=2", "trainer.backend_options.worker_timeout_s=50"]
TEXT = ["recipe=tiny_qwen3_grpo", "trainer.micro_batch_size=8", "rollout.sampling_options.max_new_tokens=8"]
# Two chunks of 2 requests per worker: rank 1 dies in its first chunk while rank 0's are streaming back.
DIFFUSION = ["recipe=tiny_sd3_flowgrpo", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4",
             "trainer.mini_batch_size=8", "trainer.micro_batch_size=4", "rollout.max_num_seqs=2"]


# The text arm is `long` (CI time); the diffusion arm runs by default.
@pytest.mark.parametrize("recipe,program,named", [
    pytest.param(TEXT, "update_shard", "update", marks=pytest.mark.long),  # rank 0 is then blocked in a collective
    (DIFFUSION, "generate", "rollout"),   # rank 0 keeps sampling; the streamed rollout fails
], ids=["text-update", "diffusion-rollout"])
def test_killed_worker_exits_nonzero_naming_worker_and_step(tmp_path, recipe, program, named):
    env = dict(os.environ)
    # Rank 1 exits abruptly as it starts `program` in step 2.
    env["OMNI_RL_FAULT_INJECT"] = f"exit:1:2:{program}"
    cmd = [sys.executable, str(ROOT / "main_omni.py"), *recipe, *COMMON, f"trainer.output_dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    ended = time.time()
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "rank 1" in errors[0] and "pid" in errors[0] and "step 2" in errors[0] and named in errors[0], errors[0]
    # Step 1's metrics were written just before step 2 began: from then to the exit is the
    # rollout (and old log-probs) of step 2, the kill, and the shutdown.
    since_step1 = ended - (tmp_path / "run" / "metrics.jsonl").stat().st_mtime
    assert since_step1 < 60, since_step1
