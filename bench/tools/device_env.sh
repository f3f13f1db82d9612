# Sourced by the one-call device scripts (lean_device.sh, lean_branch_device.sh, q4_lanes_device.sh, lean_tune_device.sh):
#   source "$(dirname "$0")/device_env.sh" DEFAULT_OUT
# OUT (default DEFAULT_OUT) created, the working directory set to the repository root, `stamp MSG` printing the
# seconds since this point, `build_device TARGET...` (below), and the GPU's name, driver and clocks in $OUT/env.log.
set -u
OUT=${OUT:-$1}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/env.log" 2>&1
# build_device TARGET...: configure and build the GPU-only tree (build-device, sm_90a) into $OUT/build.log; prints
# the errors and exits the calling script when the build fails.
build_device() {
  { cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPACK_GPU_ONLY=ON -DKVPACK_CUDA_ARCHS=90a-real \
      && cmake --build build-device -j16 --target "$@"; } > "$OUT/build.log" 2>&1
  local rc=$?
  stamp "build rc=$rc"; grep -E "error" -A3 "$OUT/build.log" | head -30
  [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
}
