#!/usr/bin/env bash
# SASS of the lean decode kernel without a GPU (bench/NOTES.md v41, v42): compile src/cuda/decode_lean.cu for sm_90a
# here, disassemble it with nvdisasm from the PyPI wheel, and print for each lean_kernel instance its registers /
# spills and the static size and instruction mix of its main loop (the innermost backward branch around the
# cp.async wait, DEPBAR.LE): the per-32-token-step work of one warp. inst: LeanInst (0 general, 1 leaf-only, 2
# warp-only).
#   bash bench/tools/sass_lean.sh            (SRC_ROOT=another tree compares; NVCC_FLAGS adds options)
set -eu
root=${SRC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
tools=${SASS_TOOLS:-/tmp/kvpack_sass_tools}
out=${SASS_OUT:-/tmp/kvpack_sass_lean}
mkdir -p "$tools" "$out"
if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
  (cd "$tools" && pip download --quiet --no-deps nvidia-cuda-nvdisasm && for w in nvidia_cuda_nvdisasm-*.whl; do
     python3 -m zipfile -e "$w" .; done && chmod +x nvidia/cu13/bin/nvdisasm)
fi
nvcc -std=c++20 --expt-relaxed-constexpr -O3 -I "$root/include" -I "$root/src" -DFMT_USE_CONSTEXPR=1 \
  -DKVPACK_HAVE_CUDA=1 ${NVCC_FLAGS:-} -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -cubin -o "$out/lean.cubin" \
  "$root/src/cuda/decode_lean.cu" > "$out/ptxas.log" 2>&1 || { cat "$out/ptxas.log"; exit 1; }
grep -A3 "Compiling entry.*lean_kernel" "$out/ptxas.log" | grep -E "entry|registers|spill" |
  sed -E 's/.*lean_kernelILi([0-9]+)ELi([0-9]+)ELNS0_8LeanInstE([0-9])E.*/lean_kernel<\1,\2,inst \3>/; s/ptxas info *: //; s/^ +//' | paste - - - | cut -c1-160
"$tools/nvidia/cu13/bin/nvdisasm" -c "$out/lean.cubin" > "$out/lean.sass"
python3 - "$out/lean.sass" <<'PY'
import collections, re, sys
text = open(sys.argv[1]).read().split('\n')
kern, ins, labels = None, {}, {}
for ln in text:
    m = re.match(r'(\.L_x_\d+):$', ln)
    if m and kern:
        labels[kern][m.group(1)] = len(ins[kern])
        continue
    m = re.match(r'\.text\.(\S+):$', ln)
    if m:
        kern = m.group(1) if 'lean_kernel' in m.group(1) else None
        if kern: ins[kern], labels[kern] = [], {}
        continue
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', ln)
    if kern and m: ins[kern].append((int(m.group(1), 16), m.group(2).strip()))
for k, L in ins.items():
    name = re.sub(r'.*lean_kernelILi(\d+)ELi(\d+)ELNS0_8LeanInstE(\d)E.*', r'lean_kernel<\1,\2,inst \3>', k)
    waits = [i for i, (_, t) in enumerate(L) if re.search(r'DEPBAR\.LE SB0, 0x[1-9]', t)]
    best = None
    for i, (a, t) in enumerate(L):
        m = re.search(r'BRA[^`]*`\((\.L_x_\d+)\)', t)
        if not m: continue
        tgt = labels[k].get(m.group(1))
        if tgt is None or tgt >= i: continue
        if any(tgt <= w <= i for w in waits) and (best is None or i - tgt < best[1] - best[0]): best = (tgt, i)
    if not best:
        print(name, len(L), 'instructions; main loop not found'); continue
    body = L[best[0]:best[1] + 1]
    ops = collections.Counter(re.sub(r'^@!?U?P\w+\s+', '', t).split()[0].split('.')[0] for _, t in body)
    print(f'{name}: {len(L)} instructions, main loop {len(body)} (predicated {sum(t.startswith("@") for _, t in body)})')
    print('  ', ' '.join(f'{o} {n}' for o, n in ops.most_common(22)))
PY
