#!/usr/bin/env bash
# Build the wheel and use it the way a user who does not develop sanarl would: installed into a fresh folder
# outside the checkout (dependencies from the current environment), run from an empty temporary directory:
# `sanarl --help`, `sanarl presets`, `sanarl validate --config tiny-shapes-nft sanarl.datasets.shapes` and a
# 2-step run of the embedded default. Offline: no build isolation, no dependency resolution.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
had_build="$([ -e build ] && echo yes || echo no)"
python -m pip wheel -q --no-deps --no-build-isolation . -w "$work/wheel"
[ "$had_build" = yes ] || rm -rf build  # the in-tree build's scratch folder
wheel="$(ls "$work"/wheel/sanarl-*.whl)"
echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
python -m pip install -q --no-deps --no-compile --target "$work/site" "$wheel"

export PYTHONPATH="$work/site" SANARL_CACHE="$work/cache" HF_HUB_OFFLINE=1
sanarl="$work/site/bin/sanarl"
mkdir "$work/cwd" && cd "$work/cwd"
where="$(python -c 'import sanarl; print(sanarl.__file__)')"
case "$where" in
    "$work/site/"*) ;;
    *) echo "the installed wheel is not the sanarl imported ($where)" >&2; exit 1 ;;
esac
case "$where" in "$repo"/*) echo "imported sanarl from the checkout" >&2; exit 1 ;; esac

help="$("$sanarl" --help)"
grep -q "sanarl presets" <<<"$help" || { echo "sanarl --help does not list sanarl presets" >&2; exit 1; }
listing="$("$sanarl" presets)"
for preset in "$repo"/sanarl/presets/*.toml; do
    name="$(basename "$preset" .toml)"
    grep -q "^$name " <<<"$listing" || { echo "sanarl presets does not list $name" >&2; exit 1; }
done
"$sanarl" validate --config tiny-shapes-nft sanarl.datasets.shapes | tail -1
"$sanarl" --config tiny-shapes-sft sanarl.datasets.shapes --set train.max_num_steps=2 \
    --set train.output_dir="$work/run" | tail -1
test -s "$work/run/metrics.jsonl"
[ "$(wc -l <"$work/run/metrics.jsonl")" -eq 2 ] || { echo "expected 2 steps in metrics.jsonl" >&2; exit 1; }
echo "wheel check: ok"
