#!/usr/bin/env bash
# The test command of the README: the whole suite (unit + integration on tiny CPU models).
# pytest exits 5 when it collects no test: that is a failure here, never a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
export SANARL_CACHE="${SANARL_CACHE:-$(mktemp -d)}"
export HF_HUB_OFFLINE=1
python -m pytest -q "$@"
code=$?
if [ "$code" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    exit 1
fi
exit "$code"
