#!/usr/bin/env bash
# The test command: configure, build, run the CPU test suite (GPU tests carry the label `gpu` and are excluded;
# on a GPU machine run `ctest --test-dir build -L gpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
export KVPACK_MODEL=${KVPACK_MODEL:-$PWD/models/smollm2-135m-instruct.gguf}
ctest --test-dir build -LE gpu --output-on-failure -j"$(nproc)"
