#!/usr/bin/env python3
"""Writes the tiny safetensors fixtures under tests/data/safetensors/ (committed; the C++ tests never run Python).

  python3 scripts/make_safetensors_fixtures.py            # (re)write fixtures, then run the checks below
  python3 scripts/make_safetensors_fixtures.py --check    # only the checks

Checks: (1) the python `safetensors` package reads writer_golden.safetensors, which the C++ writer produces
(tests/test_safetensors.cpp compares its output byte-for-byte with it; regenerate with KVPACK_UPDATE_GOLDEN=1),
and gets exactly the tensors and metadata the C++ test writes; (2) which malformed fixtures the reference
implementation also rejects (informational).
Deterministic: fixed seeds, the safetensors writer sorts its keys.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "safetensors")


def raw(path, header, data=b"", hlen=None, header_bytes=None):
    """A hand-made file: header dict (or raw bytes), data bytes, optional wrong header length."""
    hb = header_bytes if header_bytes is not None else json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb) if hlen is None else hlen))
        f.write(hb)
        f.write(data)



def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def make_fixtures():
    if os.path.isdir(ROOT):
        keep = {"writer_golden.safetensors"}  # made by the C++ writer, not here
        for name in os.listdir(ROOT):
            if name in keep:
                continue
            p = os.path.join(ROOT, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    os.makedirs(ROOT, exist_ok=True)
    g = torch.Generator().manual_seed(20261202)

    # Every supported dtype, with torch's own fp32 conversion stored next to each float tensor.
    base = torch.randn(3, 5, generator=g) * 3
    base[0, 0], base[0, 1], base[0, 2] = 0.0, -0.0, 1e-30  # zeros of both signs and a value that underflows in f16
    tensors = {
        "f64": (base.double() * 1.0000001).contiguous(),
        "f32": base.clone(),
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "f8_e4m3": (base.clamp(-448, 448)).to(torch.float8_e4m3fn),
        "f8_e5m2": base.to(torch.float8_e5m2),
        "i64": torch.tensor([[-(2**62), -1, 0], [1, 2**40, 2**62]], dtype=torch.int64),
        "i32": torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4),
        "i16": torch.tensor([-32768, -1, 0, 32767], dtype=torch.int16),
        "i8": torch.tensor([-128, -1, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 1, 128, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True], dtype=torch.bool),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }
    for k in ["f64", "f16", "bf16", "f8_e4m3", "f8_e5m2"]:
        tensors[k + ".as_f32"] = tensors[k].float()
    save_file(tensors, os.path.join(ROOT, "dtypes.safetensors"), metadata={"format": "pt", "source": "kvpack"})

    # All 256 fp8 bit patterns and torch's fp32 value for each (exhaustive decoder test).
    codes = torch.arange(256, dtype=torch.uint8)
    f8 = {}
    for name, dt in [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)]:
        v = codes.clone().view(dt)
        f8[name] = v
        f8[name + ".as_f32"] = v.float()
    save_file(f8, os.path.join(ROOT, "f8_all.safetensors"))

    # A sharded checkpoint in the Hugging Face layout.
    sd = os.path.join(ROOT, "sharded")
    os.makedirs(sd)
    shard1 = {"model.embed.weight": torch.randn(4, 3, generator=g).bfloat16(),
              "model.layers.0.w": torch.randn(3, 3, generator=g)}
    shard2 = {"model.layers.1.w": torch.randn(3, 3, generator=g), "lm_head.bias": torch.arange(4).float()}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file(shard1, os.path.join(sd, names[0]), metadata={"format": "pt"})
    save_file(shard2, os.path.join(sd, names[1]), metadata={"format": "pt"})
    wm = {k: names[0] for k in shard1} | {k: names[1] for k in shard2}
    total = sum(v.numel() * v.element_size() for v in (shard1 | shard2).values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}
    with open(os.path.join(sd, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)

    # Broken checkpoints: a shard missing on disk; a tensor the index puts in a shard that lacks it.
    for bad, mutate in [("sharded_missing_shard", lambda ix: ix["weight_map"].update({"x": "model-00003-of-00003.safetensors"})),
                        ("sharded_missing_tensor", lambda ix: ix["weight_map"].update({"model.layers.2.w": names[1]}))]:
        bd = os.path.join(ROOT, bad)
        os.makedirs(bd)
        for n in names:
            shutil.copy(os.path.join(sd, n), bd)
        ix = json.loads(json.dumps(index))
        mutate(ix)
        with open(os.path.join(bd, "model.safetensors.index.json"), "w") as f:
            json.dump(ix, f, indent=2)

    # Malformed single files (the C++ test checks each error message names the problem).
    eight = bytes(range(8))
    raw(os.path.join(ROOT, "bad_header_len.safetensors"), {"a": t("F32", [2], 0, 8)}, eight, hlen=10**6)
    raw(os.path.join(ROOT, "bad_json.safetensors"), None, eight, header_bytes=b'{"a":{"dtype":"F32","shape":[2],')
    raw(os.path.join(ROOT, "bad_dtype.safetensors"), {"a": t("F17", [2], 0, 8)}, eight)
    raw(os.path.join(ROOT, "bad_overlap.safetensors"), {"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)},
        eight + eight[:4])
    raw(os.path.join(ROOT, "bad_hole.safetensors"), {"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)},
        eight + eight[:4])
    raw(os.path.join(ROOT, "bad_size.safetensors"), {"a": t("F32", [3], 0, 8)}, eight)
    raw(os.path.join(ROOT, "bad_oob.safetensors"), {"a": t("F32", [4], 0, 16)}, eight)
    raw(os.path.join(ROOT, "bad_trailing.safetensors"), {"a": t("F32", [1], 0, 4)}, eight)
    raw(os.path.join(ROOT, "bad_missing_field.safetensors"), {"a": {"dtype": "F32", "data_offsets": [0, 8]}}, eight)
    raw(os.path.join(ROOT, "bad_metadata.safetensors"), {"__metadata__": {"n": 3}, "a": t("F32", [2], 0, 8)}, eight)
    raw(os.path.join(ROOT, "bad_duplicate.safetensors"), None, eight,
        header_bytes=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                     b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')


# What tests/test_safetensors.cpp (WriterGolden) writes; keep the two in sync.
def golden_expected():
    return {
        "a.f32": torch.tensor([i * 0.5 - 1 for i in range(6)], dtype=torch.float32).reshape(2, 3),
        "b.bf16": torch.tensor([-2.0, -0.5, 0.0, 3.25]).bfloat16(),
        "c.f16": torch.tensor([1.5, -0.125, 65504.0]).half(),
        "d.i32": torch.tensor([[-1, 0], [7, 2**31 - 1]], dtype=torch.int32),
        "e.u8": torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8),
        "f.empty": torch.zeros(0, 4, dtype=torch.float32),
        "g.scalar": torch.tensor(42, dtype=torch.int64),
        "h.f8": torch.tensor([0, 0x38, 0xb8, 0x7e], dtype=torch.uint8).view(torch.float8_e4m3fn),
    }, {"format": "pt", "kvpack": "golden", "unicode": "h\u00e9llo \u2713"}


def check():
    ok = True
    gp = os.path.join(ROOT, "writer_golden.safetensors")
    if not os.path.exists(gp):
        print("writer_golden.safetensors: missing (run the C++ test with KVPACK_UPDATE_GOLDEN=1)")
        ok = False
    else:
        exp, exp_md = golden_expected()
        with safe_open(gp, framework="pt") as f:
            md = f.metadata()
            got = {k: f.get_tensor(k) for k in f.keys()}
        same = md == exp_md and set(got) == set(exp)
        for k, v in exp.items():
            g = got.get(k)
            same = same and g is not None and g.dtype == v.dtype and g.shape == v.shape and \
                torch.equal(g.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else g,
                            v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v)
        load_file(gp)  # the plain loader too
        print(f"python safetensors {__import__('safetensors').__version__} reads the C++ writer's output: "
              f"{'OK, identical tensors and metadata' if same else 'MISMATCH'}")
        ok = ok and same
    for name in sorted(os.listdir(ROOT)):
        if name.startswith("bad_"):
            try:
                load_file(os.path.join(ROOT, name))
                verdict = "accepted"
            except Exception as e:  # noqa: BLE001 - reporting only
                verdict = "rejected: " + str(e).splitlines()[0][:90]
            print(f"reference implementation on {name}: {verdict}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="only run the checks")
    args = ap.parse_args()
    if not args.check:
        make_fixtures()
    sys.exit(0 if check() else 1)


if __name__ == "__main__":
    main()
