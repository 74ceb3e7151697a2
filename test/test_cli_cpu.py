"""the ninfer cli on the cpu reference path: generation from token ids, --logits-out, --perplexity,
and one clear stderr line with exit 1 for every bad input (behaviour contract: stdout carries only
the output, stats and notices go to stderr)."""
import os
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
TINY = os.path.join(ROOT, "build/models/tiny.ninfer")
TINY_BF16 = os.path.join(ROOT, "build/models/tiny-bf16.ninfer")
VOCAB, DOMAIN = 151936, 151669  # the synthetic models' rows, and the ids of their (qwen3) tokenizer

pytestmark = pytest.mark.skipif(not os.path.exists(TINY), reason="make models first")


def ninfer(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def ids_of(stdout):
    return [int(x) for x in stdout.split()]


def test_greedy_generation_prints_ids_and_stats():
    r = ninfer(TINY, "--cpu", "--prompt-ids", "1,2,3,4,5", "--max-new", "12", "--greedy")
    assert r.returncode == 0, r.stderr
    out = ids_of(r.stdout)
    assert 1 <= len(out) <= 12 and all(0 <= i < DOMAIN for i in out)
    assert r.stdout.endswith("\n") and r.stdout.count("\n") == 1
    assert "tok/s" in r.stderr
    assert ninfer(TINY, "--cpu", "--prompt-ids", "1 2 3 4 5", "--max-new", "12", "--greedy").stdout == r.stdout


def test_sampling_is_reproducible_by_seed():
    args = [TINY_BF16, "--cpu", "--prompt-ids", "7,8,9", "--max-new", "16", "--temperature", "1.0", "--top-k", "0",
            "--top-p", "1.0", "--presence-penalty", "0"]
    a = ninfer(*args, "--seed", "5")
    b = ninfer(*args, "--seed", "5")
    c = ninfer(*args, "--seed", "6")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    assert a.stdout != c.stdout  # 16 draws over a flat-ish distribution: equal only by accident


def test_no_gpu_notice_without_cpu_flag():
    r = ninfer(TINY, "--prompt-ids", "1,2", "--max-new", "2", "--greedy")
    assert r.returncode == 0, r.stderr
    assert "cpu reference path" in r.stderr.splitlines()[0]


def test_logits_out_matches_the_first_greedy_token(tmp_path):
    f = tmp_path / "logits.f32"
    r = ninfer(TINY, "--cpu", "--prompt-ids", "11,22,33,44", "--max-new", "1", "--greedy", "--logits-out", str(f))
    assert r.returncode == 0, r.stderr
    lg = np.fromfile(f, dtype="<f4")
    assert lg.size == 4 * VOCAB
    lg = lg.reshape(4, VOCAB)
    assert np.isfinite(lg).all()
    assert ids_of(r.stdout) == [int(np.argmax(lg[-1, :DOMAIN]))]


def test_perplexity_over_a_token_file(tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text("5 6 7 8\n9, 10, 11\n12\n")
    r = ninfer(TINY, "--cpu", "--perplexity", str(f), "--max-context", "4")
    assert r.returncode == 0, r.stderr
    # windows [5 6 7 8] [9 10 11 12]: 3 scored tokens each
    assert r.stdout.startswith("perplexity: ") and r.stdout.rstrip().endswith(" over 6 tokens"), r.stdout
    assert float(r.stdout.split()[1]) > 1.0


def one_line_error(r, *words):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("args,words", [
    (["--prompt-ids", "1,x,3"], ["--prompt-ids", "not a list of token ids"]),
    (["--prompt-ids", ""], ["--prompt-ids"]),
    (["--prompt-ids", f"1,{DOMAIN}"], ["outside the token domain", str(DOMAIN)]),
    (["--prompt-ids", "1,2,3,4,5", "--max-context", "4"], ["no room left in --max-context 4"]),
    (["--prompt-ids", "1", "--temperature", "abc"], ["--temperature", "not a number"]),
    (["--prompt-ids", "1", "--top-p", "1.5"], ["--top-p", "outside"]),
    (["--prompt-ids", "1", "--max-new", "-1"], ["--max-new", "outside"]),
    (["--prompt-ids", "1", "--seed", "-3"], ["--seed"]),
    (["--prompt-ids", "1", "--stop-token-id", str(DOMAIN + 5)], ["--stop-token-id", "outside the token domain"]),
    (["--prompt-ids", "1", "--max-context"], ["--max-context needs a value"]),
    ([], ["nothing to do"]),
    (["--logits-out", "/tmp/x.f32"], ["--logits-out needs a prompt"]),
])
def test_bad_input_is_one_line_and_exit_1(args, words):
    one_line_error(ninfer(TINY, "--cpu", *args), *words)


def test_text_perplexity_file_is_tokenized(tmp_path):
    # a text file is tokenized with the artifact's tokenizer: the same perplexity as its ids
    f = tmp_path / "text.txt"
    f.write_text("In the beginning God created the heaven and the earth.\n")
    r = ninfer(TINY, "--cpu", "--perplexity", str(f))
    assert r.returncode == 0, r.stderr
    tok = subprocess.run([BIN, TINY, "--tokenize"], input=f.read_text(), capture_output=True, text=True, timeout=60)
    assert tok.returncode == 0, tok.stderr
    g = tmp_path / "ids.txt"
    g.write_text(tok.stdout)
    r2 = ninfer(TINY, "--cpu", "--perplexity", str(g))
    assert r2.returncode == 0 and r2.stdout == r.stdout, (r.stdout, r2.stdout)

# issue 11, defect 8: cli inputs the server would refuse, refused the same way; nothing ignored
def test_invalid_utf8_prompt_refused():
    for flag in ("--prompt", "--raw-prompt"):
        r = subprocess.run([BIN, TINY, "--cpu", flag, b"caf\xc3 ok".decode("utf-8", "surrogateescape"), "--max-new", "1"],
                           capture_output=True, text=True, timeout=120, errors="replace")
        one_line_error(r, flag, "not valid utf-8", "byte 3")


def test_info_with_a_prompt_is_a_usage_error():
    one_line_error(ninfer(TINY, "--info", "--prompt", "hi"), "--info", "takes no --prompt")
    one_line_error(ninfer(TINY, "--info", "--tokenize"), "--info")


def test_messages_directory_says_so(tmp_path):
    one_line_error(ninfer(TINY, "--cpu", "--messages", str(tmp_path)), str(tmp_path), "is a directory")


def test_messages_bad_arguments_name_the_message(tmp_path):
    f = tmp_path / "m.json"
    f.write_text('[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]}]')
    one_line_error(ninfer(TINY, "--cpu", "--messages", str(f)), "messages[1].tool_calls[0].function.arguments")


def test_kv_flags_on_the_cpu_path_refused():
    one_line_error(ninfer(TINY, "--cpu", "--prompt-ids", "1,2", "--kv-capacity", "4096"), "--kv-capacity", "cpu")
    one_line_error(ninfer(TINY, "--cpu", "--prompt-ids", "1,2", "--kv-capacity", "auto"), "--kv-capacity")
    one_line_error(ninfer(TINY, "--cpu", "--prompt-ids", "1,2", "--kv-dtype", "int8"), "--kv-dtype")
    # the one capacity the cpu path has is honoured
    r = ninfer(TINY, "--cpu", "--prompt-ids", "1,2", "--max-new", "1", "--max-context", "64", "--kv-capacity", "64")
    assert r.returncode == 0, r.stderr


def test_model_path_case_hint(tmp_path):
    (tmp_path / "qwen3_5_4B.ninfer").write_bytes(open(TINY, "rb").read(4096))
    r = ninfer(str(tmp_path / "qwen3_5_4b.ninfer"), "--cpu", "--prompt", "hi")
    one_line_error(r, "cannot open", f"did you mean '{tmp_path}/qwen3_5_4B.ninfer'?")
    r = ninfer(str(tmp_path / "other.ninfer"), "--info")
    assert r.returncode == 1 and "did you mean" not in r.stderr
