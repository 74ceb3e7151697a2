#!/usr/bin/env python3
# make_tokenizer.py: the kjv model's tokenizer, cut down from the real qwen3 tokenizer fixture.
#
#   python3 models/kjv/make_tokenizer.py [--merges 4000] [--check kjv.txt]
#
# writes models/kjv/tokenizer/{tokenizer.json, tokenizer_config.json, generation_config.json,
# chat_template.jinja (the fixture's qwen3.5 template, copied)} and models/kjv/tokenizer_ids.jsonl
# (goldens: text -> ids from hf `tokenizers`).
#
# the fixture's bpe (shared/fixtures/qwen3-tokenizer/tokenizer.json) has the 256 byte tokens at
# ids 0..255 and merge rank i producing id 256+i (checked below). keeping the first N merges and
# exactly the tokens they produce gives a self-consistent byte-level bpe with ids 0..256+N-1;
# the fixture's 26 added tokens (chat, think, tool, vision, fim) follow at 256+N.., same order,
# same flags. normalizer (nfc), ByteLevel pre-tokenizer step and decoder are the fixture's; the
# Split regex is the qwen3.5 one (model.md 7.1; --qwen3-regex keeps the fixture's). on the
# ascii kjv text the two regexes split identically.
import argparse, json, os, shutil, sys, unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QWEN3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def fixture_dir():
    for d in (os.environ.get("NINFER_FIXTURES"), os.path.join(ROOT, "..", "shared", "fixtures"), "/work/shared/fixtures"):
        if d and os.path.isdir(os.path.join(d, "qwen3-tokenizer")):
            return d
    sys.exit("make_tokenizer.py: fixtures not found (set NINFER_FIXTURES)")


def gpt2_byte_chars():
    # the gpt-2 byte -> unicode table (printable bytes map to themselves, the rest to 256+n)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def truncate(full, n_merges, regex):
    m = full["model"]
    vocab, merges = m["vocab"], m["merges"]
    assert m["type"] == "BPE" and not m["byte_fallback"] and m["unk_token"] is None
    assert 0 < n_merges <= len(merges)
    # the facts the cut relies on
    byte = gpt2_byte_chars()
    assert sorted(vocab[byte[b]] for b in range(256)) == list(range(256)), "byte tokens are not ids 0..255"
    pair = lambda mm: mm if isinstance(mm, list) else mm.split(" ")
    for i, mm in enumerate(merges[:n_merges]):
        a, b = pair(mm)
        assert vocab[a + b] == 256 + i, "merge %d does not produce id %d" % (i, 256 + i)
        assert vocab[a] < 256 + i and vocab[b] < 256 + i, "merge %d uses a later token" % i
    n_vocab = 256 + n_merges
    tok = dict(full)
    tok["model"] = dict(m)
    tok["model"]["vocab"] = {s: i for s, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i < n_vocab}
    tok["model"]["merges"] = [pair(mm) for mm in merges[:n_merges]]
    assert len(tok["model"]["vocab"]) == n_vocab
    tok["added_tokens"] = [dict(a, id=n_vocab + k) for k, a in enumerate(full["added_tokens"])]
    pre = json.loads(json.dumps(full["pre_tokenizer"]))
    split = pre["pretokenizers"][0]
    assert split["type"] == "Split" and split["pattern"]["Regex"] == QWEN3
    split["pattern"]["Regex"] = regex
    tok["pre_tokenizer"] = pre
    return tok


def tokenizer_config(fixture_cfg, tok):
    cfg = {k: v for k, v in fixture_cfg.items() if k not in ("added_tokens_decoder", "chat_template")}
    cfg["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
                                   for a in tok["added_tokens"]}
    cfg["model_max_length"] = 262144
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>" and cfg["bos_token"] is None
    return cfg


def generation_config(tok):
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    eot, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    # the layout of NInfer's synthesized file (format.md 8.11); a cooler temperature suits a tiny model
    return {"bos_token_id": eot, "do_sample": True, "eos_token_id": [im_end, eot], "pad_token_id": eot,
            "temperature": 0.7, "top_k": 20, "top_p": 0.95, "transformers_version": "5.13.0"}


# golden inputs: whitespace, digits, contractions, unicode that falls back to byte tokens,
# combining marks, special tokens, and a few verses
CASES = [
    "", " ", "  ", "\n", "\n\n", "\r\n", "a\r\nb\rc", "tabs\tand\nnewlines\n\n\nend", "trailing spaces   ", "  leading spaces",
    "x=12345; y = 3.14159", "123abc456", "I'm here, they've gone, it's OK", "DON'T SHOUT", "Hello world",
    "\u00e9 decomposed e\u0301", "\u00f1 and \u00d1", "Stra\u00dfe", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "emoji \U0001F600 ok", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "<|im_start|>user\nAnd God said<|im_end|>\n<|im_start|>assistant\n", "<think>\n\n</think>\n\n", "<|endoftext|><|endoftext|>",
    "<tool_call>\n<function=f>\n</function>\n</tool_call>", "<|vision_start|><|image_pad|><|vision_end|>", "a<|im_start|>b", "<|im_start|",
    "def f(x):\n    return x + 1\n",
    "And God said, Let there be light: and there was light.",
    "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void;",
    "Genesis 1\n",
    "\nJohn 3\n",
    "For God so loved the world, that he gave his only begotten Son, that whosoever believeth in him should not perish, but have everlasting life.",
    "Thou shalt not kill. Thou shalt not commit adultery. Thou shalt not steal.",
    "And the LORD spake unto Moses, saying,",
    "Vanity of vanities, saith the Preacher; all is vanity.\n\n",
]


def main():
    ap = argparse.ArgumentParser(description="truncated qwen3 bpe for the kjv model")
    ap.add_argument("--merges", type=int, default=4000, help="merges kept (default 4000)")
    ap.add_argument("--qwen3-regex", action="store_true", help="keep the fixture's qwen3 Split regex")
    ap.add_argument("--out", default=os.path.join(HERE, "tokenizer"), help="output directory")
    ap.add_argument("--goldens", default=os.path.join(HERE, "tokenizer_ids.jsonl"), help="goldens file")
    ap.add_argument("--check", metavar="TEXT", help="also check that this text file round-trips (e.g. kjv.txt)")
    args = ap.parse_args()

    fx = fixture_dir()
    full = json.load(open(os.path.join(fx, "qwen3-tokenizer", "tokenizer.json"), encoding="utf-8"))
    fixture_cfg = json.load(open(os.path.join(fx, "qwen3-tokenizer", "tokenizer_config.json"), encoding="utf-8"))
    tok = truncate(full, args.merges, QWEN3 if args.qwen3_regex else QWEN35)
    os.makedirs(args.out, exist_ok=True)
    files = {"tokenizer.json": tok, "tokenizer_config.json": tokenizer_config(fixture_cfg, tok),
             "generation_config.json": generation_config(tok)}
    for name, d in files.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            # tokenizer.json as compact as the fixture (one line); the configs hf-style
            f.write(json.dumps(d, ensure_ascii=False) if name == "tokenizer.json" else json.dumps(d, indent=2, sort_keys=True) + "\n")

    shutil.copyfile(os.path.join(fx, "qwen3.5", "chat_template.jinja"), os.path.join(args.out, "chat_template.jinja"))

    # verify with hf tokenizers: it loads, ids are contiguous, special tokens are single ids,
    # and text round-trips
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    n = t.get_vocab_size(with_added_tokens=True)
    assert n == 256 + args.merges + len(tok["added_tokens"]), n
    assert sorted(t.get_vocab(with_added_tokens=True).values()) == list(range(n))
    for a in tok["added_tokens"]:
        assert t.encode(a["content"], add_special_tokens=False).ids == [a["id"]], a["content"]
    with open(args.goldens, "w", encoding="utf-8") as f:
        for text in CASES:
            ids = t.encode(text, add_special_tokens=False).ids
            assert t.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text), text
            f.write(json.dumps({"text": text, "ids": ids}) + "\n")
    if args.check:
        text = open(args.check, encoding="utf-8").read()
        ids = t.encode(text, add_special_tokens=False).ids
        assert t.decode(ids) == text, "round trip failed on " + args.check
        print("make_tokenizer.py: %s: %d bytes -> %d tokens (%.2f bytes/token), round trip ok"
              % (args.check, len(text.encode()), len(ids), len(text.encode()) / len(ids)), file=sys.stderr)
    rows = (n + 63) // 64 * 64
    print("make_tokenizer.py: %d merges, %d bpe ids + %d added = %d ids (embedding rows %d) -> %s"
          % (args.merges, 256 + args.merges, len(tok["added_tokens"]), n, rows, args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
