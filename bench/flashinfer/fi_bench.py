#!/usr/bin/env python3
"""FlashInfer fp8 (e4m3) paged decode measured side by side with kvpack, on the grid of `kvpack bench`.

Optional baseline harness (not part of the product). It needs torch and flashinfer (0.7.x) importable, and for the
correctness check kvpack's C ABI (build target kvpack_capi: <build>/libkvpack_capi.so). Two FlashInfer paths:

  flashinfer-xqa  flashinfer.decode.trtllm_batch_decode_with_kv_cache(..., backend="xqa"): TensorRT-LLM's XQA
                  kernel; on Hopper with an e4m3 cache it runs the SM90 wgmma kernel (mha_sm90.cu).
  flashinfer      BatchDecodeWithPagedKVCacheWrapper(kv_layout="HND", use_tensor_cores=True) planned with
                  q_data_type=bf16, kv_data_type=float8_e4m3fn (backend "auto" resolves to fa2 on Hopper for a bf16
                  query: FA3 needs an fp8 query for an fp8 cache).

Both read the same pools as kvpack's fp8 format: one K and one V pool [num_pages][num_kv_heads][page_size][head_dim]
of e4m3 bytes (FlashInfer's HND layout, passed as the tuple (k_cache, v_cache)), bf16 query and output, page size
16, the same page tables (block table / CSR over pages in a shuffled order) and full-length sequences.

Timing is the method of `kvpack bench` (src/cuda/bench_harness.cu): for every (shape, batch, context) R distinct
page sets of one large pool are visited in turn (R = ceil(4 x L2 / bytes), 1..64, so L2 cannot serve them); one
sample is the time of R launches between two CUDA events divided by R; the row reports the median of --iters
samples. By default the R launches are captured once in a CUDA graph and the graph is replayed (Python launch
overhead excluded; kvpack launches from C++); --no-graph launches them eagerly. PDL is off (each kernel alone).
Bytes are those of kvpack's fp8 rows: 2 x batch x context x kv_heads x head_dim (K and V codes, 1 byte each).

Rows go into the same JSON as `kvpack bench --json` (same run_id, gpu and read_bw_tbs), with "impl" set to
"flashinfer-xqa" or "flashinfer" and "format": "fp8"; kvpack decode rows get speedup_vs_flashinfer_xqa /
speedup_vs_flashinfer (FlashInfer median / kvpack median) where a FlashInfer row of the same shape, batch and
context exists.

usage: python3 bench/flashinfer/fi_bench.py --kvpack-json OUT/bench.json --capi build-device/libkvpack_capi.so \
           --out OUT/bench.json [--impls xqa,fa2] [--shapes 32/8/128] [--batch 8] [--context 32k] [--rebuild]
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback

IMPL_NAMES = {"xqa": "flashinfer-xqa", "fa2": "flashinfer"}


def log(*a):
    print(*a, flush=True)


def parse_list(s, kind=int):
    out = []
    for x in str(s).split(","):
        x = x.strip()
        if not x:
            continue
        mul = 1
        if x[-1] in "kK":
            mul, x = 1024, x[:-1]
        out.append(kind(x) * mul)
    return out


def parse_shapes(s):
    return [tuple(int(v) for v in x.split("/")) for x in s.split(",") if x]


# ---------------------------------------------------------------------------------------------------------------
# kvpack C ABI (src/capi/kvpack_capi.cu)

class KvpackCapi:
    def __init__(self, path):
        L = ctypes.CDLL(path)
        u64, i64, i32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int
        L.kvpack_capi_last_error.restype = ctypes.c_char_p
        L.kvpack_capi_version.restype = ctypes.c_char_p
        L.kvpack_capi_plan_decode.restype = ctypes.c_void_p
        L.kvpack_capi_plan_decode.argtypes = [ctypes.c_char_p, i32, i32, i32, i32, i32, i64]
        L.kvpack_capi_plan_free.argtypes = [ctypes.c_void_p]
        L.kvpack_capi_plan_workspace_bytes.restype = i64
        L.kvpack_capi_plan_workspace_bytes.argtypes = [ctypes.c_void_p]
        L.kvpack_capi_plan_info.argtypes = [ctypes.c_void_p, ctypes.POINTER(i32), ctypes.POINTER(i32)]
        L.kvpack_capi_run_decode.restype = i32
        L.kvpack_capi_run_decode.argtypes = [ctypes.c_void_p, u64, u64, u64, i64, u64, u64, i32, u64, u64,
                                             ctypes.c_float, u64, u64, u64, u64, u64]
        self.L = L
        self.version = L.kvpack_capi_version().decode()

    def err(self):
        return self.L.kvpack_capi_last_error().decode()

    def plan(self, fmt, qo, kv, d, page, batch, max_context):
        p = self.L.kvpack_capi_plan_decode(fmt.encode(), qo, kv, d, page, batch, max_context)
        if not p:
            raise RuntimeError("kvpack plan: " + self.err())
        splits, stages = ctypes.c_int(0), ctypes.c_int(0)
        self.L.kvpack_capi_plan_info(p, ctypes.byref(splits), ctypes.byref(stages))
        return p, self.L.kvpack_capi_plan_workspace_bytes(p), splits.value, stages.value

    def run(self, plan, q, k_pool, v_pool, num_pages, block_table, seq_lens, k_scale, v_scale, out, workspace,
            status, stream, sm_scale=0.0):
        ptr = lambda t: 0 if t is None else t.data_ptr()
        rc = self.L.kvpack_capi_run_decode(plan, ptr(q), ptr(k_pool), ptr(v_pool), num_pages, ptr(block_table),
                                           ptr(seq_lens), block_table.shape[1], ptr(k_scale), ptr(v_scale),
                                           sm_scale, ptr(out), 0, ptr(workspace), ptr(status), stream)
        if rc != 0:
            raise RuntimeError("kvpack run_decode: " + self.err())


# ---------------------------------------------------------------------------------------------------------------
# FlashInfer paths

class FiXqa:
    """trtllm_batch_decode_with_kv_cache(backend="xqa") over (k_cache, v_cache) in HND."""
    name = "xqa"

    def __init__(self, torch, fi, ws_bytes=256 << 20):
        self.torch, self.fi = torch, fi
        self.ws = torch.zeros(ws_bytes, dtype=torch.uint8, device="cuda")

    def prepare(self, k, v, block_tables, seq_lens, qo, kv, d, page, k_scale=1.0, v_scale=1.0):
        """One launchable per page table (list of block tables); returns a callable launch(r, q, out)."""
        sm_scale = 1.0 / math.sqrt(d)
        max_seq_len = block_tables[0].shape[1] * page
        dec = self.fi.decode

        def launch(r, q, out):
            dec.trtllm_batch_decode_with_kv_cache(
                q, (k, v), self.ws, block_tables[r], seq_lens, max_seq_len, bmm1_scale=k_scale * sm_scale,
                bmm2_scale=v_scale, out=out, kv_layout="HND", enable_pdl=False, backend="xqa")
        return launch


class FiFa2:
    """BatchDecodeWithPagedKVCacheWrapper(HND, use_tensor_cores=True), one planned wrapper per page table."""
    name = "fa2"

    def __init__(self, torch, fi, ws_bytes=512 << 20):
        self.torch, self.fi = torch, fi
        self.ws = torch.zeros(ws_bytes, dtype=torch.uint8, device="cuda")
        self.backend = None

    def prepare(self, k, v, block_tables, seq_lens, qo, kv, d, page, k_scale=1.0, v_scale=None):
        torch = self.torch
        wrappers = []
        for bt in block_tables:
            b, npp = bt.shape
            lens = seq_lens.to(torch.int64)
            pages_used = (lens + page - 1) // page
            indptr = torch.zeros(b + 1, dtype=torch.int32, device="cuda")
            indptr[1:] = torch.cumsum(pages_used, 0).to(torch.int32)
            col = torch.arange(npp, device="cuda").unsqueeze(0)
            indices = bt[col < pages_used.unsqueeze(1)].to(torch.int32).contiguous()
            last = (lens - (pages_used - 1) * page).to(torch.int32)
            w = self.fi.BatchDecodeWithPagedKVCacheWrapper(self.ws, "HND", use_tensor_cores=True)
            w.plan(indptr, indices, last, qo, kv, d, page, q_data_type=torch.bfloat16,
                   kv_data_type=torch.float8_e4m3fn)
            wrappers.append(w)
        try:
            self.backend = wrappers[0].resolved_backend
        except Exception:  # older versions
            self.backend = getattr(wrappers[0], "_backend", None)

        def launch(r, q, out):
            wrappers[r].run(q, (k, v), k_scale=k_scale, v_scale=v_scale, out=out, enable_pdl=False)
        launch.wrappers = wrappers
        return launch


# ---------------------------------------------------------------------------------------------------------------

def fill_fp8(torch, t, gen, scale=1.0, chunk=1 << 28):
    """Random e4m3 codes of N(0, scale^2) values (torch's saturating round-to-nearest cast)."""
    flat = t.view(-1)
    for s in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - s)
        x = torch.randn(n, device="cuda", dtype=torch.float32, generator=gen)
        if scale != 1.0:
            x *= scale
        flat[s:s + n] = x.to(torch.float8_e4m3fn)
        del x


def time_launches(torch, launch, rot, q, out, iters, use_graph):
    """Median / min per-launch microseconds over `iters` samples of `rot` launches (kvpack bench's method)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for r in range(rot):  # warm-up: module load, kernel attributes, lazily built state
            launch(r, q, out)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    mode = "events"
    graph = None
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for r in range(rot):
                    launch(r, q, out)
            graph.replay()
            torch.cuda.synchronize()
            mode = "cuda_graph"
        except Exception as e:  # report and fall back to eager launches
            log(f"    graph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); eager launches")
            graph = None
            torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for _ in range(iters):
        a.record()
        if graph is not None:
            graph.replay()
        else:
            for r in range(rot):
                launch(r, q, out)
        b.record()
        b.synchronize()
        us.append(a.elapsed_time(b) * 1e3 / rot)
    del graph
    us.sort()
    return us[len(us) // 2], us[0], mode


def ref_decode(torch, q, kc, vc, bt, lens, page, k_scale, v_scale):
    """fp32 attention of one query per sequence over the dequantised cache. q: [b, qo, d] bf16."""
    b, qo, d = q.shape
    kv = kc.shape[1]
    g = qo // kv
    out = torch.empty(b, qo, d, dtype=torch.float32, device=q.device)
    for i in range(b):
        L = int(lens[i])
        pages = bt[i, :(L + page - 1) // page].long()
        K = (kc[pages].float() * k_scale).permute(1, 0, 2, 3).reshape(kv, -1, d)[:, :L]  # [kv, L, d]
        V = (vc[pages].float() * v_scale).permute(1, 0, 2, 3).reshape(kv, -1, d)[:, :L]
        qq = q[i].float().view(kv, g, d)
        s = torch.einsum("hgd,hld->hgl", qq, K) / math.sqrt(d)
        p = torch.softmax(s, dim=-1)
        out[i] = torch.einsum("hgl,hld->hgd", p, V).reshape(qo, d)
    return out


def check(torch, fi, capi, impls, shapes, page, tol_frac, seed=7, probe=True):
    """Same q / cache / page table through kvpack fp8, FlashInfer XQA and FlashInfer fa2, against fp32 torch."""
    results = []
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ok_all = True
    for (qo, kv, d) in shapes:
        lens = [8192 + 5, 1000, 16, 3333, 1, 4096]
        b = len(lens)
        max_len = max(lens)
        npp = (max_len + page - 1) // page
        num_pages = b * npp + 37
        k_scale, v_scale = 0.5, 2.0
        kc = torch.empty(num_pages, kv, page, d, dtype=torch.float8_e4m3fn, device="cuda")
        vc = torch.empty_like(kc)
        fill_fp8(torch, kc, gen, 1.5)
        fill_fp8(torch, vc, gen, 0.5)
        perm = torch.randperm(num_pages, device="cuda", generator=gen).to(torch.int32)
        bt = perm[:b * npp].view(b, npp).contiguous()
        seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
        q = (torch.randn(b, qo, d, device="cuda", generator=gen) * 2.0).to(torch.bfloat16)
        ref = ref_decode(torch, q, kc, vc, bt, lens, page, k_scale, v_scale)
        refmax = ref.abs().max().item()
        outs = {}
        if capi is not None:
            plan, wsb, splits, stages = capi.plan("fp8", qo, kv, d, page, b, max_len)
            ws = torch.zeros(max(wsb, 16), dtype=torch.uint8, device="cuda")
            status = torch.zeros(1, dtype=torch.int32, device="cuda")
            ks = torch.full((kv,), k_scale, dtype=torch.float32, device="cuda")
            vs = torch.full((kv,), v_scale, dtype=torch.float32, device="cuda")
            o = torch.empty_like(q)
            capi.run(plan, q, kc, vc, num_pages, bt, seq, ks, vs, o, ws, status,
                     torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            capi.L.kvpack_capi_plan_free(plan)
            st = int(status.item())
            if st != 0:
                log(f"  kvpack status {st}")
            outs["kvpack-fp8"] = o
        for impl in impls:
            o = torch.empty_like(q)
            try:
                launch = impl.prepare(kc, vc, [bt], seq, qo, kv, d, page, k_scale, v_scale)
                launch(0, q, o)
                torch.cuda.synchronize()
                outs[IMPL_NAMES[impl.name]] = o
            except Exception as e:
                log(f"  {IMPL_NAMES[impl.name]} failed in the check: {type(e).__name__}: {e}")
                traceback.print_exc()
                ok_all = False
        log(f"check {qo}q/{kv}kv/{d}: batch {b}, lengths {lens}, k_scale {k_scale}, v_scale {v_scale}, "
            f"max|ref| {refmax:.4f}, tolerance max|diff| <= {tol_frac:g} x max|ref| = {tol_frac * refmax:.4f}")
        for name, o in outs.items():
            diff = (o.float() - ref).abs()
            mx, rms = diff.max().item(), diff.pow(2).mean().sqrt().item()
            ok = bool(torch.isfinite(o.float()).all().item()) and mx <= tol_frac * refmax
            ok_all &= ok
            row = {"shape": f"{qo}/{kv}/{d}", "impl": name, "max_abs_diff": mx, "rms_diff": rms, "max_abs_ref": refmax,
                   "rel_max_diff": mx / refmax, "pass": ok}
            if "kvpack-fp8" in outs and name != "kvpack-fp8":
                row["max_abs_diff_vs_kvpack"] = (o.float() - outs["kvpack-fp8"].float()).abs().max().item()
            results.append(row)
            extra = (f", vs kvpack max|diff| {row['max_abs_diff_vs_kvpack']:.5f}"
                     if "max_abs_diff_vs_kvpack" in row else "")
            log(f"  {name:<15} max|diff| {mx:.5f} ({mx / refmax:.2%} of max|ref|), rms {rms:.5f}{extra}: "
                f"{'ok' if ok else 'FAIL'}")
        if probe and (qo, kv, d) == shapes[0]:
            results.append(probe_trtllm_gen(torch, fi, q, kc, vc, bt, seq, page, k_scale, v_scale))
        del kc, vc
        torch.cuda.empty_cache()
    return ok_all, results


def probe_trtllm_gen(torch, fi, q, kc, vc, bt, seq, page, k_scale, v_scale):
    """trtllm_batch_decode_with_kv_cache(backend="trtllm-gen") once, downloads refused (FLASHINFER_NO_DOWNLOAD):
    its kernels are NVIDIA cubins fetched at first use, for Blackwell. Logged only (no rows)."""
    old = os.environ.get("FLASHINFER_NO_DOWNLOAD")
    os.environ["FLASHINFER_NO_DOWNLOAD"] = "1"
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    try:
        fi.decode.trtllm_batch_decode_with_kv_cache(
            q, (kc, vc), ws, bt, seq, bt.shape[1] * page, bmm1_scale=k_scale / math.sqrt(q.shape[-1]),
            bmm2_scale=v_scale, out=torch.empty_like(q), kv_layout="HND", enable_pdl=False, backend="trtllm-gen")
        torch.cuda.synchronize()
        msg = "ran (not timed: trtllm-gen is FlashInfer's Blackwell path)"
    except Exception as e:
        msg = f"not runnable here: {type(e).__name__}: {str(e).strip()[:600]}"
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
    finally:
        if old is None:
            os.environ.pop("FLASHINFER_NO_DOWNLOAD", None)
        else:
            os.environ["FLASHINFER_NO_DOWNLOAD"] = old
    log(f"  trtllm-gen probe: {msg}")
    return {"impl": "flashinfer-trtllm-gen", "probe": msg}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvpack-json", help="rows of `kvpack bench --json` (run_id, gpu, read_bw_tbs, grid)")
    ap.add_argument("--out", help="merged JSON (kvpack rows + FlashInfer rows); may be the --kvpack-json file")
    ap.add_argument("--capi", help="libkvpack_capi.so (correctness check against kvpack's fp8 path)")
    ap.add_argument("--impls", default="xqa,fa2", help="xqa (flashinfer-xqa) and/or fa2 (flashinfer)")
    ap.add_argument("--shapes", help="QO/KV/D list; default: the fp8 decode rows of --kvpack-json, else both")
    ap.add_argument("--batch", help="batch list; default as --shapes")
    ap.add_argument("--context", help="context list (8k = 8192); default as --shapes")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-graph", action="store_true", help="eager launches instead of a replayed CUDA graph")
    ap.add_argument("--rebuild", action="store_true",
                    help="ignore the prebuilt modules in flashinfer/data/aot and JIT-compile here with nvcc")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--no-probe", action="store_true",
                    help="skip the one trtllm-gen call (downloads refused) whose outcome the log records")
    ap.add_argument("--tol", type=float, default=2.0 ** -4, help="check: max|diff| <= tol x max|ref|")
    ap.add_argument("--time-kvpack", action="store_true",
                    help="also time kvpack fp8 through the C ABI with this harness's method (log + row field)")
    a = ap.parse_args()

    import torch
    t_import = time.time()
    if a.rebuild:
        import flashinfer.jit.env as jit_env
        jit_env.get_aot_artifacts = lambda name: ()  # every module through nvcc on this machine
    import flashinfer
    import flashinfer.decode  # noqa: F401
    from flashinfer.jit import env as jit_env
    log(f"flashinfer {flashinfer.__version__} from {os.path.dirname(flashinfer.__file__)}; torch {torch.__version__}; "
        f"import {time.time() - t_import:.1f} s; modules: "
        f"{'JIT-compiled here (--rebuild)' if a.rebuild else 'prebuilt in ' + str(jit_env.FLASHINFER_AOT_DIR) + ' when present, else JIT'}")
    try:
        nv = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except Exception:
        nv = "nvcc not found"
    prop = torch.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 0) or (50 << 20)
    log(f"gpu {prop.name}, {prop.multi_processor_count} SMs, L2 {l2 >> 20} MB; {nv}")

    rows = json.load(open(a.kvpack_json)) if a.kvpack_json and os.path.exists(a.kvpack_json) else []
    kv_dec = [r for r in rows if r.get("kind") == "decode" and r.get("impl", "kvpack") == "kvpack"]
    run_id = kv_dec[0]["run_id"] if kv_dec else datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    read_bw = kv_dec[0]["read_bw_tbs"] if kv_dec else None
    gpu = kv_dec[0]["gpu"] if kv_dec else prop.name
    src = [r for r in kv_dec if r["format"] == "fp8"] or kv_dec
    shapes = parse_shapes(a.shapes) if a.shapes else (
        sorted({(r["num_qo_heads"], r["num_kv_heads"], r["head_dim"]) for r in src}, reverse=True) or
        [(32, 8, 128), (8, 1, 128)])
    batches = parse_list(a.batch) if a.batch else (sorted({r["batch"] for r in src}) or [1, 8, 16, 32, 64])
    contexts = parse_list(a.context) if a.context else (
        sorted({r["context"] for r in src}) or [8192, 32768, 65536, 131072])
    page = src[0]["page_size"] if src else a.page_size
    log(f"run {run_id}, read bandwidth {read_bw} TB/s (from {a.kvpack_json or 'nothing'}); shapes {shapes}, "
        f"batch {batches}, context {contexts}, page {page}, iters {a.iters}, "
        f"{'eager launches' if a.no_graph else 'CUDA graph'}, PDL off")

    impls = []
    for n in a.impls.split(","):
        n = n.strip()
        if n == "xqa":
            impls.append(FiXqa(torch, flashinfer))
        elif n == "fa2":
            impls.append(FiFa2(torch, flashinfer))
        elif n:
            sys.exit(f"unknown impl {n}")
    capi = None
    if a.capi:
        try:
            capi = KvpackCapi(a.capi)
            log(f"kvpack {capi.version} via {a.capi}")
        except OSError as e:
            log(f"kvpack C ABI not loaded ({e}); check without kvpack")

    status = {"flashinfer_version": flashinfer.__version__, "torch": torch.__version__, "nvcc": nv,
              "modules": "jit" if a.rebuild else "prebuilt-or-jit"}
    ok = True
    check_by = {}
    if not a.no_check:
        t0 = time.time()
        ok, chk = check(torch, flashinfer, capi, impls, shapes, page, a.tol, probe=not a.no_probe)
        status["check"] = chk
        check_by = {(r["impl"], r["shape"]): r for r in chk if "shape" in r}
        log(f"check {'passed' if ok else 'FAILED'} in {time.time() - t0:.1f} s (includes module load/JIT)")
    if a.check_only:
        return 0 if ok else 1

    fi_rows = []
    merged_path = a.out

    def write_out():
        if not merged_path:
            return
        by = {}
        for r in fi_rows:
            by[(r["impl"], r["num_qo_heads"], r["num_kv_heads"], r["head_dim"], r["batch"], r["context"])] = r
        out_rows = [r for r in rows if not str(r.get("impl", "")).startswith("flashinfer")]
        for r in out_rows:
            if r.get("kind") != "decode" or r.get("impl", "kvpack") != "kvpack":
                continue
            for impl, field in (("flashinfer-xqa", "speedup_vs_flashinfer_xqa"), ("flashinfer", "speedup_vs_flashinfer")):
                f = by.get((impl, r["num_qo_heads"], r["num_kv_heads"], r["head_dim"], r["batch"], r["context"]))
                if f is not None:
                    r[field] = f["median_us"] / r["median_us"]
        tmp = merged_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out_rows + fi_rows, f, indent=1)
            f.write("\n")
        os.replace(tmp, merged_path)

    kv_us = {(r["format"], r["num_qo_heads"], r["num_kv_heads"], r["head_dim"], r["batch"], r["context"]): r["median_us"]
             for r in kv_dec}
    gen = torch.Generator(device="cuda").manual_seed(42)
    max_b, max_c = max(batches), max(contexts)
    for (qo, kv, d) in shapes:
        npp_max = (max_c + page - 1) // page
        num_pages = max_b * npp_max
        t0 = time.time()
        kc = torch.empty(num_pages, kv, page, d, dtype=torch.float8_e4m3fn, device="cuda")
        vc = torch.empty_like(kc)
        fill_fp8(torch, kc, gen)
        fill_fp8(torch, vc, gen)
        perm = torch.randperm(num_pages, device="cuda", generator=gen).to(torch.int32)
        torch.cuda.synchronize()
        log(f"{qo}q/{kv}kv/{d}: pools 2 x {kc.numel() / 2**30:.2f} GiB filled in {time.time() - t0:.1f} s")
        for b in batches:
            for c in contexts:
                npp = (c + page - 1) // page
                needed = b * npp
                nbytes = 2.0 * b * c * kv * d
                rot = max(1, min(int(math.ceil(4.0 * l2 / nbytes)), 64, num_pages // needed))
                bts = [perm[r * needed:(r + 1) * needed].view(b, npp).contiguous() for r in range(rot)]
                seq = torch.full((b,), c, dtype=torch.int32, device="cuda")
                q = (torch.randn(b, qo, d, device="cuda", generator=gen)).to(torch.bfloat16)
                out = torch.empty_like(q)
                harness_kvpack_us = None
                if a.time_kvpack and capi is not None:
                    plan, wsb, splits, stages = capi.plan("fp8", qo, kv, d, page, b, c)
                    ws = torch.zeros(max(wsb, 16), dtype=torch.uint8, device="cuda")

                    def kl(r, q_, o_, plan=plan, ws=ws):
                        capi.run(plan, q_, kc, vc, num_pages, bts[r], seq, None, None, o_, ws, None,
                                 torch.cuda.current_stream().cuda_stream)
                    harness_kvpack_us, _, _ = time_launches(torch, kl, rot, q, out, a.iters, not a.no_graph)
                    capi.L.kvpack_capi_plan_free(plan)
                for impl in impls:
                    name = IMPL_NAMES[impl.name]
                    try:
                        launch = impl.prepare(kc, vc, bts, seq, qo, kv, d, page)
                        med, mn, mode = time_launches(torch, launch, rot, q, out, a.iters, not a.no_graph)
                        finite = bool(torch.isfinite(out.float()).all().item())
                    except Exception as e:
                        log(f"{name:<15} {qo:>2}q/{kv}kv/{d} b={b:<3} ctx={c:<6} FAILED: {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:300] if str(e) else ''}")
                        status.setdefault("errors", []).append(f"{name} {qo}/{kv}/{d} b={b} ctx={c}: "
                                                               f"{type(e).__name__}: {e}"[:2000])
                        torch.cuda.synchronize()
                        continue
                    bw = nbytes / (med * 1e-6) / 1e12
                    row = {"format": "fp8", "num_qo_heads": qo, "num_kv_heads": kv, "head_dim": d, "page_size": page,
                           "gpu": gpu, "read_bw_tbs": read_bw, "run_id": run_id, "impl": name, "kind": "decode",
                           "batch": b, "context": c, "median_us": med, "min_us": mn, "bandwidth_tbs": bw,
                           "bytes": nbytes, "rotations": rot, "timing": mode, "pdl": False,
                           "flashinfer_version": flashinfer.__version__, "output_finite": finite}
                    if read_bw:
                        row["frac_read_bw"] = bw / read_bw
                    if impl.name == "fa2":
                        row["fi_backend"] = str(impl.backend)
                    else:
                        row["fi_backend"] = "xqa (sm90 e4m3 kernel)" if prop.major == 9 else "xqa"
                    if harness_kvpack_us is not None:
                        row["kvpack_fp8_us_same_harness"] = harness_kvpack_us
                    chk = check_by.get((name, f"{qo}/{kv}/{d}"))
                    if chk is not None:
                        row["check_rel_max_diff"] = chk["rel_max_diff"]
                        row["check_pass"] = chk["pass"]
                    fi_rows.append(row)
                    extra = "".join(f" {f}: {med / kv_us[(f, qo, kv, d, b, c)]:.2f}x" for f in
                                    ("fp8", "q4", "q3.5", "q3") if (f, qo, kv, d, b, c) in kv_us)
                    hk = f" [kvpack fp8 in this harness {harness_kvpack_us:.1f} us]" if harness_kvpack_us else ""
                    log(f"{name:<15} {qo:>2}q/{kv}kv/{d:<3} b={b:<3} ctx={c:<6} {med:>10.1f} us {bw:>6.3f} TB/s "
                        f"rot {rot} {mode}{' NONFINITE' if not finite else ''};{extra}{hk}")
                    del launch
                del bts, q, out
        del kc, vc
        torch.cuda.empty_cache()
        write_out()
    write_out()
    log("status " + json.dumps({k: v for k, v in status.items() if k != "check"}))
    log(f"wrote {len(fi_rows)} FlashInfer rows" + (f" into {merged_path}" if merged_path else ""))
    return 0 if ok and "errors" not in status else 1


if __name__ == "__main__":
    sys.exit(main())
