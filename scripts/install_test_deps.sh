#!/usr/bin/env bash
# Install everything the test suite needs, as CI does (the first half of the README's test command):
# sanarl editable with the extras the tests import (test, service, rewards, ocr, geneval, vlm), the imagereward
# reward's packages (scripts/install_imagereward.sh) and the redis-server the reward service tests start.
#
# torch: on a machine without an NVIDIA GPU, the CPU builds of the pinned pair (torch 2.14.1+cpu satisfies the
# `==2.14.1` of constraints.txt) come from PyTorch's CPU index when it answers, so no CUDA libraries are
# installed; with a GPU, or when that index does not answer, pip's configured index serves the pin as before.
# `--plan` prints the commands instead of running them; SANARL_GPU=1|0 and SANARL_CPU_INDEX=up|down stand in for
# the two checks (tests/unit/test_install_script.py). TORCH_CPU_INDEX names another CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
plan=no
[ "${1:-}" = "--plan" ] && plan=yes

run() {  # a command, or its line with --plan
    if [ "$plan" = yes ]; then echo "+ $*"; else "$@"; fi
}

has_nvidia_gpu() {
    case "${SANARL_GPU:-}" in 1) return 0 ;; 0) return 1 ;; esac
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"
}

cpu_index_answers() {  # the index's torch page within 10 s
    case "${SANARL_CPU_INDEX:-}" in up) return 0 ;; down) return 1 ;; esac
    python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)' \
        "$TORCH_CPU_INDEX" >/dev/null 2>&1
}

if ! command -v redis-server >/dev/null || [ "$plan" = yes ]; then  # the reward service tests start a real one
    if [ "$(id -u)" -eq 0 ] || [ "$plan" = yes ]; then
        run apt-get update -qq && run apt-get install -y -qq redis-server
    else
        echo "redis-server is not on PATH: install it (e.g. sudo apt-get install -y redis-server) and rerun" >&2
        exit 1
    fi
fi
if ! has_nvidia_gpu && cpu_index_answers; then
    echo "torch: no NVIDIA GPU here: the CPU builds of the pinned pair from $TORCH_CPU_INDEX"
    run python -m pip install -q -c constraints.txt --index-url "$TORCH_CPU_INDEX" torch torchvision
else
    echo "torch: the pinned pair from pip's configured index"
fi
run python -m pip install -q -c constraints.txt -e ".[test,service,rewards,ocr,geneval,vlm]"
run bash scripts/install_imagereward.sh
