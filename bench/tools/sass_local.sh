#!/usr/bin/env bash
# SASS of one decode translation unit without a GPU: compile it for sm_90a here and disassemble it with nvdisasm
# from the PyPI wheel (the local CUDA toolkit has nvcc and ptxas, not cuobjdump/nvdisasm). Prints ptxas' register
# and spill summary per kernel, then for the kernel matching KERNEL (a regex on the mangled name, default q4,
# head_dim 128, 4 heads, two CTAs per SM) the size of each warp-pipeline step (instructions between mbarrier waits)
# and the instruction mix of the first chunk's steps.
#   bash bench/tools/sass_local.sh [q4|q35|q3|fp8|bf16|int4|int4h] [KERNEL regex]
# (static counts: cold paths such as zero fills are included; SASS_OUT=dir keeps the outputs apart; NVCC_FLAGS adds
# compiler options, e.g. -DKVPACK_EXP_FIXED4=1)
set -eu
fmt=${1:-q4}
kernel=${2:-'Li128ELi4ELi2EEEvNS0_18DecodeKernelParams'}
root=${SRC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}  # SRC_ROOT: another tree, e.g. a base to compare with
tools=${SASS_TOOLS:-/tmp/kvpack_sass_tools}
out=${SASS_OUT:-/tmp/kvpack_sass}
mkdir -p "$tools" "$out"
if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
  (cd "$tools" && pip download --quiet --no-deps nvidia-cuda-nvdisasm && python3 -m zipfile -e nvidia_cuda_nvdisasm-*.whl . &&
   chmod +x nvidia/cu13/bin/nvdisasm)
fi
nvcc -std=c++20 --expt-relaxed-constexpr -lineinfo -O3 -I "$root/include" -I "$root/src" -DFMT_USE_CONSTEXPR=1 \
  -DKVPACK_HAVE_CUDA=1 ${NVCC_FLAGS:-} -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -cubin -o "$out/$fmt.cubin" \
  "$root/src/cuda/decode_$fmt.cu" 2>&1 | grep -A2 "Compiling entry.*decode_kernel" | grep -E "entry|spill" |
  paste - - | sed -E 's/.*decode_kernelINS0_[0-9]*([A-Za-z0-9]+)[^L]*(Li[0-9]+ELi[0-9]+ELi[0-9]+).*for .sm_90a.[ \t]*/\1 \2 /'
"$tools/nvidia/cu13/bin/nvdisasm" -c -g "$out/$fmt.cubin" > "$out/$fmt.sass"
python3 - "$out/$fmt.sass" "$kernel" <<'PY'
import collections, re, sys
text, pat = open(sys.argv[1]).read().split('\n'), re.compile(sys.argv[2])
ins, on = [], False
for ln in text:
    if ln.startswith('.text.') and ln.endswith(':') and pat.search(ln):
        on = True
        print('kernel:', ln[6:-1])
        continue
    if on and ln.startswith('\t.section'):
        break
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', ln)
    if on and m: ins.append((int(m.group(1), 16), m.group(2).strip()))
waits = [i for i, (_, t) in enumerate(ins) if 'SYNCS.PHASECHK' in t]
print(f'{len(ins)} instructions; steps (instructions between mbarrier waits):', [b - a for a, b in zip(waits, waits[1:])][:16])
if len(waits) > 8:
    ops = collections.Counter(re.sub(r'^@!?U?P\w+\s+', '', t).split()[0].split('.')[0] for _, t in ins[waits[0]:waits[8]])
    print('mix of the first 8 steps:', ops.most_common(16))
PY
