"""the ninfer cli on artifacts: --info reports the geometry convert.py made, and every corrupted
file ends in one clear stderr line and a non-zero exit (never a crash)."""
import json
import os
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
MODELS = os.path.join(ROOT, "build/models")


def ninfer(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name,expect", [
    ("tiny", ["hidden          128", "layers          8 (6 gated deltanet, 2 full attention: 3 7)",
              "attention       2 query heads, 1 kv heads, head dim 256", "deltanet        2 key heads, 4 value heads",
              "mlp             384", "vocab           151936 rows, untied output head", "weights_id      groupwise-int"]),
    ("tiny-gqa1-bf16", ["attention       4 query heads, 2 kv heads", "deltanet        2 key heads, 2 value heads",
                        "mlp             256", "tied (embedding)", "weights_id      bf16"]),
    ("tiny-gqa3", ["attention       6 query heads, 1 kv heads", "deltanet        2 key heads, 6 value heads",
                   "vision          depth 2, width 128, 2 heads"]),
])
def test_info_reports_geometry(name, expect):
    r = ninfer(os.path.join(MODELS, name + ".ninfer"), "--info")
    assert r.returncode == 0, r.stderr
    for line in expect:
        assert line in r.stdout, (line, r.stdout)
    assert "frontend/tokenizer.json" in r.stdout
    assert r.stderr == ""  # diagnostics on stdout only when asked for; nothing else


def split(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[8:16])[0]
    payload = (16 + n + 4095) // 4096 * 4096
    return data, json.loads(data[16:16 + n]), data[payload:]


def assemble(directory, payload, magic=b"NINFER\x00\x02"):
    js = json.dumps(directory, separators=(",", ":"), ensure_ascii=False).encode()
    head = magic + struct.pack("<Q", len(js)) + js
    return head + bytes(-len(head) % 4096) + payload


def corruptions():
    data, d, payload = split(os.path.join(MODELS, "tiny.ninfer"))

    def edited(fn):
        dd = json.loads(json.dumps(d))
        fn(dd)
        return assemble(dd, payload)

    def drop(name):
        return lambda dd: dd.__setitem__("objects", [o for o in dd["objects"] if o["name"] != name])

    def set_field(name, key, value):
        def fn(dd):
            for o in dd["objects"]:
                if o["name"] == name:
                    o[key] = value
        return fn

    return {
        "empty": (b"", "empty file"),
        "bad_magic": (b"GGUF" + data[4:], "bad magic"),
        "version_3": (data[:7] + b"\x03" + data[8:], "version 3"),
        "truncated_prefix": (data[:12], "too short"),
        "truncated_json": (data[:100], "json_bytes"),
        "truncated_payload": (data[:len(data) // 2], "past the end of the file"),
        "json_garbage": (data[:16] + b"[" + data[17:], "not valid json"),
        "missing_tensor": (edited(drop("text/layers/0/mlp/down")), "missing tensor 'text/layers/0/mlp/down'"),
        "bad_format": (edited(set_field("text/final_norm", "format", "BF8")), "unknown numeric format 'BF8'"),
        "bad_bytes": (edited(set_field("text/final_norm", "bytes", 3)), "'text/final_norm': bytes is 3"),
        "misaligned": (edited(set_field("text/final_norm", "offset", 1)), "'text/final_norm'"),
        "extra_member": (edited(set_field("text/final_norm", "dtype", "bf16")), "exactly the members"),
        "bad_identity": (edited(lambda dd: dd["identity"].pop("weights_id")), "identity must have exactly"),
    }


@pytest.mark.parametrize("case", sorted(corruptions().keys()))
def test_corrupted_file_one_line_error(tmp_path, case):
    blob, expect = corruptions()[case]
    path = tmp_path / (case + ".ninfer")
    path.write_bytes(blob)
    r = ninfer(str(path), "--info")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ninfer: error: " + str(path)), lines[0]
    assert expect in lines[0], (expect, lines[0])


def test_missing_file_and_directory(tmp_path):
    r = ninfer(str(tmp_path / "nope.ninfer"), "--info")
    assert r.returncode == 1 and "cannot open" in r.stderr
    r = ninfer(str(tmp_path), "--info")
    assert r.returncode == 1 and "not a regular file" in r.stderr
