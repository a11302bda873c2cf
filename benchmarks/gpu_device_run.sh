#!/usr/bin/env bash
# The whole check on a lent GPU machine (docs/gpu.md), run from the repository root there:
#   CHECK_S=350 TEST_S=165 bash benchmarks/gpu_device_run.sh
# Needs, carried beside the checkout (ignored by git, named in the device call's `carry`):
#   .whl/        wheels of hybridrl's requirements the machine lacks (docs/gpu.md lists them)
#   .gpu_carry/  data sets of ../shared/data the tests read (gsm8k/, hh_rlhf/): ../shared does not travel
# Writes into $OUT: report.json (benchmarks/gpu_check.py), gpu_check.log, pytest.log, junit.xml.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-$(mktemp -d)}
CHECK_S=${CHECK_S:-350}
TEST_S=${TEST_S:-165}
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD"
mkdir -p ../shared/data
for d in .gpu_carry/*/; do [ -d "../shared/data/$(basename "$d")" ] || cp -r "$d" ../shared/data/; done
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
timeout -k 5 "$CHECK_S" python3 benchmarks/gpu_check.py --device cuda --out "$OUT/report.json" \
    --budget-s $((CHECK_S - 25)) --profile "$OUT/profile_update.txt" 2>&1 | tee "$OUT/gpu_check.log" | grep -E '^\[|^step|Error|error' | tail -40
echo "gpu_check: exit ${PIPESTATUS[0]}"
timeout -k 5 "$TEST_S" python3 -m pytest --device cuda -m cuda -k "not smollm2" -q -n 8 -p no:cacheprovider --durations=10 \
    --junitxml="$OUT/junit.xml" -o junit_logging=no > "$OUT/pytest.log" 2>&1
echo "pytest: exit $?"
tail -45 "$OUT/pytest.log"
