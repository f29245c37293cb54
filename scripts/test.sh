#!/usr/bin/env bash
# The test command of the README: the whole suite (unit + integration on tiny CPU models).
# pytest exits 5 when it collects no test: that is a failure here, never a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
export SANARL_CACHE="${SANARL_CACHE:-$(mktemp -d)}"
export HF_HUB_OFFLINE=1
# Test files go to one worker each (tests/conftest.py), on every core (SANARL_TEST_WORKERS=0 runs them in this
# process); each worker's torch and the CLI runs it starts use one thread, so the workers never fight over a core.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m pytest -q -n "${SANARL_TEST_WORKERS:-auto}" --dist loadgroup "$@"
code=$?
if [ "$code" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    exit 1
fi
exit "$code"
