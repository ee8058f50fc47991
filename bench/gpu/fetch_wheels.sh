#!/usr/bin/env bash
# Fill .whl/ (git-ignored; carried to the GPU machine) with the wheels of bench/gpu/wheels.txt at
# the versions of uv.lock for CPython 3.12 on manylinux x86-64, and copy the `small` preset's
# tokenizer files into .whl/tokenizer/ (the GPU run builds its random Qwen3-0.6B-shaped model
# with it; building the preset there would need its reasoning-gym corpus and minutes).
# Run from the repository root on this machine: bash bench/gpu/fetch_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
pins=$(uv export --no-dev --no-hashes --no-emit-project 2>/dev/null | grep -E '^[A-Za-z0-9_.-]+==' |
       grep -vE "python_full_version < '3.12'" | sed 's/ *;.*//')
missing=0
while read -r name; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  pin=$(echo "$pins" | grep -iE "^${name//-/[-_]}==" | head -1 || true)
  if [[ -z "$pin" ]]; then echo "no pin for $name in uv.lock" >&2; missing=1; continue; fi
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$pin" ||
    python3 -m pip wheel -q --no-deps -w .whl "$pin" ||  # sdist only (cellpylib): build it here
    { echo "no wheel for $pin" >&2; missing=1; }
done < bench/gpu/wheels.txt
# A wheel built here from an sdist for another CPython (pycosat is a C extension) would make the
# device's pip refuse the whole install: keep its sdist instead (run_all.sh tries to build it).
for w in .whl/*-cp3*-linux_x86_64.whl; do
  [[ -e "$w" && "$w" != *cp312* ]] || continue
  pin=$(basename "$w" | cut -d- -f1,2 | sed 's/-/==/'); rm -f "$w"
  python3 -m pip download -q --no-deps --no-binary=:all: -d .whl/sdist "$pin" || missing=1
done
tok_src="${RLHF_LAB_CACHE:-$HOME/.cache/rlhf-lab}/models/small-v2"
if [[ ! -f "$tok_src/tokenizer.json" ]]; then
  uv run python -c "from trainers.core.tiny import ensure_preset; ensure_preset('small')"
fi
mkdir -p .whl/tokenizer
for f in "$tok_src"/*; do
  case "$(basename "$f")" in
    model.safetensors|config.json|generation_config.json|build_info.json) ;;
    *) cp "$f" .whl/tokenizer/ ;;
  esac
done
echo "wheels: $(ls .whl/*.whl | wc -l) files, $(du -sh .whl | cut -f1) in .whl (tokenizer included)"
exit $missing
