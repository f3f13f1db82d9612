#!/usr/bin/env python3
"""Reference logits for tests/test_llama.cpp from an independent implementation (HF transformers, fp32, CPU).

transformers loads the same GGUF file, dequantizes every tensor to fp32 and undoes llama.cpp's Q/K row permutation,
then runs its own Llama forward pass in fp32 with K/V never rounded (the C++ test compares with the identity codec).

Writes (total well under 2 MB, so the fixture can live in git):
  tests/data/logits/prompt.json   token ids of a fixed ~32-token prompt, the top-k logits of every position,
                                  the positions whose full rows are in rows.bin, and a greedy chat generation
  tests/data/logits/rows.bin      float32 little-endian [len(full_rows), vocab] full logit rows

Usage: python3 scripts/make_logits_fixture.py [--model models/smollm2-135m-instruct.gguf]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = ("The Debian project maintains a large collection of free software packages. Each package is built "
          "from source and tested before it reaches the stable release, which")
CHAT = "What is the capital of France? Answer in one sentence."
TOP_K = 16
FULL_ROWS = [0, 13, -1]  # first, a middle and the last position
GEN_TOKENS = 20


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--model", default=os.path.join(root, "models", "smollm2-135m-instruct.gguf"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "logits"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    path = os.path.realpath(args.model)
    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()

    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()  # [n, vocab]
    n, vocab = logits.shape
    top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
    rows = [r % n for r in FULL_ROWS]

    chat_ids = tok.apply_chat_template([{"role": "user", "content": CHAT}], add_generation_prompt=True,
                                       tokenize=True)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "input_ids"):
        chat_ids = chat_ids["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([chat_ids]), max_new_tokens=GEN_TOKENS, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    gen = out[0, len(chat_ids):].tolist()

    os.makedirs(args.out, exist_ok=True)
    meta = {
        "source": "scripts/make_logits_fixture.py (transformers, fp32, eager attention, no KV rounding)",
        "model": f,
        "prompt": PROMPT,
        "tokens": ids,
        "vocab": vocab,
        "top_k": TOP_K,
        "top_ids": top.tolist(),
        "top_logits": [[float(logits[i, j]) for j in top[i]] for i in range(n)],
        "full_rows": rows,
        "chat_prompt": CHAT,
        "chat_tokens": list(chat_ids),
        "generated": gen,
        "generated_text": tok.decode(gen),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    with open(os.path.join(args.out, "prompt.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    logits[rows].astype("<f4").tofile(os.path.join(args.out, "rows.bin"))
    print(f"{n} tokens, vocab {vocab}; generated: {meta['generated_text']!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
