"""--spec mtp --draft-tokens K [--lm-head-draft] through the real binaries on the cpu reference path
(the kjv demo model, which has a trained mtp head and a draft head): NInfer's flag rules and
one-line errors, an artifact without the mtp module or the draft head refused at start, greedy
output identical to plain decoding with the statistics on stderr, and the server's
usage.speculative (openai and anthropic sdks) and request log with NInfer's field names."""
import json
import time
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from test_cli_cpu import one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
KJV = os.path.join(ROOT, "models/kjv/kjv.ninfer")
KJV_HF = os.path.join(ROOT, "models/kjv/hf")


def ninfer(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)




@pytest.mark.parametrize("args, words", [
    (["--spec", "mtp"], ["--spec mtp needs --draft-tokens"]),
    (["--draft-tokens", "3"], ["--draft-tokens needs --spec"]),
    (["--spec", "mtp", "--draft-tokens", "6"], ["--draft-tokens for --spec mtp is 1..5"]),
    (["--spec", "mtp", "--draft-tokens", "0"], ["--draft-tokens", "outside"]),
    (["--lm-head-draft"], ["--lm-head-draft needs --spec"]),
    (["--spec", "eagle", "--draft-tokens", "3"], ["--spec", "'eagle'", "mtp, dflash"]),
    (["--spec", "dflash", "--draft-tokens", "3"], ["--spec dflash is not supported"]),
    (["--spec", "mtp", "--draft-tokens", "3", "--logits-out", "/tmp/x.f32"], ["--logits-out cannot be combined with --spec"]),
])
def test_flag_rules(args, words):
    one_line_error(ninfer(KJV, "--cpu", "--raw-prompt", "And", "--max-new", "4", *args), *words)


@pytest.fixture(scope="module")
def stripped(tmp_path_factory):
    """kjv converted without its mtp module, and without its draft head"""
    d = tmp_path_factory.mktemp("spec")
    import convert as cv
    ck = d / "kjv-nomtp-hf"
    os.makedirs(ck)
    for f in os.listdir(KJV_HF):
        if f not in ("model.safetensors", "config.json"):
            os.symlink(os.path.join(KJV_HF, f), ck / f)
    cfg = json.load(open(os.path.join(KJV_HF, "config.json")))
    tc = cfg.get("text_config", cfg)
    tc["mtp_num_hidden_layers"] = 0
    (ck / "config.json").write_text(json.dumps(cfg))
    src = cv.SafetensorsSource([os.path.join(KJV_HF, "model.safetensors")])
    names = [n for n in src.names() if not n.startswith("mtp.")]
    tensors = [(n, src.dtype(n), src.shape(n)) for n in names]
    head, _, _ = cv.st_header_bytes(tensors)
    with open(ck / "model.safetensors", "wb") as f:
        f.write(head)
        for n in names:
            f.write(np.ascontiguousarray(src.raw(n)).tobytes())
    conv = [sys.executable, os.path.join(ROOT, "convert.py")]
    subprocess.run(conv + [str(ck), "-o", str(d / "nomtp.ninfer")], check=True, capture_output=True)
    subprocess.run(conv + [KJV_HF, "-o", str(d / "nodraft.ninfer"), "--draft-rows", "0"], check=True, capture_output=True)
    return d


def test_artifact_without_mtp_or_draft_head_is_refused_at_start(stripped):
    nomtp, nodraft = str(stripped / "nomtp.ninfer"), str(stripped / "nodraft.ninfer")
    assert ninfer(nomtp, "--cpu", "--raw-prompt", "And", "--max-new", "2", "--greedy").returncode == 0
    one_line_error(ninfer(nomtp, "--cpu", "--raw-prompt", "And", "--spec", "mtp", "--draft-tokens", "2"),
                   "nomtp.ninfer", "--spec mtp needs the mtp module")
    one_line_error(ninfer(nodraft, "--cpu", "--raw-prompt", "And", "--spec", "mtp", "--draft-tokens", "2", "--lm-head-draft"),
                   "nodraft.ninfer", "--lm-head-draft needs a draft head")
    r = ninfer(nodraft, "--cpu", "--raw-prompt", "And", "--max-new", "8", "--greedy", "--spec", "mtp", "--draft-tokens", "2")
    assert r.returncode == 0, r.stderr
    # the server refuses the same way, before listening
    serve = os.path.join(ROOT, "build/test/ninfer-serve")
    p = subprocess.run([serve, nomtp, "--port", "0", "--spec", "mtp", "--draft-tokens", "3"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "--spec mtp needs the mtp module" in p.stderr, p.stderr


def test_greedy_text_is_plain_decodings_and_stats_go_to_stderr():
    def reasoning(r):  # stderr up to the stats line: the reasoning channel
        return r.stderr[:r.stderr.index("ninfer: cpu;")]
    # thinking on: all 120 tokens are reasoning (stderr); off: the answer (stdout)
    think = ["--cpu", "--prompt", "Who was Moses?", "--greedy", "--max-new", "120"]
    plain = ninfer(KJV, *think)
    r = ninfer(KJV, *think, "--spec", "mtp", "--draft-tokens", "2")
    assert plain.returncode == 0 and r.returncode == 0, r.stderr
    assert len(reasoning(plain)) > 200 and reasoning(r) == reasoning(plain) and r.stdout == plain.stdout
    base = think + ["--no-thinking"]
    plain = ninfer(KJV, *base)
    assert plain.returncode == 0 and len(plain.stdout) > 200, plain.stderr
    for extra in (["--draft-tokens", "3"], ["--draft-tokens", "5", "--lm-head-draft"]):
        r = ninfer(KJV, *base, "--spec", "mtp", *extra)
        assert r.returncode == 0, r.stderr
        assert r.stdout == plain.stdout
        line = [l for l in r.stderr.splitlines() if l.startswith("ninfer: mtp K=")]
        assert len(line) == 1, r.stderr
        for w in ("rounds", "drafted", "accepted", "acceptance per position", "tokens/round"):
            assert w in line[0], line[0]
    # a stop string landing inside a round: the same text, cut at the same place
    words = plain.stdout.split()
    assert len(words) > 12
    stop = words[10]
    cut = ninfer(KJV, *base, "--stop", stop)
    spec = ninfer(KJV, *base, "--stop", stop, "--spec", "mtp", "--draft-tokens", "4")
    assert cut.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == cut.stdout and len(cut.stdout) < len(plain.stdout)
    assert "stopped on a stop string" in spec.stderr
    ids = ninfer(KJV, "--cpu", "--prompt-ids", "3036,479,347,1053", "--greedy", "--max-new", "64")
    spec = ninfer(KJV, "--cpu", "--prompt-ids", "3036,479,347,1053", "--greedy", "--max-new", "64", "--spec", "mtp", "--draft-tokens", "2")
    assert ids.stdout == spec.stdout and len(ids.stdout.split()) == 64


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    from test_serve import Server
    log = tmp_path_factory.mktemp("speclog") / "requests.jsonl"
    s = Server("--max-context", "1024", "--default-max-tokens", "48", "--spec", "mtp", "--draft-tokens", "3",
               "--lm-head-draft", "--request-log-jsonl", str(log), cmd=[os.path.join(ROOT, "build/test/ninfer-serve"), KJV])
    s.logfile = log
    yield s
    assert s.stop() == 0


def check_spec(sp, completion):
    assert set(sp) == {"backend", "draft_window", "rounds", "drafted_tokens", "accepted_tokens", "accepted_per_position"}, sp
    assert sp["backend"] == "mtp" and sp["draft_window"] == 3
    assert sp["rounds"] >= 1 and sp["drafted_tokens"] == 3 * sp["rounds"]
    assert 0 <= sp["accepted_tokens"] <= sp["drafted_tokens"]
    assert len(sp["accepted_per_position"]) == 3 and sum(sp["accepted_per_position"]) == sp["accepted_tokens"]
    assert sp["accepted_per_position"] == sorted(sp["accepted_per_position"], reverse=True)  # draft k needs k-1 before it
    assert completion <= 1 + sp["rounds"] + sp["accepted_tokens"]  # a round makes accepted + 1 tokens


def test_server_usage_speculative_and_request_log(spec_server):
    import anthropic
    import openai
    base = f"http://127.0.0.1:{spec_server.port}"
    oc = openai.OpenAI(base_url=base + "/v1", api_key="x", timeout=120, max_retries=0)
    r = oc.chat.completions.create(model="qwen3.5-kjv", messages=[{"role": "user", "content": "Who was Moses?"}],
                                   max_tokens=40, temperature=0)
    u = r.usage.model_dump()
    check_spec(u["speculative"], u["completion_tokens"])
    chunks = list(oc.chat.completions.create(model="qwen3.5-kjv", messages=[{"role": "user", "content": "Tell me of Noah."}],
                                             max_tokens=24, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1].usage.model_dump()
    check_spec(last["speculative"], last["completion_tokens"])
    ac = anthropic.Anthropic(base_url=base, api_key="x", timeout=120, max_retries=0)
    m = ac.messages.create(model="qwen3.5-kjv", max_tokens=24, messages=[{"role": "user", "content": "Who was David?"}])
    check_spec(m.usage.model_dump()["speculative"], m.usage.output_tokens)
    spec_server.wait_log(r"spec=mtp/3 rounds=\d+ drafted=\d+ accepted=\d+")
    deadline = time.time() + 10  # the log line is written after the response has gone out
    while True:
        done = [json.loads(l) for l in open(spec_server.logfile) if '"request_done"' in l]
        if len(done) >= 3 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert len(done) == 3
    for e in done:
        sp = e["speculative"]
        assert set(sp) == {"backend", "draft_window", "rounds", "drafted_tokens", "accepted_tokens", "fallback_steps",
                           "accepted_per_position"}, sp
        assert sp["backend"] == "mtp" and sp["fallback_steps"] == 0
