#!/usr/bin/env python3
# tokenizer throughput, ours (build/bench_tokenizer) against hf tokenizers, same machine and
# input; also checks that both produce the same ids on the whole input.
#   g++ -std=c++17 -O2 -I. test/bench_tokenizer.cc -o build/bench_tokenizer -lpthread
#   python3 test/bench_tokenizer.py
# inputs (written to test/tmp/, not committed):
#   english.txt: the first ~1 MB of the KJV bible (apt-get install bible-kjv; bible 'gen1:1-rev22:21')
#   mixed.txt:   ~1 MB alternating CJK text (python's test/cjkencodings/*-utf8.txt samples and the
#                zh_CN gettext catalogs on this machine) and code (python stdlib sources, C headers)
# hf: Tokenizer.encode(text) on the whole text, and encode_batch over lines, with
# RAYON_NUM_THREADS=1 (single core, timed in process cpu time like ours) and with the default
# thread pool (wall time). cold = first call, warm = best of 4 more.
import gettext, glob, hashlib, json, os, subprocess, sys, sysconfig, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TMP = os.path.join(ROOT, "test", "tmp")
FIX = os.path.join(ROOT, "..", "shared", "fixtures", "qwen3-tokenizer", "tokenizer.json")
if not os.path.exists(FIX): FIX = "/work/shared/fixtures/qwen3-tokenizer/tokenizer.json"
MB = 1_000_000

def english():
    out = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, check=True).stdout.decode("utf-8")
    cut = out[:MB]
    return cut[:cut.rfind("\n") + 1]

def mixed():
    cjk = []
    for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "test", "cjkencodings", "*-utf8.txt"))):
        cjk.append(open(p, encoding="utf-8").read())
    for p in sorted(glob.glob("/usr/share/locale/zh_CN/LC_MESSAGES/*.mo")):
        try:
            with open(p, "rb") as f: t = gettext.GNUTranslations(f)
            cjk.append("\n".join(v for k, v in sorted(t._catalog.items(), key=lambda kv: str(kv[0])) if isinstance(v, str) and v))
        except Exception:
            pass
    code = []
    std = sysconfig.get_paths()["stdlib"]
    for p in sorted(glob.glob(os.path.join(std, "*.py")))[:200] + sorted(glob.glob("/usr/include/*.h"))[:200]:
        try: code.append(open(p, encoding="utf-8").read())
        except Exception: pass
    cjk_text, code_text = "\n".join(cjk), "\n".join(code)
    out, i, j = [], 0, 0
    while sum(len(x.encode()) for x in out) < MB:
        out.append(cjk_text[i:i + 4000]); i = (i + 4000) % max(1, len(cjk_text) - 4000)
        out.append(code_text[j:j + 6000]); j = (j + 6000) % max(1, len(code_text) - 6000)
    s = "".join(out).encode("utf-8")[:MB].decode("utf-8", errors="ignore")
    return s

def hf_time(text, threads):
    env = dict(os.environ)
    if threads: env["RAYON_NUM_THREADS"] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"
    code = r'''
import sys, time, json
from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1]); text = open(sys.argv[2], encoding="utf-8", newline="").read()
lines = text.splitlines(keepends=True)
clock = time.process_time if sys.argv[4] == "1" else time.perf_counter
def best(f, n=5):
    r = []
    for _ in range(n):
        a = clock(); f(); r.append(clock() - a)
    return r[0], min(r[1:])
cold, warm = best(lambda: t.encode(text, add_special_tokens=False))
bcold, bwarm = best(lambda: t.encode_batch(lines, add_special_tokens=False))
ids = t.encode(text, add_special_tokens=False).ids
open(sys.argv[3], "w").write("\n".join(map(str, ids)) + "\n")
print(json.dumps({"cold": cold, "warm": warm, "bcold": bcold, "bwarm": bwarm, "n": len(ids)}))
'''
    out = subprocess.run([sys.executable, "-c", code, FIX, text, text + ".hf.ids", str(threads)], env=env, capture_output=True, check=True).stdout
    return json.loads(out)

def main():
    os.makedirs(TMP, exist_ok=True)
    bench = os.path.join(ROOT, "build", "bench_tokenizer")
    for name, make in (("english", english), ("mixed", mixed)):
        path = os.path.join(TMP, name + ".txt")
        text = make()
        open(path, "w", encoding="utf-8", newline="").write(text)
        data = open(path, "rb").read()
        mb = len(data) / MB
        print("%s: %s, %.3f MB, sha256 %s" % (name, path, mb, hashlib.sha256(data).hexdigest()[:16]))
        if os.path.exists(bench):
            r = subprocess.run([bench, FIX, path, path + ".ours.ids", "5"], capture_output=True, text=True)
            print("  " + r.stdout.strip())
        for threads in (1, 0):
            h = hf_time(path, threads)
            print("  hf tokenizers (%s): encode cold %.1f MB/s warm %.1f MB/s; encode_batch(lines) cold %.1f warm %.1f MB/s; %d tokens"
                  % ("1 thread, cpu time" if threads == 1 else "default threads, wall time", mb / h["cold"], mb / h["warm"], mb / h["bcold"], mb / h["bwarm"], h["n"]))
        if os.path.exists(path + ".ours.ids"):
            same = open(path + ".ours.ids").read().split() == open(path + ".hf.ids").read().split()
            print("  ids identical to hf: %s" % same)

if __name__ == "__main__":
    main()
