"""The docs' before/after picture of a talker run: each validation sample's waveform at the first
validation (step 0, the untrained talker) beside the same sample at the run's last validation.

    python -m demos.talker_before_after --run outputs/tiny_qwen3_omni_talker_grpo --out docs/talker_before_after.png

Validation speaks the same answers (fixed seeds) greedily at every step
(`omni_rl/families/talker.py`), so each row is one answer spoken by the talker before and after
training. It reads what the run wrote, `samples/val_step_NNNNNN/samples.jsonl` and the WAVs beside
it, and titles each waveform with its RMS (what `audio_loudness` rewards) and its reward. The
tiny talker's clips are a few milliseconds long (8 samples a frame at 24 kHz): they are drawn,
not meant to be heard.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

from omni_rl.data.chat_prompts import read_wav
from omni_rl.errors import OmniConfigError


def validation_steps(run: Path) -> list[Path]:
    folders = sorted(p for p in (run / "samples").glob("val_step_*") if (p / "samples.jsonl").is_file())
    if len(folders) < 2:
        raise SystemExit(f"error: {run / 'samples'} has {len(folders)} validation folder(s) with samples.jsonl; "
                         f"expected at least 2 (run with trainer.val_every > 0: step 0 is validated first)")
    return folders


def load_samples(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        path = folder / row["wav"]
        try:
            row["audio"], row["rate"] = read_wav(path.read_bytes(), str(path))
        except OmniConfigError as err:
            raise SystemExit(f"error: {err}") from None
    return rows


def draw(before: list[dict], after: list[dict], steps: tuple[str, str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from omni_rl.utils.atomic import atomic_write_bytes

    rows = min(len(before), len(after))
    fig, axes = plt.subplots(rows, 2, figsize=(9, 1.6 * rows + 0.6), sharey=True, squeeze=False)
    for i in range(rows):
        for j, (sample, step) in enumerate(zip((before[i], after[i]), steps)):
            ax = axes[i, j]
            audio, rate = sample["audio"], sample["rate"]
            ms = np.arange(len(audio)) / rate * 1000.0
            ax.plot(ms, audio, color="grey" if j == 0 else "tab:blue", linewidth=1.0)
            rms = float(np.sqrt(np.mean(audio ** 2))) if len(audio) else 0.0
            ax.set_title(f"{step}: RMS {rms:.3f}, reward {sample['reward']:.3f}", fontsize=8)
            ax.set_ylim(-1.05, 1.05)
            ax.tick_params(labelsize=7)
            if j == 0:
                # The tiny thinker writes random bytes: escaped, so any font draws them.
                text = sample["spoken_text"][:14].encode("ascii", "backslashreplace").decode()
                ax.set_ylabel(repr(text), fontsize=6)
            if i == rows - 1:
                ax.set_xlabel("ms", fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    atomic_write_bytes(out, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a talker run's output folder")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    folders = validation_steps(args.run)
    first, last = folders[0], folders[-1]
    before, after = load_samples(first), load_samples(last)
    if [r["spoken_text"] for r in before] != [r["spoken_text"] for r in after]:
        print(f"note: {first.name} and {last.name} spoke different answers (the thinker trained too)",
              file=sys.stderr)
    draw(before, after, (f"step {int(first.name[-6:])}", f"step {int(last.name[-6:])}"), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
