#!/usr/bin/env python3
"""Writes the GGUF test fixtures under tests/data/gguf/ with the Python `gguf` package (the oracle).

  dequant.gguf         for every type the package can dequantize: tensor `raw.<TYPE>` (random blocks, scale
                       fields forced finite) and `expect.<TYPE>` (F32, the package's numpy dequantization).
  metadata_v3.gguf     every metadata value type incl. nested arrays, general.alignment = 64, a few tensors.
  metadata_v2.gguf     the same bytes with the version field set to 2 (v2 and v3 share the layout).
  smollm2_rows.gguf    first rows of blk.0.attn_q.weight (Q4_1) and some rows of token_embd.weight (Q8_0) of the
                       SmolLM2 model, dequantized by the package (only when the model is present).
  smollm2_checksums.json  per-tensor checksum of the package's dequantization of the whole model (see checksum()).

Deterministic: fixed seeds; re-running rewrites identical files. Usage:
  python3 scripts/make_gguf_fixtures.py [--model models/smollm2-135m-instruct.gguf]
"""
import argparse
import json
import logging
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gguf"

# Byte offsets of the fp16 scale fields in each block (ggml-common.h layouts); these are forced to finite values so
# that NaN payload propagation never enters the comparison.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
BLOCKS = {T.Q4_0: 24, T.Q4_1: 24, T.Q5_0: 24, T.Q5_1: 24, T.Q8_0: 24,
          T.Q2_K: 6, T.Q3_K: 6, T.Q4_K: 6, T.Q5_K: 6, T.Q6_K: 6}


def random_finite_f16(rng, n):
    """Random fp16 bit patterns over the whole finite range (subnormals, zeros, negatives included)."""
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exp = (h >> 10) & 0x1F
    h = np.where(exp == 31, h & np.uint16(0x83FF), h)  # inf/nan -> same mantissa, exponent 0 (subnormal)
    return h.astype(np.uint16)


def checksum(values: np.ndarray) -> int:
    """Order-sensitive 64-bit checksum of float32 bit patterns: sum(bits[i] * (i * 2654435761 + 1)) mod 2^64.
    Mirrored in tests/test_gguf.cpp."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).ravel().astype(np.uint64)
    w = np.arange(bits.size, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.sum(bits * w, dtype=np.uint64))


def write(writer: gguf.GGUFWriter):
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_dequant(rng):
    w = gguf.GGUFWriter(OUT / "dequant.gguf", "kvpack-test")
    for qt, nblocks in BLOCKS.items():
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
        for off in F16_FIELDS[qt]:
            raw[:, off:off + 2] = random_finite_f16(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
        # A few blocks with realistic scales too: quantize real floats where the package can.
        if qt in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
            floats = rng.standard_normal((8, bs)).astype(np.float32) * np.float32(0.05)
            raw[:8] = gguf.quants.quantize(floats, qt).reshape(8, ts)
        rows = 2
        raw = raw.reshape(rows, -1)
        expect = dequantize(raw, qt).astype(np.float32)
        assert expect.shape == (rows, nblocks * bs // rows)
        w.add_tensor(f"raw.{qt.name}", raw, raw_shape=raw.shape, raw_dtype=qt)
        w.add_tensor(f"expect.{qt.name}", expect)
    # Plain types: every finite fp16 pattern is covered by the exhaustive C++ test; here a random sample each.
    f16 = random_finite_f16(rng, 512).view(np.float16).reshape(2, 256)
    w.add_tensor("raw.F16", f16)
    w.add_tensor("expect.F16", f16.astype(np.float32))
    bf = rng.integers(0, 1 << 16, size=(2, 256), dtype=np.uint32).astype(np.uint16)
    w.add_tensor("raw.BF16", bf.view(np.uint8), raw_shape=(2, 512), raw_dtype=T.BF16)
    w.add_tensor("expect.BF16", dequantize(bf.view(np.uint8), T.BF16).astype(np.float32))
    write(w)


def make_metadata():
    path = OUT / "metadata_v3.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", -2.5e-300)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo\nwörld")
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_key_value("test.array_u8", [1, 2, 255], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
    w.add_array("test.array_f32", [0.5, -1.25])
    w.add_array("test.array_str", ["a", "", "ccc"])
    w.add_array("test.array_bool", [True, False, True])
    w.add_array("test.nested", [[1, 2], [3], [4, 5, 6]])
    w.add_array("test.nested_str", [["x", "y"], ["z"]])
    # A tiny llama-shaped config so model_config_from_gguf has something to read.
    w.add_name("tiny-test")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(32)
    rng = np.random.default_rng(7)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 64)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.arange(64, dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((64, 64)).astype(np.float16))
    q = gguf.quants.quantize(rng.standard_normal((64, 64)).astype(np.float32), T.Q8_0)
    w.add_tensor("blk.0.attn_k.weight", q, raw_shape=q.shape, raw_dtype=T.Q8_0)
    write(w)
    data = bytearray(path.read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    (OUT / "metadata_v2.gguf").write_bytes(bytes(data))


def make_model_fixtures(model: Path):
    r = gguf.GGUFReader(model)
    tensors = {t.name: t for t in r.tensors}
    w = gguf.GGUFWriter(OUT / "smollm2_rows.gguf", "kvpack-test")
    q = tensors["blk.0.attn_q.weight"]
    w.add_tensor("blk.0.attn_q.weight.rows0-3", dequantize(q.data[:4], q.tensor_type).astype(np.float32))
    e = tensors["token_embd.weight"]
    rows = [0, 1, 2, 1000, 49151]
    w.add_array("token_embd.rows", rows)
    w.add_tensor("token_embd.weight.rows", dequantize(e.data[rows], e.tensor_type).astype(np.float32))
    write(w)
    sums = {}
    for t in r.tensors:
        sums[t.name] = f"{checksum(dequantize(t.data, t.tensor_type)):016x}"
    (OUT / "smollm2_checksums.json").write_text(json.dumps(
        {"model": model.name, "checksum": "sum(bits[i] * (i * 2654435761 + 1)) mod 2^64 of the float32 bits",
         "tensors": sums}, indent=1) + "\n")


def make_fuzz_seeds(out: Path, model: Path):
    """Small valid files (one tensor per dequantizable type, every value type) and truncated heads of the model,
    as a libFuzzer seed corpus (fuzz/corpus-*/ is not committed)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(99)
    for i, align in enumerate([32, 8, 256]):
        w = gguf.GGUFWriter(out / f"seed_types_{i}.gguf", "llama")
        if align != 32:
            w.add_custom_alignment(align)
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(32)
        w.add_feed_forward_length(64)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
        w.add_array("test.nested", [[1, 2], [3]])
        w.add_float64("test.f64", 1.5)
        w.add_bool("test.b", True)
        for qt, ts in [(qt, gguf.GGML_QUANT_SIZES[qt][1]) for qt in BLOCKS]:
            raw = rng.integers(0, 256, size=(1, ts), dtype=np.uint8)
            w.add_tensor(f"t.{qt.name}", raw, raw_shape=raw.shape, raw_dtype=qt)
        w.add_tensor("t.F32", rng.standard_normal((2, 32)).astype(np.float32))
        w.add_tensor("t.F16", rng.standard_normal((2, 32)).astype(np.float16))
        write(w)
    if model.exists():
        head = model.read_bytes()[:1 << 16]
        for n in (4096, 1 << 16):
            (out / f"seed_model_head_{n}.gguf").write_bytes(head[:n])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct.gguf")
    ap.add_argument("--fuzz-seeds", type=Path, help="also write a libFuzzer seed corpus into this folder")
    args = ap.parse_args()
    logging.getLogger("gguf").setLevel(logging.WARNING)
    OUT.mkdir(parents=True, exist_ok=True)
    make_dequant(np.random.default_rng(1234))
    make_metadata()
    if args.model.exists():
        make_model_fixtures(args.model)
    else:
        print(f"{args.model} not found: model fixtures not rewritten")
    if args.fuzz_seeds:
        make_fuzz_seeds(args.fuzz_seeds, args.model)
    for p in sorted(OUT.iterdir()):
        print(f"{p.relative_to(ROOT)}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
