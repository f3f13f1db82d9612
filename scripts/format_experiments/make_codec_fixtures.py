#!/usr/bin/env python3
"""Golden bytes for the baseline block cores from independent implementations (run once; outputs are committed).

tests/data/codec/fp8_e4m3.bin : 4096 float32 inputs, then torch.float8_e4m3fn bytes of them (inputs within +-448,
                                so torch's non-saturating conversion equals CUDA's satfinite one).
tests/data/codec/q4_0.bin     : 64 groups x 32 float32 inputs, then ggml q4_0 blocks from the gguf package's numpy
                                reference (per group: fp16 d little-endian, 16 bytes of nibbles).
"""
import struct
from pathlib import Path

import numpy as np
import torch
from gguf import quants, GGMLQuantizationType

out = Path(__file__).resolve().parents[2] / "tests" / "data" / "codec"
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(1234)

# fp8: magnitudes from 2^-12 (subnormal range) up to 448, both signs, plus exact ties between neighbours.
mag = np.exp2(rng.uniform(-12, np.log2(448.0), 3584)).astype(np.float32)
x = (mag * rng.choice([-1, 1], mag.size)).astype(np.float32)
codes = np.arange(0, 0x7e, dtype=np.uint8)
vals = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).float().numpy()
mids = ((vals[:-1].astype(np.float64) + vals[1:]) / 2).astype(np.float32)  # exact midpoints (ties -> even)
x = np.concatenate([x, mids[:512], -mids[:0]]).astype(np.float32)[:4096]
if x.size < 4096:
    x = np.concatenate([x, np.zeros(4096 - x.size, np.float32)])
y = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
(out / "fp8_e4m3.bin").write_bytes(x.tobytes() + y.tobytes())

# q4_0: Gaussian groups with occasional outliers and a few all-zero / constant groups.
g = rng.standard_normal((64, 32)).astype(np.float32) * np.exp2(rng.uniform(-6, 6, (64, 1))).astype(np.float32)
g[5] = 0
g[9] = 3.25
g[17, 3] = 40.0
q = quants.quantize(g, GGMLQuantizationType.Q4_0)
assert q.shape == (64, 18), q.shape
(out / "q4_0.bin").write_bytes(g.tobytes() + q.tobytes())
print("wrote", out)
