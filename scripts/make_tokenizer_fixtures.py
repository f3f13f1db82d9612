#!/usr/bin/env python3
"""Build the tokenizer fixtures under tests/data/tokenizer/ (committed as data; the C++ tests never run Python).

  smollm2/tokenizer.json         SmolLM2-135M-Instruct's tokenizer, compact JSON. transformers builds it from the
                                 GGUF (AutoTokenizer(..., gguf_file=...)); its GGUF converter does not know the
                                 "smollm" pre-tokenizer and writes a plain ByteLevel one, so we put back SmolLM2's
                                 real HF pre_tokenizer: Sequence[Digits(individual_digits), ByteLevel].
  smollm2/tokenizer_config.json  bos/eos and the GGUF's chat template.
  flavours.json                  JSON patches that turn the SmolLM2 tokenizer.json into the other flavours:
                                 gpt2 (plain ByteLevel regex, merges written as "a b" strings), llama3 (Llama-3 Split
                                 regex + ignore_merges + Llama-3 special tokens and chat template), qwen2 (NFC + Qwen2
                                 Split regex + Qwen2 chat template). The vocab/merges of Llama-3 and Qwen2 cannot be
                                 downloaded here; their pre-tokenization and settings are what these flavours test.
  texts.json                     the test texts (exact strings, including the first ~20 KB of data/eval-{a,b}.txt).
  expected_<flavour>.json        reference ids from the `tokenizers` library: {"special": {name: ids},
                                 "nospecial": {name: ids}} (parse_special true / false), and "pieces": {name:
                                 pre-tokenizer pieces of the first 4000 characters, in the byte-level alphabet}.
  chat.json                      transformers' apply_chat_template output (text and ids) per flavour.

Run from the repository root: python3 scripts/make_tokenizer_fixtures.py [--model models/smollm2-135m-instruct.gguf]
The C++ test applies the same patches (tests/test_tokenizer.cpp) before loading a flavour.
"""
import argparse
import copy
import json
import os
import pathlib
import tempfile
import unicodedata

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

BYTE_LEVEL_NO_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def added(id_, content):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


FLAVOURS = {
    "smollm2": {},
    "gpt2": {
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "merges_as_strings": True,
    },
    "llama3": {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            BYTE_LEVEL_NO_REGEX]},
        "ignore_merges": True,
        "extra_added_tokens": [added(49152, "<|begin_of_text|>"), added(49153, "<|end_of_text|>"),
                               added(49154, "<|start_header_id|>"), added(49155, "<|end_header_id|>"),
                               added(49156, "<|eot_id|>")],
        "tokenizer_config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                             "chat_template": LLAMA3_TEMPLATE},
    },
    "qwen2": {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            BYTE_LEVEL_NO_REGEX]},
        "tokenizer_config": {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": QWEN2_TEMPLATE},
    },
}


def apply_flavour(base_json, base_config, patch):
    """The exact patch the C++ test applies: returns (tokenizer.json dict, tokenizer_config dict)."""
    j = copy.deepcopy(base_json)
    cfg = copy.deepcopy(base_config)
    if "pre_tokenizer" in patch:
        j["pre_tokenizer"] = patch["pre_tokenizer"]
    if "normalizer" in patch:
        j["normalizer"] = patch["normalizer"]
    if patch.get("ignore_merges"):
        j["model"]["ignore_merges"] = True
    if patch.get("merges_as_strings"):
        j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]
    j["added_tokens"] = j["added_tokens"] + patch.get("extra_added_tokens", [])
    cfg.update(patch.get("tokenizer_config", {}))
    return j, cfg


def texts(root):
    t = {
        "empty": "",
        "prose": "The quick brown fox jumps over the lazy dog. It wasn't me, she said; \"really?\" he asked.",
        "contractions": "I'm sure it's John's; we'll see, they've done it, you'd know, they're HERE. IT'S I'LL WE'VE "
                        "He'S she'LL 'd 're 'M ' s ''s",
        "code": "def f(x):\n    if x > 0:\n\treturn x ** 2  # square\n    else:\n        return -x\n\n\nclass A:\n"
                "    pass\n\t\t  \tmixed = [1, 2,3]\n",
        "digits": "0 1 12 123 1234 12345 123456789012345678901234567890 3.14159 -42 1e-10 0x1F 2024-06-01 "
                  "$1,000,000.00 v1.2.3",
        "unicode_digits": "٣٤٥ ²³ ½ Ⅻ 一二三 ４５６ 𝟙𝟚",
        "whitespace": "a  b   c    d\n\n\ne \n \n\t\n  \r\n\r\nf   \n   trailing   ",
        "only_spaces": "     ",
        "only_newlines": "\n\n\n",
        "odd_whitespace": "a\u000bb\u000cc\u0085d\u00a0e\u2009f\u3000g\u2028h\u2029i \u200bj\u001ck\u001fl",
        "accents": "Café naïve résumé Ångström Zürich São Paulo ñandú Œuvre ß",
        "cjk": "日本語のテキストです。中文文本，还有한국어 텍스트.",
        "emoji": "Hello 👋🏽 world 🌍! Family: 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ❤️",
        "rtl": "العربية النص مرحبا بالعالم עברית שלום",
        "combining": "e\u0301 a\u0308 n\u0303 Z\u0335\u0321\u0352a\u0336l\u0338g\u0337o\u0334 \u0915\u094d\u0937",
        "rare_utf8": "\u0000 nul \u007f del \u00ad shy \ufeff bom \uffff \U0010ffff \U0001f600 \u2028",
        "nfc": "cafe\u0301 vs caf\u00e9, \u212b vs \u00c5, \u1e9b\u0323",
        "punct": "Hello!!! What??? ...and --- (parens) [brackets] {braces} <angle> @user #tag $$ %% ^^ && **",
        "special_inline": "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|endoftext|>tail",
        "special_glued": "x<|im_end|>y <|im_start|> <|im_start|><|im_end|> <|im_end|",
        "llama3_special": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "long_word": "a" * 300 + " " + "ab" * 200 + " " + " " * 100 + "z",
        "casefold": "'ſ 'K 'ß 'İ DON'T",
        # bytes 0x04 0x13 0x1d and the lead byte 0xF1 (U+40000..U+7FFFF) are not in SmolLM2's vocabulary; with no
        # unk token HF drops them, and so must we
        "missing_bytes": "a\u0004b\u0013c\U00050000d\u001de \U00040001",
    }
    for name in ("eval-a", "eval-b"):
        raw = (root / "data" / f"{name}.txt").read_text(encoding="utf-8")
        t[name] = raw[:20000]
    return t


CHAT_CASES = [
    {"name": "user_only", "gen": True, "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "with_system", "gen": True, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "  Spaces around, and\nnewlines\n\n "}]},
    {"name": "no_gen", "gen": False, "messages": [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    {"name": "unicode", "gen": True, "messages": [{"role": "user", "content": "Résumé 日本 👋 \t"}]},
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/smollm2-135m-instruct.gguf")
    ap.add_argument("--out", default="tests/data/tokenizer")
    args = ap.parse_args()
    root = pathlib.Path(".").resolve()
    out = pathlib.Path(args.out)
    (out / "smollm2").mkdir(parents=True, exist_ok=True)

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    model = pathlib.Path(args.model).resolve()
    hf = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        base = json.loads(pathlib.Path(d, "tokenizer.json").read_text(encoding="utf-8"))
    base["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    base_cfg = {"bos_token": hf.bos_token, "eos_token": hf.eos_token, "chat_template": hf.chat_template}
    (out / "smollm2" / "tokenizer.json").write_text(
        Tokenizer.from_str(json.dumps(base)).to_str(pretty=False), encoding="utf-8")
    (out / "smollm2" / "tokenizer_config.json").write_text(json.dumps(base_cfg, indent=1), encoding="utf-8")
    (out / "flavours.json").write_text(json.dumps(FLAVOURS, indent=1, ensure_ascii=False), encoding="utf-8")
    txt = texts(root)
    (out / "texts.json").write_text(json.dumps(txt, indent=0, ensure_ascii=True), encoding="utf-8")

    chat = {}
    for flav, patch in FLAVOURS.items():
        j, cfg = apply_flavour(base, base_cfg, patch)
        tok = Tokenizer.from_str(json.dumps(j))
        exp = {"special": {}, "nospecial": {}, "pieces": {}}
        for name, s in txt.items():
            tok.encode_special_tokens = False
            exp["special"][name] = tok.encode(s, add_special_tokens=False).ids
            tok.encode_special_tokens = True
            exp["nospecial"][name] = tok.encode(s, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            # Pre-tokenizer pieces (byte-level alphabet) of the normalized text, first 4000 characters: checks the
            # regex splitting itself, independent of what the vocabulary can merge.
            norm = tok.normalizer.normalize_str(s[:4000]) if tok.normalizer else s[:4000]
            exp["pieces"][name] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(norm)]
            if name != "missing_bytes":
                assert tok.decode(exp["special"][name], skip_special_tokens=False) == \
                    (s if flav != "qwen2" else unicodedata.normalize("NFC", s)), (flav, name)
        (out / f"expected_{flav}.json").write_text(json.dumps(exp, separators=(",", ":")), encoding="utf-8")
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])
        fast.chat_template = cfg["chat_template"]
        cases = []
        for c in CHAT_CASES:
            text = fast.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=c["gen"])
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({**c, "text": text, "ids": ids})
        chat[flav] = cases
        print(flav, "ok", sum(len(v) for v in exp["special"].values()), "ids")
    (out / "chat.json").write_text(json.dumps(chat, indent=1, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
