#!/usr/bin/env python3
# golden token ids from hf `tokenizers` for test/test_tokenizer.cc.
#   python3 test/gen_tokenizer_goldens.py   (writes test/golden/tokenizer_ids.jsonl)
#
# tokenizers: the real qwen3 tokenizer.json (shared/fixtures/qwen3-tokenizer), and the same
# file with its Split regex replaced by the qwen3.5 pattern (model.md 7.1). one line per
# input: {"text": ...} (or {"hex": ...} for invalid utf-8, which hf sees decoded with
# errors='replace'), "qwen3": ids, "qwen35re": ids, "nfc" when NFC(text) != text, and
# "pre3" / "pre35": the pre-token pieces of both regexes (inputs without added tokens).
# encode(text, add_special_tokens=False), as fixtures.md says.
#
# unicode: our tables are python 3.11's unicodedata (14.0.0); tokenizers' oniguruma is newer
# (unicode 16), so inputs avoid code points assigned after 14.0 (checked below).
import json, os, random, sys, unicodedata
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "..", "shared", "fixtures", "qwen3-tokenizer", "tokenizer.json")
if not os.path.exists(FIX): FIX = "/work/shared/fixtures/qwen3-tokenizer/tokenizer.json"
OUT = os.path.join(ROOT, "test", "golden", "tokenizer_ids.jsonl")

QWEN3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

def load():
    raw = open(FIX, "rb").read().decode("utf-8")
    t3 = Tokenizer.from_str(raw)
    # the qwen3.5 variant: replace the pattern's json text, exactly as the c++ test does
    a, b = json.dumps(QWEN3), json.dumps(QWEN35)
    assert raw.count(a) == 1, "qwen3 regex not found in the fixture"
    t35 = Tokenizer.from_str(raw.replace(a, b))
    return t3, t35

def hand_cases():
    nfd = lambda s: unicodedata.normalize("NFD", s)
    c = [
        "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r", "\r\n", "\r\n\r\n", "\n\r", " \n", "\n ", " \n \n ",
        "  \n  x", "a  b", "a   b   ", "trailing spaces   ", "  leading spaces", "\t\tx", "x\t\ty", "a\r\nb\rc",
        "tabs\tand\nnewlines\n\n\nend", "\u3000x", "\u3000\u3000", "x\u00a0y", "x\u00a0\u00a0y", "\u00a0", "a\u0085b",
        "\x1c\x1d\x1e\x1f", "a\x1cb", "\x0b\x0c", "x \x0b y", "\u2028\u2029", "a\u2003b\u200ac", "\u202f\u205f", "\u1680x",
        " \u3000 x", "x\n\u3000y", "! \n", "!!!\n\n", " !!!\r\n", "...\n\n\nx", "  \t\n", "\n\t\n", " \r\n ", "end  ",
        "0", "12345", "3.14159", "1,000,000", "x=12345; y = 3.14159", "123abc456", "\u0663\u0664\u0665", "\u2460\u2461",
        "\u216b", "\u00bd cup", "x\u00b2+y\u00b2", "10^9", "3rd", "COVID-19", "$100.00", "50%", "\uff11\uff12\uff13",
        "I'm", "I'M", "you're", "YOU'RE", "You'Re", "yOu'rE", "they've", "THEY'VE", "we'll", "WE'LL", "We'Ll", "he'd",
        "HE'D", "it's", "IT'S", "don't", "DON'T", "DON'T SHOUT", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d",
        "'\u017f", "'\u017ft", "x'\u017fx", "'sss", "''s", "'ll've", "can't've", "o'clock", "rock'n'roll", "\u2019s",
        "I\u2019m", "'", "''", "'''", "' s", "'1", "'\u00e9t\u00e9", "C'est d\u00e9j\u00e0 l'\u00e9t\u00e9", "'Re'VE'lL'D",
        "I'm here, they've gone, it's OK", "\u2018quoted\u2019 \u201cdouble\u201d",
        "Hello world", "Hola mundo", "\u00bfA qu\u00e9 hora abren los lunes?", "Se\u00f1or Mu\u00f1oz \u2014 \u00edtem",
        "\u00e9 decomposed e\u0301", "\u00f1 and \u00d1", "\u00a1\u00a1\u00a1!!!", "Stra\u00dfe", "\u0130stanbul \u0131",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u6211\u559c\u6b22\u5403\u82f9\u679c\u3002",
        "\u4e2d\u6587English\u6df7\u5408mixed", "\uff08\u6d4b\u8bd5\uff09", "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\u3002",
        "\u30ab\u30bf\u30ab\u30ca\u30fc", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\uc548\ub155\ud558\uc138\uc694!",
        "\u4e00\u4e8c\u4e09 123 \u56db\u4e94\u516d", "\u3010\u91cd\u8981\u3011\u8bf7\u6ce8\u610f",
        "emoji \U0001F600 ok", "\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
        "\U0001F3F3\ufe0f\u200d\U0001F308", "\u2764\ufe0f", "\U0001F1EF\U0001F1F5\U0001F1FA\U0001F1F8",
        "\U0001F469\U0001F3FF\u200d\U0001F4BB", "1\ufe0f\u20e3", "I \u2764\ufe0f NY", "\U0001F602\U0001F602\U0001F602",
        "x\U0001F600y", "\u200d", "a\u200db", "\u200b", "\ufeffBOM", "soft\u00adhyphen", "\u200fRTL\u200e",
        "e\u0301", "a\u0300\u0301\u0302", "\u0301abc", "x\u0301\u0301", "\u0301", " \u0301", "\u0301\u0301\u0301",
        "a\u0316\u0301", "a\u0301\u0316", "q\u0307\u0323", "\u212b", "\u2126", "\u1e0b\u0323", "\u1e69",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334",
        "\u0915\u094d\u0937", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
        "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "\u0baa\u0bc6\u0baf\u0bb0\u0bcd", "\u0995\u09be\u09b0\u09cd\u09af",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u0627\u0644\u0633\u0651\u064e\u0644\u064e\u0627\u0645\u064f \u0639\u064e\u0644\u064e\u064a\u0652\u0643\u064f\u0645\u0652",
        "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd", "\u0634\u0643\u0631\u0627\u064b 123", "\u0410\u0411\u0412 \u043f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
        "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5", "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
        "x\u0301y", "1\u0301", "!\u0301", "\u0301!", " \u0301x", "\u093f", "a\u093fb",
        "\x00", "\x00\x01\x02", "a\x7fb", "\x1b[31mred\x1b[0m", "\ue000", "\U000F0000", "\u0378", "\ufffe\uffff", "\U0010FFFF",
        "<|im_start|>", "<|im_end|>", "<|im_start|>user\nhi<|im_end|>\n", "<think>\nfoo\n</think>\n\nbar",
        "<tool_call>\n<function=f>\n</function>\n</tool_call>", "<|endoftext|><|endoftext|>", "a<|im_start|>b",
        "<|im_start|", "<|im_start|><|im_start|>", "< |im_start| >", "<<|im_end|>>", "<|vision_start|><|image_pad|><|vision_end|>",
        "</think>", "<think></think>", "x<think>y", "<tool_response>\nok\n</tool_response>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
        "<|box_start|>(1,2)<|box_end|>", "<|IM_START|>", "<|im_start|>\u4f60\u597d",
        "def f(x):\n    return x + 1\n", "if (a && b) { return -1; }\n", "for i in range(10):\n\tprint(i)\n",
        "#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n}\n", "{\"key\": [1, 2.5, true, null], \"k2\": \"v\"}",
        "<div class=\"x\">Hello</div>", "SELECT * FROM t WHERE a = 'b';", "ls -la | grep \".txt\" > out.log 2>&1",
        "re.compile(r'^\\s*(\\d+)\\.(\\d+)$')", "x = a[i]->b.c; y += *p++;", "    \n    \n", "\r\n    indented\r\n",
        "func main() { fmt.Println(\"hi\") }", "code: func main() { fmt.Println(\"hi\") }", "const x = () => ({a: 1});",
        "a_b_c __init__ self.__dict__", "camelCaseIdentifier snake_case_identifier SCREAMING_CASE", "0x1F 0b1010 1e-9 1.5e+10",
        "email@example.com", "https://example.com/path?q=1&r=2#frag", "C:\\Users\\name\\file.txt", "e.g. U.S.A. i.e.",
        "a" * 1000, "ab" * 500, "x" * 5000, "1234567890" * 50, " " * 300, "\n" * 200, "!" * 300, "\u7684" * 500,
        "\U0001F600" * 200, "e\u0301" * 300, " " * 300 + "x", "\t" * 100 + "y", ".-" * 400,
        "Donaudampfschifffahrtsgesellschaftskapit\u00e4nswitwe" * 3, "supercalifragilisticexpialidocious" * 20,
        "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo" * 40, "https://example.com/" + "very/long/path/" * 60,
    ]
    c += [nfd(s) for s in ["\u00e9t\u00e9 caf\u00e9", "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u", "\ud55c\uad6d\uc5b4", "\u00c5ngstr\u00f6m",
                            "na\u00efve r\u00e9sum\u00e9", "\u1e9b\u0323", "\u01fa\u01fb", "Cr\u00e8me Br\u00fbl\u00e9e", "\u00fc\u00f6\u00e4\u00df",
                            "\u3073\u3071\u30d7\u30d0", "\u0958\u0959"]]
    return c

def random_cases(n, seed):
    rnd = random.Random(seed)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 3 + list("0123456789") * 2 +
            list("      \t\n\n\r") * 2 + list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") +
            list("sStTmMdDrReEvVlL'''") + ["\u017f", "\u00e9", "\u00f1", "\u00df", "\u0130", "\u0131"] +
            ["\u0301", "\u0308", "\u0323", "\u093f", "\u094d", "\u0e31", "\u0e35", "\u064e", "\u05b8", "\u20e3", "\ufe0f"] +
            list("\u65e5\u672c\u8a9e\u4f60\u597d\u4e16\u754c\u306e\u30c6\u30ad\ud55c\uad6d\u1100\u1161\u11a8") +
            ["\u3000", "\u00a0", "\u0085", "\u2003", "\u2028", "\x1c", "\x0b", "\x0c", "\u200d", "\u200b", "\ufeff"] +
            ["\u0663", "\u2460", "\u216b", "\u00bd", "\u00b2", "\uff11", "\uff0c", "\u3002", "\u2014", "\u2019", "\u201c"] +
            ["\U0001F600", "\U0001F44D", "\U0001F3FD", "\U0001F469", "\u2764", "\U0001F1EF"] +
            list("\u0645\u0631\u062d\u0628\u0627\u05e9\u05dc\u0410\u0431\u03b3\u0928\u092e\u0e2a\u0e27\u0915") +
            ["<think>", "</think>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<|endoftext|>", "<", "|", ">"] +
            ["'s", "'re", "'LL", "'Ve", "\r\n", " \n", "  ", "...", "->", "==", "123", "0.5"])
    out = []
    for _ in range(n):
        k = rnd.choice([1, 2, 3, 5, 8, 13, 21, 34])
        out.append("".join(rnd.choice(pool) for _ in range(k)))
    return out

def invalid_cases(seed):
    b = [b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98", b"hi \xf0\x9f\x98",
         b"\xed\xa0\x80", b"a\xed\xbf\xbfb", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf4\x90\x80\x80",
         b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80", b"\x80\x80\x80", b"\xbf", b"\xe6\x97\xa5\xe6\x9c",
         b"\xe6\x97\xa5\xe6\x9c\xac", b"x\xc3\xa9\xc3", b"<|im_start|>\xff<|im_end|>", b"I'\xffs", b" \xa0 ", b"\xc2\xa0\xa0",
         b"\xf1\x80\x80", b"\xf1\x80\x80\x80", b"\xef\xbf\xbd\xff", b"\xe1\x80\xe1\x80\x80"]
    rnd = random.Random(seed)
    for _ in range(40):
        n = rnd.randint(1, 24)
        b.append(bytes(rnd.choice([rnd.randint(0, 255), rnd.randint(0x80, 0xff), ord(rnd.choice("ab \n'"))]) for _ in range(n)))
    return b

def main():
    t3, t35 = load()
    texts = hand_cases() + random_cases(380, 1234)
    # unicode-version guard: nothing assigned after 14.0 (oniguruma in tokenizers is newer)
    allowed_cn = {0x378, 0xFFFE, 0xFFFF, 0x10FFFF}
    for s in texts:
        for ch in s:
            if unicodedata.category(ch) == "Cn": assert ord(ch) in allowed_cn, hex(ord(ch))
    lines = []
    seen = set()
    for s in texts:
        if s in seen: continue
        seen.add(s)
        rec = {"text": s}
        rec["qwen3"] = t3.encode(s, add_special_tokens=False).ids
        rec["qwen35re"] = t35.encode(s, add_special_tokens=False).ids
        n = unicodedata.normalize("NFC", s)
        if n != s: rec["nfc"] = n
        if s and not any(a.content in s for a in t3.get_added_tokens_decoder().values()):
            # the pre-tokens themselves (raw text pieces), so the scanner is checked directly
            for key, t in (("pre3", t3), ("pre35", t35)):
                norm = t.normalizer.normalize_str(s)
                rec[key] = [norm[a:b] for _, (a, b) in t.pre_tokenizer.pre_tokenize_str(norm)]
        lines.append(rec)
    for b in invalid_cases(99):
        s = b.decode("utf-8", errors="replace")
        rec = {"hex": b.hex(), "qwen3": t3.encode(s, add_special_tokens=False).ids,
               "qwen35re": t35.encode(s, add_special_tokens=False).ids, "replaced": s}
        lines.append(rec)
    # the two pre-tokenizers must disagree somewhere, or the variant tests nothing
    assert sum(r["qwen3"] != r["qwen35re"] for r in lines) > 3
    with open(OUT, "w", encoding="utf-8") as f:
        for r in lines: f.write(json.dumps(r, ensure_ascii=True) + "\n")
    print("wrote %d cases to %s (%d differ between the two regexes)" % (len(lines), OUT, sum(r["qwen3"] != r["qwen35re"] for r in lines)))

if __name__ == "__main__":
    main()
