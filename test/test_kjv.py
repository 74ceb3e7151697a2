"""the demo model (models/kjv): it prints scripture, and its held-out perplexity stays where
it was measured. regression bounds:
  - cpu path, groupwise-int artifact, first 6000 bytes of the held-out text (models/kjv/val.txt,
    1978 scored tokens), windows of 256: 19.7425 when measured (2026-11-29), bound +-0.5%
  - the whole held-out text (71,821 scored tokens) gives 18.7417 (groupwise-int) and 18.6653
    (bf16 artifact), against train.py's 18.667 for the bf16 checkpoint; too slow for ci."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
KJV = os.path.join(ROOT, "models/kjv/kjv.ninfer")


def ninfer(*args):
    return subprocess.run([BIN, KJV, *args], capture_output=True, text=True, timeout=300)


def test_demo_prints_scripture():
    r = ninfer("--raw-prompt", "And God said", "--greedy", "--max-new", "40")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(" unto "), out
    words = out.split()
    assert len(words) >= 25
    for w in ("unto", "said", "thee"):
        assert w in out, (w, out)
    assert all(32 <= ord(c) < 127 or c == "\n" for c in out), out


def test_heldout_perplexity_regression(tmp_path):
    text = open(os.path.join(ROOT, "models/kjv/val.txt"), "rb").read()[:6000]
    p = tmp_path / "val6000.txt"
    p.write_bytes(text)
    r = ninfer("--perplexity", str(p), "--max-context", "256", "--cpu")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("perplexity: ") and line.endswith(" over 1978 tokens"), line
    ppl = float(line.split()[1])
    assert abs(ppl - 19.7425) <= 0.005 * 19.7425, ppl


def has_gpu():
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) if os.path.exists("/usr/bin/nvidia-smi") else None
    return r is not None and r.returncode == 0 and "GPU" in r.stdout


# gpu kv formats on the same 6000 bytes: bf16 activations and kv sit within 0.5% of the cpu's
# fp32 value; int8 and fp8 kv within 1% (whole held-out text on the h200, 2026-11-29:
# bf16 kv 18.7412, int8 18.7404, fp8 18.7439, cpu 18.7417)
def test_heldout_perplexity_gpu_kv_formats(tmp_path):
    if not has_gpu():
        pytest.skip("no gpu")
    text = open(os.path.join(ROOT, "models/kjv/val.txt"), "rb").read()[:6000]
    p = tmp_path / "val6000.txt"
    p.write_bytes(text)
    for kv, bound in (("bf16", 0.005), ("int8", 0.01), ("fp8", 0.01)):
        r = ninfer("--perplexity", str(p), "--max-context", "256", "--kv-dtype", kv)
        assert r.returncode == 0, r.stderr
        ppl = float(r.stdout.split()[1])
        assert abs(ppl - 19.7425) <= bound * 19.7425, (kv, ppl)
