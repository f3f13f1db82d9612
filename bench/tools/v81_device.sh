#!/usr/bin/env bash
# One device call (bench/NOTES.md v81; run 2026-12-08 on an H100, not kept: the switch is gone from the source;
# apply bench/results/logs/v81_lean_qready_not_kept.patch to rerun): the q formats' lean warps wait for their
# own (sequence, kv head)'s query preparation through a ready counter in the workspace (KVPACK_LEAN_QREADY=1, a
# runtime switch, default 0) instead of griddepcontrol.wait on the whole preparation grid. The default build, the q
# formats' GPU tests with the switch on (random shapes vs fp64, bitwise identity across plans, graph replay,
# empty sequences, mixed grids, merge slices, group folding, the head_dim-64 instances), memcheck of two of them, then
# the A/B of the switch in one binary, 3 rounds. Files in $OUT: tests.log, sanitizer.log, ab_qready.json / .txt,
# log.txt.
#   LIMIT_S=330 bash bench/tools/v81_device.sh      (SKIP_TESTS=1: the A/B only)
source "$(dirname "$0")/device_env.sh" /tmp/v81_out /tmp/v81_work 330
build_device kvpack_cli kvpack_gpu_tests
T=./build-device/kvpack_gpu_tests
if [ -z "${SKIP_TESTS:-}" ]; then
gpu_tests tests 130 'DecodeGpu.RandomShapes*:DecodeGpu.Bitwise*:DecodeGpu.GraphCapture*:DecodeGpu.Empty*:DecodeGpu.Lean*' \
  KVPACK_TEST_FORMATS=q4,q3.5,q3 KVPACK_LEAN_QREADY=1
cp "$W/tests.log" "$OUT/"
KVPACK_LEAN_QREADY=1 sanitize_formats "$OUT/sanitizer.log" 45 'DecodeGpu.RandomShapesVsFp64Reference:DecodeGpu.GraphCapture*' q4
fi
GRID="--formats q4,q3.5,q3 --shapes 32/8/128,8/1/128 --batch 1,8,16,32 --context 32768,131072 --iters 20"
ab_env "$W/ab_qready" qready 3 KVPACK_LEAN_QREADY 0 1
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  echo "== tests (q4, q3.5, q3; KVPACK_LEAN_QREADY=1)"; test_outcomes "$OUT/tests.log"
  echo "== sanitizers"; grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|rc=|OK \]|FAILED" "$OUT/sanitizer.log" 2>/dev/null
  echo "== A/B ready counter"; cat "$OUT/ab_qready.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"
