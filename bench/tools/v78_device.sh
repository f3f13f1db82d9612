#!/usr/bin/env bash
# One device call (bench/NOTES.md v78; prepared 2026-12-07 without a GPU): where our fp8 loses to XQA on the H200.
# On the H100 our regular fp8 at 32q/8kv batch 32 x 128k took 3.15 ms (ncu, v74) against XQA's 2.70 ms; on the H200
# (v75) 2.82 ms against 1.97 ms: 1.12x faster than the H100 for 1.43x the bandwidth, and lean fp8 at 8q/1kv and q4
# stop near the same ~3 TB/s, while XQA reads 4.3 TB/s. This call takes ncu's sections that say whether a kernel is
# issue-bound (scheduler issue rate, instruction mix, warp stall reasons, memory throughput) for four launches:
#   our fp8 (regular kernel) 32q/8kv b=32 x 128k; our lean fp8 8q/1kv b=64 x 128k; our lean q4 32q/8kv b=32 x 128k;
#   FlashInfer-XQA fp8 32q/8kv b=32 x 128k (carry [".whl"]);
# then the source view (SASS, executed instructions and stall samples per instruction) of our regular fp8 launch,
# summarised by bench/tools/ncu_hot.py. Files in $OUT: ncu_<name>.txt, pipes_<name>.txt, hot_fp8_regular.txt, log.txt.
#   LIMIT_S=420 bash bench/tools/v78_device.sh
source "$(dirname "$0")/device_env.sh" /tmp/v78_out /tmp/v78_work 420
build_device kvpack_cli
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECS="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"
prof() {  # prof NAME KERNEL_REGEX "BENCH CELL"
  [ "$(left)" -gt 60 ] || return 0
  NCU_TIMEOUT=90 ncu_one "$OUT/ncu_$1.txt" "$2" "$3" $SECS
  stamp "ncu $1"
}
prof fp8_regular decode_kernel "--formats fp8 --shapes 32/8/128 --batch 32 --context 128k"
prof fp8_lean_8q1kv lean_kernel "--formats fp8 --shapes 8/1/128 --batch 64 --context 128k"
prof q4_lean lean_kernel "--formats q4 --shapes 32/8/128 --batch 32 --context 128k"
# Pipe utilisation and the per-opcode instruction counts (the sections' tables, printed with --print-details all):
# whether the conversion pipe (F2FP) or the integer ALU is near its peak in the two fp8 launches.
pipes() {  # pipes NAME KERNEL_REGEX "BENCH CELL"
  [ "$(left)" -gt 60 ] || return 0
  NCU_TIMEOUT=60 ncu_one "$OUT/pipes_$1.txt" "$2" "$3" --section ComputeWorkloadAnalysis --section InstructionStats \
    --print-details all
  stamp "pipes $1"
}
pipes fp8_regular decode_kernel "--formats fp8 --shapes 32/8/128 --batch 32 --context 128k"
pipes fp8_lean_8q1kv lean_kernel "--formats fp8 --shapes 8/1/128 --batch 64 --context 128k"
if [ "$(left)" -gt 120 ] && fi_site; then
  PYTHONPATH=/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/fiws timeout 100 $ncu --kernel-name regex:'kernel_mha|xqa|mha' \
    --launch-skip 2 --launch-count 1 --clock-control none $SECS python3 bench/flashinfer/fi_bench.py \
    --impls xqa --shapes 32/8/128 --batch 32 --context 131072 --iters 2 --no-graph --no-check --no-probe \
    --out "$W/xqa.json" 2>&1 | grep -vE "^==PROF==|^\s*$" > "$OUT/ncu_xqa.txt"
  stamp "ncu xqa"
fi
if [ "$(left)" -gt 90 ]; then
  timeout $(( $(left) - 30 )) $ncu --kernel-name regex:decode_kernel --launch-skip 3 --launch-count 1 --clock-control none \
    --section SourceCounters --section WarpStateStats --import-source yes -f -o "$W/fp8_regular" ./build-device/kvpack bench --formats fp8 \
    --shapes 32/8/128 --batch 32 --context 128k --iters 5 --eager > "$W/src.log" 2>&1
  $ncu --import "$W/fp8_regular.ncu-rep" --page source --csv --print-source sass > "$W/src.csv" 2>/dev/null
  python3 bench/tools/ncu_hot.py "$W/src.csv" 40 > "$OUT/hot_fp8_regular.txt" 2>&1
  stamp "source view"
fi
{ cat "$OUT/env.log"; rm -f "$OUT/env.log"
  for f in "$OUT"/ncu_*.txt; do
    echo "== $(basename "$f" .txt)"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Executed Ipc|Grid Size|Block Size|Registers Per|Achieved Occupancy|L2 Hit|Mem Busy|Max Bandwidth" "$f"
  done
  for f in "$OUT"/pipes_*.txt; do echo "== $(basename "$f" .txt)"; grep -iE "pipe|F2FP|I2F|F2F|LOP3|PRMT|HMMA|SHF|IMAD" "$f" | head -40; done
  echo "== hot (fp8 regular)"; head -60 "$OUT/hot_fp8_regular.txt" 2>/dev/null; } > "$OUT/log.txt"
rm -f "$OUT/build.log"
stamp "done"
