#!/usr/bin/env bash
# Prepares, on the development machine, what benchmarks/gpu_device_run.sh needs on a lent GPU
# machine (docs/gpu.md): wheels of the requirements it lacks (Python 3.12, x86-64) in .whl/ and the
# shared data sets the CUDA tests read in .gpu_carry/, both ignored by git. Then, with the device
# tool: run `CHECK_S=350 TEST_S=165 bash benchmarks/gpu_device_run.sh` with carry [".whl", ".gpu_carry"].
set -euo pipefail
cd "$(dirname "$0")/.."
for p in /.whl/ /.gpu_carry/; do grep -qx "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
mkdir -p .whl .gpu_carry
# Versions as the CPU build pins them today; the machine has torch 2.11, transformers 5.17, numpy,
# pandas, pyarrow, peft, accelerate, safetensors, pyyaml, requests, pytest(-xdist) already.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    tensordict==0.15.3 pyvers==0.2.3 torchdata==0.11.0 hydra-core==1.3.8 omegaconf==2.3.1 \
    math-verify==0.9.0 latex2sympy2_extended==1.11.0 pebble==5.2.3 cloudpickle==3.1.3
ls .whl/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 || python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl
for d in gsm8k hh_rlhf; do [ -d ".gpu_carry/$d" ] || cp -r "../shared/data/$d" .gpu_carry/; done
du -sh .whl .gpu_carry
