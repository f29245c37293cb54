#!/usr/bin/env bash
# Install everything the test suite needs, as CI does (the first half of the README's test command):
# sanarl editable with the extras the tests import (test, service, rewards, ocr, geneval, vlm), image-reward and
# fairscale without their pins, and the redis-server the reward service tests start.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! command -v redis-server >/dev/null; then  # the reward service tests start a real redis-server
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq && apt-get install -y -qq redis-server
    else
        echo "redis-server is not on PATH: install it (e.g. sudo apt-get install -y redis-server) and rerun" >&2
        exit 1
    fi
fi
python -m pip install -q -c constraints.txt -e ".[test,service,rewards,ocr,geneval,vlm]"
# image-reward's own pins (timm 0.6.13, old diffusers) would break the stack: install it and fairscale without deps
python -m pip install -q -c constraints.txt --no-deps image-reward==1.5
python -m pip install -q -c constraints.txt --no-deps --no-build-isolation fairscale==0.4.13
