# Sourced by the one-call device scripts (lean_device.sh, lean_branch_device.sh, q4_lanes_device.sh):
#   source "$(dirname "$0")/device_env.sh" DEFAULT_OUT
# OUT (default DEFAULT_OUT) created, the working directory set to the repository root, `stamp MSG` printing the
# seconds since this point, and the GPU's name, driver and clocks in $OUT/env.log.
set -u
OUT=${OUT:-$1}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/env.log" 2>&1
