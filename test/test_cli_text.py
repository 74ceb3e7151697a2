"""the text path of the cli end to end on the cpu with `tiny`: --tokenize (against hf tokenizers),
--render (against the transformers/jinja2 template goldens), --prompt / --messages / --raw-prompt
generation, stop strings, and utf-8-clean output."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
TINY = os.path.join(ROOT, "build/models/tiny.ninfer")
FIXTURES = os.environ.get("NINFER_FIXTURES", os.path.join(ROOT, "..", "shared", "fixtures"))


def ninfer(*args, stdin=None):
    r = subprocess.run([BIN, TINY, *args], input=stdin, capture_output=True, timeout=120)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", "replace")


STRINGS = ["Hello world", "", "  leading spaces\r\nand 12345 digits", "日本語のテキスト 😀👍🏽", "e\u0301 café",
           "<|im_start|>user\nhi<|im_end|>", "I'm here, they've gone, it's OK", "def f(x):\n\treturn x**2  # ok"]


@pytest.mark.parametrize("text", STRINGS)
def test_tokenize_matches_hf(text):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(os.path.join(FIXTURES, "qwen3-tokenizer", "tokenizer.json"))
    rc, out, err = ninfer("--tokenize", stdin=text.encode())
    assert rc == 0, err
    assert [int(x) for x in out.split()] == hf.encode(text, add_special_tokens=False).ids


def golden(name):
    for line in open(os.path.join(ROOT, "test/golden/template_cases.jsonl")):
        row = json.loads(line)
        if row["name"] == name:
            return row
    raise KeyError(name)


@pytest.mark.parametrize("name,flags", [("user_only", []), ("user_no_thinking", ["--no-thinking"])])
def test_render_matches_the_template(tmp_path, name, flags):
    row = golden(name)
    f = tmp_path / "m.json"
    f.write_text(json.dumps(row["messages"]))
    rc, out, err = ninfer("--messages", str(f), "--render", *flags)
    assert rc == 0, err
    assert out.decode() == row["output"]


def test_render_with_tools(tmp_path):
    row = golden("tools_no_system")
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"messages": row["messages"], "tools": row["tools"]}))
    rc, out, err = ninfer("--messages", str(f), "--render", *(["--no-thinking"] if row["options"].get("enable_thinking") is False else []))
    assert rc == 0, err
    assert out.decode() == row["output"]


def test_prompt_generates_utf8_content():
    rc, out, err = ninfer("--prompt", "Write a haiku.", "--no-thinking", "--max-new", "24", "--seed", "1", "--cpu")
    assert rc == 0, err
    out.decode("utf-8")  # strict: nothing invalid is ever printed
    assert "tok/s" in err


def test_thinking_goes_to_stderr():
    rc, out, err = ninfer("--prompt", "Hi", "--max-new", "16", "--greedy", "--cpu")
    assert rc == 0, err
    # the prompt opened <think>: output is reasoning until </think>, and reasoning is not on stdout
    rc2, raw, _ = ninfer("--prompt", "Hi", "--max-new", "16", "--greedy", "--cpu", "--raw-output")
    assert rc2 == 0
    if b"</think>" not in raw:
        assert out.strip() == b""


def test_stop_string_cuts_the_output():
    rc, full, err = ninfer("--raw-prompt", "The quick brown fox", "--greedy", "--max-new", "40", "--cpu")
    assert rc == 0, err
    text = full.decode()
    cut = len(text) // 2
    stop = text[cut:cut + 3]
    if not stop.strip():
        pytest.skip("the greedy text has no usable stop string here")
    rc, out, err = ninfer("--raw-prompt", "The quick brown fox", "--greedy", "--max-new", "40", "--cpu", "--stop", stop)
    assert rc == 0, err
    assert out.decode() == text[:text.index(stop)] + "\n"
    assert "stopped on a stop string" in err


def test_messages_file_errors_are_one_line(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]))
    rc, out, err = ninfer("--messages", str(f), "--render")
    assert rc == 1 and out == b""
    assert err.count("\n") == 1 and "System message must be at the beginning." in err
    f.write_text("{not json")
    rc, out, err = ninfer("--messages", str(f))
    assert rc == 1 and err.count("\n") == 1
