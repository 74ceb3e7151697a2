#!/usr/bin/env python3
# make_data.py: the king james bible (debian bible-kjv) as train / held-out token ids.
#
#   apt-get install -y bible-kjv
#   python3 models/kjv/make_data.py [--kjv kjv.txt]
#
# reads the output of `bible 'gen1:1-rev22:21'` (runs it when --kjv is not given) and checks its
# sha256 (fixtures.md 5). the text is reflowed to one verse per line without verse numbers, each
# chapter under a "Book N" heading, chapters separated by a blank line:
#
#   Genesis 1
#   In the beginning God created the heaven and the earth.
#   And the earth was without form, and void; ...
#
# held out: eight whole books of several kinds (narrative, wisdom, poetry, prophecy, gospel,
# epistle), about 5% of the text. John rather than a synoptic gospel, whose parallels in Matthew
# and Luke would leak. writes
#   models/kjv/val.txt          held-out text (committed: ninfer --perplexity reads it)
#   models/kjv/data/train.txt   training text
#   models/kjv/data/{train,val}.ids   uint16 little-endian token ids of each text, tokenized whole
#   models/kjv/data/val.ids.txt       the held-out ids as text (ninfer --perplexity reads this)
#   models/kjv/data/meta.json   counts and sha256s
import argparse, hashlib, json, os, re, subprocess, sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
KJV_SHA256 = "82fa5f3788c6a9a010fb128a0f0bf588984b5888a82058520620eded59b033ea"
VAL_BOOKS = ["Ruth", "Ecclesiastes", "Lamentations", "Hosea", "Jonah", "John", "Galatians", "James"]


def chapters(raw):
    """bible's output -> [(book, chapter, [verse text])]. a heading is a line between two blank
    lines; a verse starts with '  N '; other lines continue the verse (wrapped at 80 columns)."""
    lines = raw.split("\n")
    out = []
    for i, l in enumerate(lines):
        if l and not l.startswith("  ") and 0 < i < len(lines) - 1 and lines[i - 1] == "" and lines[i + 1] == "":
            book, ch = re.fullmatch(r"(.+) (\d+)", l).groups()
            out.append((book, int(ch), []))
        elif (m := re.match(r"  (\d+) (.*)", l)):
            verses = out[-1][2]
            assert int(m.group(1)) == len(verses) + 1, l
            verses.append(m.group(2))
        elif l:
            out[-1][2][-1] += " " + l
    return out


def render(chs):
    return "\n".join("%s %d\n" % (b, c) + "".join(v.strip() + "\n" for v in vs) for b, c, vs in chs)


def main():
    ap = argparse.ArgumentParser(description="kjv train / held-out ids")
    ap.add_argument("--kjv", help="output of `bible 'gen1:1-rev22:21'` (default: run it)")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "tokenizer", "tokenizer.json"))
    ap.add_argument("--out", default=os.path.join(HERE, "data"))
    args = ap.parse_args()

    if args.kjv:
        raw = open(args.kjv, "rb").read()
    else:
        raw = subprocess.run(["bible", "gen1:1-rev22:21"], check=True, capture_output=True).stdout
    if hashlib.sha256(raw).hexdigest() != KJV_SHA256:
        sys.exit("make_data.py: the kjv text's sha256 is not %s (fixtures.md 5)" % KJV_SHA256)
    chs = chapters(raw.decode("ascii"))
    assert len(chs) == 1189 and sum(len(vs) for _, _, vs in chs) == 31102
    books = {b for b, _, _ in chs}
    assert len(books) == 66 and all(b in books for b in VAL_BOOKS)
    texts = {"train": render([c for c in chs if c[0] not in VAL_BOOKS]),
             "val": render([c for c in chs if c[0] in VAL_BOOKS])}

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    assert tok.get_vocab_size(with_added_tokens=True) <= 65536
    os.makedirs(args.out, exist_ok=True)
    meta = {"source_sha256": KJV_SHA256, "val_books": VAL_BOOKS, "tokenizer_sha256": hashlib.sha256(open(args.tokenizer, "rb").read()).hexdigest()}
    for split, text in texts.items():
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text, split + " does not round-trip"
        txt = os.path.join(HERE, "val.txt") if split == "val" else os.path.join(args.out, "train.txt")
        with open(txt, "w", encoding="ascii", newline="") as f:
            f.write(text)
        np.asarray(ids, dtype="<u2").tofile(os.path.join(args.out, split + ".ids"))
        if split == "val":  # for ninfer --perplexity, which reads ids as text until it tokenizes
            with open(os.path.join(args.out, "val.ids.txt"), "w") as f:
                f.write(" ".join(map(str, ids)) + "\n")
        meta[split] = {"text": os.path.relpath(txt, HERE), "bytes": len(text), "tokens": len(ids),
                       "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
                       "ids_sha256": hashlib.sha256(np.asarray(ids, dtype="<u2").tobytes()).hexdigest()}
        print("make_data.py: %-5s %8d bytes %8d tokens -> %s" % (split, len(text), len(ids), txt), file=sys.stderr)
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        f.write(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    main()
