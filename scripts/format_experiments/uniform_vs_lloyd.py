#!/usr/bin/env python3
"""Uniform vs Lloyd-Max levels on SmolLM2's K/V after kvpack's kind of transform (research measurement).

Captures k_proj / v_proj outputs (pre-RoPE keys; the quantizer-shape question does not depend on RoPE) over the first
N tokens of data/calib.txt, and per (layer, kv head, K|V): subtracts the mean, rotates into the covariance eigenbasis,
mixes each group of 8 channels with a Hadamard, normalises each token by the RMS of its coefficients (the per-token
scale) and each channel by its standard deviation. On the pooled coefficients it compares, for b = 2, 3, 4 bits:
the MSE-optimal mid-rise uniform quantizer (grid search of the step) and a Lloyd-Max codebook (1-D k-means).
Usage: python3 scripts/format_experiments/uniform_vs_lloyd.py [N_TOKENS]
"""
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

root = Path(__file__).resolve().parents[2]
gguf = root / "models" / "smollm2-135m-instruct.gguf"
n_tok = int(sys.argv[1]) if len(sys.argv) > 1 else 512
torch.set_num_threads(1)
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32)
ids = tok((root / "data" / "calib.txt").read_text()[: n_tok * 8], return_tensors="pt").input_ids[:, :n_tok]
caps = {}
hooks = []
for li, layer in enumerate(model.model.layers):
    for kind, mod in (("K", layer.self_attn.k_proj), ("V", layer.self_attn.v_proj)):
        hooks.append(mod.register_forward_hook(lambda m, i, o, key=(li, kind): caps.__setitem__(key, o[0].detach().numpy())))
with torch.no_grad():
    model(ids)
D = model.config.hidden_size // model.config.num_attention_heads
H8 = np.array([[(-1) ** bin(i & j).count("1") for j in range(8)] for i in range(8)]) / np.sqrt(8)
coef = {"K": [], "V": []}
for (li, kind), x in caps.items():
    x = x[4:]  # sink tokens stay bf16
    for h in range(x.shape[1] // D):
        v = x[:, h * D:(h + 1) * D].astype(np.float64)
        v = v - v.mean(0)
        w, U = np.linalg.eigh(np.cov(v.T))
        y = v @ U[:, ::-1]
        y = (y.reshape(len(y), D // 8, 8) @ H8.T).reshape(len(y), D)
        y /= y.std(0) + 1e-12
        y /= np.sqrt((y ** 2).mean(1, keepdims=True)) + 1e-12
        coef[kind].append(y.ravel())


def uniform_mse(c, b):
    best = None
    for step in np.linspace(0.02, 2.0, 400):
        k = np.clip(np.floor(c / step + 2 ** (b - 1)), 0, 2 ** b - 1)
        e = np.mean((c - (k - (2 ** b - 1) / 2) * step) ** 2)
        best = e if best is None else min(best, e)
    return best


def lloyd_mse(c, b, iters=60):
    lv = np.quantile(c, (np.arange(2 ** b) + 0.5) / 2 ** b)
    for _ in range(iters):
        edges = (lv[1:] + lv[:-1]) / 2
        idx = np.searchsorted(edges, c)
        lv = np.array([c[idx == i].mean() if np.any(idx == i) else lv[i] for i in range(2 ** b)])
    edges = (lv[1:] + lv[:-1]) / 2
    return np.mean((c - lv[np.searchsorted(edges, c)]) ** 2)


print(f"tokens {ids.shape[1]}, head_dim {D}; MSE per unit variance (lower is better)")
print("kind bits  uniform  lloyd-max  lloyd gain")
for kind in ("K", "V"):
    c = np.concatenate(coef[kind])
    c = np.random.default_rng(0).choice(c, min(c.size, 400000), replace=False)
    for b in (2, 3, 4):
        u, l = uniform_mse(c, b), lloyd_mse(c, b)
        print(f"{kind}    {b}   {u:.5f}   {l:.5f}    {100 * (u - l) / u:5.1f}%")
