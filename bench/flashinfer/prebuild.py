#!/usr/bin/env python3
"""Compile FlashInfer's JIT modules for the kvpack bench shapes ahead of time (no GPU needed, only nvcc).

FlashInfer 0.7.x JIT-compiles every kernel module on first use (nvcc, ninja). On the H200 machine that costs
device time, so this script builds the modules the baseline needs on any x86-64 machine with the same nvcc and
stores them where FlashInfer looks for ahead-of-time modules: <flashinfer>/data/aot/<name>/<name>.so (a module
found there is loaded instead of compiled; see flashinfer/jit/env.py get_aot_artifacts). The harness can still
JIT-compile on the device (--rebuild), from the sources kept in the repacked package.

usage: FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONPATH=<site with flashinfer + apache-tvm-ffi> \
         python3 bench/flashinfer/prebuild.py --out AOT_DIR [--groups 4,8] [--head-dim 128] [--page-size 16]
"""
import argparse
import os
import shutil
import sys
import time


def specs(groups, head_dim, page_size, which):
    import torch
    from flashinfer.jit.xqa import gen_xqa_module
    from flashinfer.jit.attention.modules import (_gen_batch_prefill_primary_module,
                                                  _gen_batch_prefill_independent_paged_module)
    out = []
    if "xqa" in which:
        for g in groups:
            # bf16 query, e4m3 cache, bf16 output, no sliding window, one query token per request
            out.append(gen_xqa_module(torch.bfloat16, torch.float8_e4m3fn, page_size, head_dim, g, False,
                                      torch.bfloat16, 1, False))
    # BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True), bf16 q + e4m3 kv: backend "auto" resolves to fa2
    # (FA3 needs an fp8 query for an fp8 cache), i.e. the batch-prefill module with these template arguments.
    args = ("fa2", torch.bfloat16, torch.float8_e4m3fn, torch.bfloat16, torch.int32, head_dim, head_dim, 0, False,
            False, False, False)
    if "fa2" in which:
        out.append(_gen_batch_prefill_primary_module(*args))
    if "fa2i" in which:
        out.append(_gen_batch_prefill_independent_paged_module(*args))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="AOT directory (copied to <flashinfer>/data/aot)")
    ap.add_argument("--groups", default="4,8", help="query heads per kv head of the bench shapes")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--which", default="xqa,fa2,fa2i")
    a = ap.parse_args()
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    groups = [int(x) for x in a.groups.split(",")]
    for spec in specs(groups, a.head_dim, a.page_size, a.which.split(",")):
        t0 = time.time()
        print(f"building {spec.name}", flush=True)
        spec.build(verbose=False)
        so = spec.jit_library_path
        dst = os.path.join(a.out, spec.name)
        os.makedirs(dst, exist_ok=True)
        shutil.copy2(so, os.path.join(dst, spec.name + ".so"))
        print(f"  {time.time() - t0:.0f} s, {os.path.getsize(so) / 2**20:.1f} MiB -> {dst}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
