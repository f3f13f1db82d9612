#!/usr/bin/env bash
# Fetch FlashInfer for the H200 device machine (which reaches no package registry), repack it small, and build its
# decode modules ahead of time. Run on an x86-64 machine with network, python3 and nvcc 13.0 (the device's nvcc
# version), from the repository root:
#     bash bench/flashinfer/fetch_flashinfer.sh            # -> .whl/ (ignored by git; carry it: carry=[".whl"])
# Env: FI_VERSION (0.7.4), TVM_FFI_VERSION (0.1.15.post2), DEST (.whl), WORK (/tmp/kvpack_fi_fetch), JOBS (2),
# PREBUILD (1; 0: no prebuilt modules, no torch needed here, the device JIT-compiles them).
#
# What the device lacks (docs/PERFORMANCE.md, section "FlashInfer baseline"): flashinfer-python
# itself and apache-tvm-ffi (its kernel-module ABI). Everything else `import flashinfer` and the two decode paths use
# is in the device image (torch, numpy, nvidia-ml-py, einops, requests, tqdm, tabulate, packaging, ninja, filelock,
# jinja2, cuda-bindings). Not carried, and not needed by these paths: nvidia-cutlass-dsl, nvidia-cudnn-frontend,
# cuda-tile, nccl4py, nccl-extensions (imported lazily by other backends).
#
# The flashinfer wheel is 101 MB (715 MB unpacked). The repack keeps:
#   - every Python file of the package and its small non-source files (json, csv, txt, md), the dist-info;
#   - from data/: csrc/xqa/ (XQA), the top-level csrc headers, Jinja templates, batch_prefill* / batch_decode*
#     sources and the XQA binding (the fa2 decode path JIT-generates its kernels from these), include/ (FlashInfer's
#     headers) and cccl/ (the CCCL headers FlashInfer puts ahead of the toolkit's);
#   - data/aot/<module>/<module>.so: the modules prebuilt here (flashinfer loads a module found there instead of
#     compiling it; bench/flashinfer/prebuild.py).
# and drops: data/cutlass, data/spdlog, every other csrc/ subfolder and source (GEMM, MoE, comm, MLA, Blackwell
# kernels...), the CUDA sources beside the Python code of the "cake_*" backends, experimental kernels' sources.
# The modules are then rebuilt from the repacked tree in a fresh cache: the proof that the kept sources suffice
# for a JIT build on the device (fi_bench.py --rebuild) and the source of the shipped prebuilt modules.
set -euo pipefail
FI_VERSION=${FI_VERSION:-0.7.4}
TVM_FFI_VERSION=${TVM_FFI_VERSION:-0.1.15.post2}
DEST=${DEST:-.whl}
WORK=${WORK:-/tmp/kvpack_fi_fetch}
JOBS=${JOBS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$DEST" "$WORK"/dl "$WORK"/dl-local
# The prebuild imports flashinfer on this machine: these must be importable here (pip install them).
# PREBUILD=0 skips it (no torch needed here): the tarball then carries sources only, and the device JIT-compiles
# the decode modules on first use with its own nvcc (device time: minutes, counted in the flashinfer step).
PREBUILD=${PREBUILD:-1}
if [ "$PREBUILD" != 0 ]; then
  missing=""
  for m in torch numpy packaging ninja jinja2 requests; do $PY -c "import $m" 2>/dev/null || missing+=" $m"; done
  [ -z "$missing" ] || { echo "error: fetch_flashinfer.sh needs these Python modules here:$missing" \
    "(pip install them; or PREBUILD=0 to skip the prebuild, which needs torch)" >&2; exit 1; }
fi
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

stamp "download"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  --platform any -d "$WORK"/dl "flashinfer-python==$FI_VERSION"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d "$DEST" "apache-tvm-ffi==$TVM_FFI_VERSION"
WHEEL=$(ls "$WORK"/dl/flashinfer_python-"$FI_VERSION"-*.whl)

stamp "unpack and repack $(basename "$WHEEL") ($(du -m "$WHEEL" | cut -f1) MB)"
rm -rf "$WORK"/full "$WORK"/stage "$WORK"/local "$WORK"/ws "$WORK"/aot
mkdir -p "$WORK"/full "$WORK"/stage "$WORK"/local
(cd "$WORK"/full && unzip -q "$WHEEL")
if [ "$PREBUILD" != 0 ]; then  # the prebuild imports flashinfer here: tvm-ffi for this machine's python, and
  # the modules the device has but this machine may lack, into $WORK/local
  $PY -m pip download -q --no-deps --only-binary=:all: -d "$WORK"/dl-local "apache-tvm-ffi==$TVM_FFI_VERSION"
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$WORK"/local "$WORK"/dl-local/apache_tvm_ffi-*.whl
  for m in pynvml:nvidia-ml-py einops:einops tabulate:tabulate tqdm:tqdm filelock:filelock; do
    $PY -c "import ${m%%:*}" 2>/dev/null || { $PY -m pip download -q --no-deps -d "$WORK"/dl-local "${m#*:}" &&
      $PY -m pip install -q --no-index --no-deps --no-compile --target "$WORK"/local "$WORK"/dl-local/"$(echo "${m#*:}" | tr - _)"-*.whl; }
  done
fi
$PY - "$WORK"/full "$WORK"/stage <<'EOF'
import os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
drop_ext = {".cu", ".cuh", ".h", ".hpp", ".c", ".cc", ".cpp", ".so", ".cubin", ".a", ".o", ".ptx"}
kept = dropped = 0
def keep_data(rel):
    p = rel.split("/")
    if p[1] in ("include", "cccl"):
        return True
    if p[1] != "csrc":
        return p[1] in ("build_utils.py", "build_backend.py")
    if len(p) > 3:
        return p[2] == "xqa"
    name = p[2]
    return (name.endswith((".jinja", ".h", ".cuh", ".inc")) or name.startswith(("batch_prefill", "batch_decode"))
            or name == "flashinfer_xqa_binding.cu")
for root, dirs, files in os.walk(src):
    for f in files:
        full = os.path.join(root, f)
        rel = os.path.relpath(full, src)
        top = rel.split("/")[0]
        if top.endswith(".dist-info"):
            ok = True
        elif top != "flashinfer":
            ok = False  # b12x/, build_backend.py at the wheel root: not imported
        elif rel.startswith("flashinfer/data/"):
            ok = keep_data(rel[len("flashinfer/"):])
        else:
            ok = os.path.splitext(f)[1] not in drop_ext
        if ok:
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(full, os.path.join(dst, rel))
            kept += os.path.getsize(full)
        else:
            dropped += os.path.getsize(full)
print(f"kept {kept / 2**20:.1f} MiB, dropped {dropped / 2**20:.1f} MiB (unpacked)")
EOF

if [ "$PREBUILD" = 0 ]; then
  stamp "PREBUILD=0: no prebuilt modules; the device JIT-compiles them on first use"
else
  stamp "JIT-build the decode modules from the repacked tree (fresh cache; sm_90a; $JOBS jobs)"
  FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE="$WORK"/ws MAX_JOBS=$JOBS \
    PATH=/usr/local/cuda/bin:$PATH PYTHONPATH="$WORK"/stage:"$WORK"/local \
    nice -n 10 $PY "$HERE"/prebuild.py --out "$WORK"/stage/flashinfer/data/aot --which xqa,fa2 --groups 4,8
fi

stamp "tar"
OUTTAR="$DEST"/flashinfer-"$FI_VERSION"-kvpack.tar.xz
(cd "$WORK"/stage && tar -cf - flashinfer flashinfer_python-"$FI_VERSION".dist-info) | xz -T"$JOBS" -6 > "$OUTTAR"
ls -la "$DEST"
du -ch "$DEST"/* | tail -1
stamp "done: carry '$DEST' (the device step 'flashinfer' of bench/run_device.sh installs it into /tmp/site)"
