# tests for convert.py: the canonical encoder against a scalar re-implementation of format.md §6.3,
# the row-split layout (§7.2, §7.3), the 9b plan (§8), and synthetic end-to-end conversions.
# run: python3 -m pytest -q test/test_convert.py   (about a minute on 2 cores)

import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import convert as cv  # noqa: E402

CONVERT = os.path.join(ROOT, "convert.py")
Q4, Q5, Q6, W8 = "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"

def run(*args, check=True):
    p = subprocess.run([sys.executable, CONVERT] + [str(a) for a in args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError("convert.py %s failed:\n%s" % (" ".join(map(str, args)), p.stderr))
    return p

def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

# -----------------------------------------------------------------------------
# a scalar MAXABS_F16_RECIP_RNE_V1, written straight from format.md §6.3 with python floats and
# struct. doubles are wide enough that one double op followed by a rounding to f32 is the
# correctly rounded f32 op (53 >= 2*24 + 2), and struct 'e'/'f' round to nearest even.

def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]

def f16_word(v):
    return struct.unpack("<H", struct.pack("<e", v))[0]

def f16_value(w):
    return struct.unpack("<e", struct.pack("<H", w))[0]

def ref_encode(x, fmt):
    bits, g, qmin, qmax, hb = cv.GROUPED[fmt]
    n, k = x.shape
    k_pad = (k + 127) // 128 * 128
    codes = np.zeros((n, k_pad), dtype=np.int64)
    scales = np.zeros((n, k_pad // g), dtype=np.int64)
    for r in range(n):
        row = [float(v) for v in x[r]]
        for gi in range(k_pad // g):
            real = row[gi * g:min(k, (gi + 1) * g)]  # only the real values of this group
            if not all(math.isfinite(v) for v in real):
                raise ValueError("non-finite")
            amax = max([abs(v) for v in real], default=0.0)
            if amax == 0.0:
                continue  # scale +0, codes 0
            raw = f32(amax / qmax)
            try:
                w = f16_word(raw)
            except OverflowError:
                raise ValueError("scale overflow")
            if w == 0:
                w = 0x0001
            if w >= 0x7C00:
                raise ValueError("scale overflow")
            inv = f32(1.0 / f16_value(w))
            scales[r, gi] = w
            for j, v in enumerate(real):
                c = round(f32(v * inv))  # python round is half-to-even
                codes[r, gi * g + j] = min(max(c, qmin), qmax)
    return codes, scales

def check_against_ref(x, fmt):
    codes, scales = cv.encode_groupwise(x, fmt)
    rc, rs = ref_encode(x, fmt)
    assert codes.dtype == np.int8 and scales.dtype == np.uint16
    np.testing.assert_array_equal(scales.astype(np.int64), rs)
    np.testing.assert_array_equal(codes.astype(np.int64), rc)
    return codes, scales

@pytest.mark.parametrize("fmt", [Q4, Q5, Q6, W8])
def test_encoder_matches_scalar_reference_on_random_data(fmt):
    rng = np.random.default_rng(1234)
    rows = []
    # magnitudes from f32-subnormal to large, K = 200 so there is a partial group and a padding group
    for e in (-44, -40, -30, -20, -10, -3, 0, 2, 4):
        rows.append(rng.standard_normal(200) * 10.0 ** (e / 3.0) * (2.0 ** e))
    rows.append(rng.standard_normal(200) * 1e-42)                  # f32 subnormals
    rows.append(np.where(rng.random(200) < 0.7, 0.0, rng.standard_normal(200)))  # sparse
    # tie-rich: half-integers times a power-of-two scale, with amax = qmax * s so raw is exact
    qmax = cv.GROUPED[fmt][3]
    g = cv.GROUPED[fmt][1]
    for s in (1.0, 2.0 ** -10, 2.0 ** -20):
        t = rng.integers(-2 * qmax, 2 * qmax + 1, size=200) / 2.0
        t[::g] = qmax
        rows.append(t * s)
    x = np.array(rows, dtype=np.float32)
    check_against_ref(x, fmt)

def test_ties_round_to_even_at_the_code_level():
    # amax 7 -> raw 1.0 -> scale 1.0 (0x3C00) -> inv 1.0, so codes are rint_even(x)
    x = np.zeros((1, 64), dtype=np.float32)
    x[0, :8] = [7.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5]
    codes, scales = check_against_ref(x, Q4)
    assert scales[0, 0] == 0x3C00
    assert codes[0, :8].tolist() == [7, 0, 0, 2, -2, 2, -2, 4]

def test_subnormal_scale_rescue_and_zero_groups():
    x = np.zeros((1, 256), dtype=np.float32)
    x[0, 0] = 1e-10            # group 0: amax/7 underflows fp16 -> rescue to 0x0001
    x[0, 64] = 7 * 2.0 ** -20  # group 1: raw = 2^-20 is an fp16 subnormal: 16 * 2^-24 = 0x0010
    x[0, 128] = -0.0           # group 2: -0 only -> amax +0 -> scale 0
    codes, scales = check_against_ref(x, Q4)  # group 3 is all zero
    assert scales[0].tolist() == [0x0001, 0x0010, 0x0000, 0x0000]
    assert codes[0, 64] == 7 and not codes[0, 128:].any()

def test_partial_last_group_and_padding_groups():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 130)).astype(np.float32)
    x[:, :128] *= 100.0  # the big values must not leak into the partial group's scale
    codes, scales = check_against_ref(x, Q5)
    assert codes.shape == (2, 256) and scales.shape == (2, 4)
    for r in range(2):
        amax = np.abs(x[r, 128:130]).max()
        assert scales[r, 2] == f16_word(f32(float(amax) / 15))
        assert scales[r, 3] == 0                     # a whole padding group
        assert not codes[r, 130:].any()              # padding lanes are code 0

def test_w8_never_emits_minus_128_and_clamps_to_the_legal_interval():
    # a subnormal scale rounds down a lot: |x| * inv reaches ~178, far past qmax
    a = float(np.float32(127 * 1.4 * 2.0 ** -24))
    x = np.zeros((1, 128), dtype=np.float32)
    x[0, 0], x[0, 1] = a, -a
    codes, scales = check_against_ref(x, W8)
    assert scales[0, 0] == 0x0001 and codes[0, 0] == 127 and codes[0, 1] == -127
    assert codes.min() >= -127
    # Q4 clamps to its full legal interval [-8, 7]
    x = np.zeros((1, 128), dtype=np.float32)
    x[0, 0], x[0, 1] = float(np.float32(7 * 1.4 * 2.0 ** -24)), -float(np.float32(7 * 1.4 * 2.0 ** -24))
    codes, scales = check_against_ref(x, Q4)
    assert codes[0, 0] == 7 and codes[0, 1] == -8

@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_input_is_an_error(bad):
    x = np.ones((2, 128), dtype=np.float32)
    x[1, 77] = bad
    with pytest.raises(cv.ConvertError, match="non-finite"):
        cv.encode_groupwise(x, Q5)

def test_scale_overflow_is_an_error():
    x = np.full((1, 64), 1e30, dtype=np.float32)
    with pytest.raises(cv.ConvertError, match="overflow"):
        cv.encode_groupwise(x, Q6)

# -----------------------------------------------------------------------------
# sizes and the row-split layout

def test_worked_size_examples():
    # format.md §7.3, every row: (format, shape, high_offset, scale_offset, bytes)
    table = [
        (Q5, (2, 130), 256, 512, 528),
        (Q6, (248320, 4096), 508559360, 762839040, 794624000),
        (Q4, (5120, 4096), 10485760, 10485760, 11141120),
        (Q5, (5120, 4096), 10485760, 13107200, 13762560),
        (Q5, (8192, 4096), 16777216, 20971520, 22020096),
        (Q4, (24576, 4096), 50331648, 50331648, 53477376),
        (Q5, (4096, 12288), 25165824, 31457280, 33030144),
        (W8, (10240, 4096), 41943040, 41943040, 44564480),
        (Q4, (131072, 4096), 268435456, 268435456, 285212672),
        (Q5, (1152, 4304), 2506752, 3133440, 3290112),
    ]
    for fmt, shape, ho, so, nbytes in table:
        geo = cv.row_split_geometry(fmt, *shape)
        assert (geo["high_offset"], geo["scale_offset"], geo["bytes"]) == (ho, so, nbytes), (fmt, shape)
        assert cv.encoded_size(fmt, cv.ROW_SPLIT, list(shape)) == nbytes
    assert cv.encoded_size("I32", cv.CONTIGUOUS, [131072]) == 524288
    assert cv.encoded_size("BF16", cv.CONTIGUOUS, [4096]) == 8192
    assert cv.encoded_size("FP32", cv.CONTIGUOUS, []) == 4
    x = np.random.default_rng(0).standard_normal((2, 130)).astype(np.float32)
    assert len(cv.pack_row_split(*cv.encode_groupwise(x, Q5), Q5)) == 528

@pytest.mark.parametrize("fmt", [Q4, Q5, Q6, W8])
@pytest.mark.parametrize("shape", [(3, 130), (5, 256), (1, 64), (4, 600)])
def test_round_trip_encode_pack_decode(fmt, shape):
    x = (np.random.default_rng(shape[1]).standard_normal(shape) * 3).astype(np.float32)
    codes, scales = cv.encode_groupwise(x, fmt)
    buf = cv.pack_row_split(codes, scales, fmt)
    assert len(buf) == cv.encoded_size(fmt, cv.ROW_SPLIT, shape)
    c2, s2 = cv.unpack_row_split(buf, fmt, shape)
    np.testing.assert_array_equal(c2, codes)
    np.testing.assert_array_equal(s2, scales)
    g = cv.GROUPED[fmt][1]
    want = (codes.astype(np.float32).reshape(shape[0], -1, g) *
            scales.view(np.float16).astype(np.float32)[:, :, None]).reshape(shape[0], -1)[:, :shape[1]]
    w = cv.decode_row_split(buf, fmt, shape)
    np.testing.assert_array_equal(w, want)
    # and the error is within half a step of each group's scale
    step = np.repeat(scales.view(np.float16).astype(np.float32), g, axis=1)[:, :shape[1]]
    assert (np.abs(w - x) <= 0.5 * step * 1.0001 + 1e-30).all()

def test_plane_bit_order():
    # Q5: nibbles lane 2j low / 2j+1 high; high plane byte 0 = bit 4 of lanes 0..7, lane 0 in bit 0
    codes = np.zeros((1, 128), dtype=np.int8)
    codes[0, 0] = -16   # 0b10000: nibble 0, high bit 1
    codes[0, 1] = 5     # nibble 5 in the high half of byte 0
    codes[0, 3] = -13   # 0b10011 -> nibble 3, high bit 1
    codes[0, 8] = 15    # 0b01111: no high bit
    codes[0, 9] = -1    # 0b11111: nibble f, high bit 1 -> byte 1 bit 1
    scales = np.array([[0x3C00, 0]], dtype=np.uint16)
    buf = cv.pack_row_split(codes, scales, Q5)
    assert buf[0] == 0x50 and buf[1] == 0x30 and buf[4] == 0xF0 | 0x0F
    hi = 256  # high_offset for [1,128]
    assert buf[hi] == 0b00001001 and buf[hi + 1] == 0b00000010
    assert buf[512:516] == b"\x00\x3c\x00\x00"
    # Q6: stream lane0 b4, lane0 b5, lane1 b4, lane1 b5, ...
    codes = np.zeros((1, 128), dtype=np.int8)
    codes[0, 0] = 0b100000 - 64   # -32: b5 set, b4 clear -> stream bit 1
    codes[0, 1] = 0b010000        # 16: b4 set -> stream bit 2
    codes[0, 4] = 0b110000 - 64   # -16: b4 and b5 -> stream bits 8, 9 -> byte 1 bits 0, 1
    buf = cv.pack_row_split(codes, np.array([[0x3C00, 0]], dtype=np.uint16), Q6)
    assert buf[hi] == 0b00000110 and buf[hi + 1] == 0b00000011
    # W8: one signed byte per lane
    codes = np.zeros((1, 128), dtype=np.int8)
    codes[0, :3] = [-127, 127, -1]
    buf = cv.pack_row_split(codes, np.zeros((1, 4), dtype=np.uint16), W8)
    assert buf[:3] == b"\x81\x7f\xff"

def test_bf16_rounding():
    words = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001, 0x7FC00001],
                     dtype=np.uint32)
    got = cv.f32_to_bf16(words.view(np.float32))
    assert got[:7].tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80, 0x7F80, 0x0000]
    assert np.isnan(cv.bf16_to_f32(got[7:]))[0]
    w = np.arange(0, 65536, dtype=np.uint16)  # every bf16 word survives a round trip, NaNs included
    np.testing.assert_array_equal(cv.f32_to_bf16(cv.bf16_to_f32(w)), w)

# -----------------------------------------------------------------------------
# the random stream (numpy-version independent)

def test_rng_is_splitmix64_and_libm_free():
    # splitmix64 reference outputs for state 1234567 (Vigna's splitmix64.c)
    z = np.arange(5, dtype=np.uint64) * np.uint64(cv.GAMMA) + np.uint64((1234567 + cv.GAMMA) & cv.M64)
    assert cv.mix64(z).tolist() == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                    4593380528125082431, 16408922859458223821]
    x = np.linspace(1.0, 16.0, 1001)
    assert np.abs(cv.series_log(x) - np.log(x)).max() < 1e-14
    # the same (seed, name, row) gives the same values, whatever rows are asked for alongside
    init = ("normal", 0.0, 1.0)
    a = cv.rng_rows(3, "t", np.arange(10), 96, init, "F32")
    b = cv.rng_rows(3, "t", np.array([7, 2]), 96, init, "F32")
    np.testing.assert_array_equal(a[[7, 2]], b)
    big = cv.rng_rows(3, "t", np.arange(2000), 96, init, "F32")
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1.0) < 0.01 and np.abs(big).max() <= 3.47
    # pin the stream itself: synthetic checkpoints are golden inputs for other tests
    assert cv.tensor_key(0, "model.language_model.embed_tokens.weight") == cv.mix64_int(cv.fnv1a64("model.language_model.embed_tokens.weight"))
    assert cv.fnv1a64("a") == 0xAF63DC4C8601EC8C

# -----------------------------------------------------------------------------
# the 9b plan (format.md §8.6, §8.7), without generating anything

def test_plan_synthetic_9b():
    p = run("--plan", "--synthetic", "9b")
    out = p.stdout
    assert "objects: 740 (6 resources, 734 tensors)" in out
    assert "tensor span: 6,501,103,104 bytes" in out
    assert "text     387 tensors    5,666,140,160" in out
    assert "draft      2 tensors      285,736,960" in out
    assert "mtp       12 tensors      258,515,968" in out
    assert "vision   333 tensors      290,696,096" in out
    assert "BF16 406, FP32 48, I32 1, Q4G64_F16S 119, Q5G64_F16S 150, Q6G64_F16S 3, W8G32_F16S 7" in out

def test_plan_other_sizes_and_bf16():
    out = run("--plan", "--synthetic", "27b").stdout
    assert "objects: 1124 " in out  # format.md §12: 27B groupwise-int has 1124 objects
    out = run("--plan", "--synthetic", "0.8b", "--weights", "bf16").stdout
    assert "weights_id=bf16" in out and "Q4G64" not in out
    # tied: no output head, the draft head gathers embedding rows
    ck = cv.open_synthetic("4b", 0)
    ident, objs, header, size = cv.plan(ck, "groupwise-int")
    names = [o.name for o in objs]
    assert "text/output_head" not in names and ident["model_id"] == "qwen3.5-synthetic-4b"
    assert objs[names.index("text/draft_head")].segs[0][0] == "model.language_model.embed_tokens.weight"

# -----------------------------------------------------------------------------
# synthetic tiny end to end

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("convert")
    run("--synthetic", "tiny", "--seed", "5", "-o", d / "tiny", "--jobs", "2")
    run(d / "tiny", "-o", d / "tiny.ninfer", "--jobs", "2")
    run(d / "tiny", "-o", d / "tiny-bf16.ninfer", "--weights", "bf16", "--jobs", "1")
    return d

def read_artifact(path):
    version, ident, objs, payload, size = cv.read_directory(str(path))
    with open(path, "rb") as f:
        data = f.read()
    by = {o["name"]: o for o in objs}
    def blob(name):
        o = by[name]
        return data[payload + o["offset"]:payload + o["offset"] + o["bytes"]]
    return ident, objs, by, blob, data, payload

def test_synthetic_checkpoint_files(work):
    d = work / "tiny"
    assert sorted(os.listdir(d)) == sorted(["config.json", "model.safetensors"] + cv.RESOURCE_FILES)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_5" and cfg["text_config"]["layer_types"][3] == "full_attention"
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643] and gen["bos_token_id"] == gen["pad_token_id"] == 151643
    assert (gen["temperature"], gen["top_k"], gen["top_p"]) == (1.0, 20, 0.95)
    src = cv.SafetensorsSource([str(d / "model.safetensors")])
    assert len(src.names()) == 157  # 142 text + vision (what transformers loads) + 15 mtp
    assert src.dtype("model.language_model.layers.0.linear_attn.A_log") == "F32"
    assert src.dtype("model.language_model.layers.0.linear_attn.norm.weight") == "F32"
    assert src.dtype("model.language_model.layers.0.linear_attn.dt_bias") == "BF16"
    assert len([n for n in src.names() if n.startswith("mtp.")]) == 15
    a_log = src.full("model.language_model.layers.0.linear_attn.A_log")
    assert (a_log >= 0).all() and (a_log <= math.log(16) + 1e-6).all()
    gn = src.full("model.language_model.layers.0.linear_attn.norm.weight")
    assert 0.7 < gn.mean() < 1.3 and gn.std() > 0.01
    zn = src.full("model.language_model.layers.0.input_layernorm.weight")
    assert abs(zn.mean()) < 0.05 and 0.05 < zn.std() < 0.2
    emb = src.rows("model.language_model.embed_tokens.weight", range(0, 1000))
    assert abs(emb.std() - 4 / math.sqrt(128)) < 0.01

def test_synthetic_is_deterministic(work, tmp_path):
    run("--synthetic", "tiny", "--seed", "5", "-o", tmp_path / "again", "--jobs", "1")
    for f in ["config.json", "model.safetensors"] + cv.RESOURCE_FILES:
        assert sha256(tmp_path / "again" / f) == sha256(work / "tiny" / f), f
    # streaming straight into an artifact gives the same bytes as converting the checkpoint
    run("--synthetic", "tiny", "--seed", "5", "-o", tmp_path / "direct.ninfer", "--jobs", "2")
    assert sha256(tmp_path / "direct.ninfer") == sha256(work / "tiny.ninfer")
    run("--synthetic", "tiny", "--seed", "6", "-o", tmp_path / "other.ninfer")
    assert sha256(tmp_path / "other.ninfer") != sha256(work / "tiny.ninfer")

def test_container_framing(work):
    ident, objs, by, blob, data, payload = read_artifact(work / "tiny.ninfer")
    assert data[:8] == b"NINFER\x00\x02"
    (jn,) = struct.unpack("<Q", data[8:16])
    text = data[16:16 + jn]
    root = json.loads(text)
    assert text == json.dumps(root, separators=(",", ":"), ensure_ascii=False).encode()  # compact, writer order
    assert list(root) == ["identity", "objects"]
    assert root["identity"] == {"model_id": "qwen3.5-synthetic-tiny", "weights_id": "groupwise-int"}
    assert payload == (16 + jn + 4095) // 4096 * 4096 and not any(data[16 + jn:payload])
    names = [o["name"] for o in objs]
    assert names[:6] == ["frontend/" + f for f in cv.RESOURCE_FILES]
    for o in objs[:6]:
        assert list(o) == ["name", "kind", "encoding", "offset", "bytes"]
        assert blob(o["name"]) == (work / "tiny" / o["name"][9:]).read_bytes()
    assert objs[1]["offset"] == objs[0]["bytes"]  # resources are packed, alignment 1
    for o in objs[6:]:
        assert list(o) == ["name", "kind", "shape", "format", "layout", "offset", "bytes"] and o["offset"] % 256 == 0
    last = objs[-1]
    assert len(data) == payload + last["offset"] + last["bytes"]  # truncated at the last object's end
    # writer order (format.md §8.1) for tiny: 8 layers, layer 3 and 7 full attention
    assert names[6] == "text/token_embedding" and names[7] == "text/layers/0/input_norm"
    l3 = [n[len("text/layers/3/"):] for n in names if n.startswith("text/layers/3/")]
    assert l3 == ["input_norm", "attention/query_key", "attention/gate_value", "attention/query_norm",
                  "attention/key_norm", "attention/output", "post_attention_norm", "mlp/gate_up", "mlp/down"]
    l0 = [n[len("text/layers/0/"):] for n in names if n.startswith("text/layers/0/")]
    assert l0 == ["input_norm", "gdn/a_log", "gdn/dt_bias", "gdn/convolution", "gdn/a_projection", "gdn/b_projection",
                  "gdn/query_key", "gdn/value_z", "gdn/norm", "gdn/output", "post_attention_norm", "mlp/gate_up", "mlp/down"]
    i = names.index("text/final_norm")
    assert names[i:i + 4] == ["text/final_norm", "text/output_head", "text/draft_head", "text/draft_head_token_ids"]
    assert names[i + 4] == "mtp/input_projection" and names[i + 16] == "vision/patch_embedding"
    assert len(objs) == 6 + 3 + 6 * 13 + 2 * 9 + 2 + 12 + 3 + 2 * 12 + 6
    assert by["text/token_embedding"]["shape"] == [151936, 128] and by["text/token_embedding"]["format"] == Q6

def test_fusions_and_formats_against_the_source(work):
    ident, objs, by, blob, data, payload = read_artifact(work / "tiny.ninfer")
    src = cv.SafetensorsSource([str(work / "tiny" / "model.safetensors")])
    P = "model.language_model.layers."
    H, Hq, Hv = 128, 2, 4

    def check_q(name, want):
        o = by[name]
        assert o["shape"] == list(want.shape)
        codes, scales = cv.unpack_row_split(blob(name), o["format"], o["shape"])
        c2, s2 = cv.encode_groupwise(want, o["format"])
        np.testing.assert_array_equal(codes, c2)
        np.testing.assert_array_equal(scales, s2)

    q = src.full(P + "3.self_attn.q_proj.weight").reshape(Hq, 512, H)
    k, v = src.full(P + "3.self_attn.k_proj.weight"), src.full(P + "3.self_attn.v_proj.weight")
    assert by["text/layers/3/attention/query_key"]["format"] == Q4
    check_q("text/layers/3/attention/query_key", np.concatenate([q[:, :256].reshape(-1, H), k]))
    assert by["text/layers/3/attention/gate_value"]["format"] == Q5
    check_q("text/layers/3/attention/gate_value", np.concatenate([q[:, 256:].reshape(-1, H), v]))
    qkv, z = src.full(P + "0.linear_attn.in_proj_qkv.weight"), src.full(P + "0.linear_attn.in_proj_z.weight")
    check_q("text/layers/0/gdn/query_key", qkv[:2 * 2 * 128])
    check_q("text/layers/0/gdn/value_z", np.concatenate([qkv[512:], z]))
    check_q("text/layers/0/mlp/gate_up", np.concatenate([src.full(P + "0.mlp.gate_proj.weight"), src.full(P + "0.mlp.up_proj.weight")]))
    check_q("text/layers/0/mlp/down", src.full(P + "0.mlp.down_proj.weight"))
    mq = src.full("mtp.layers.0.self_attn.q_proj.weight").reshape(Hq, 512, H)
    check_q("mtp/layer/attention/query_key_gate_value", np.concatenate([
        mq[:, :256].reshape(-1, H), src.full("mtp.layers.0.self_attn.k_proj.weight"),
        mq[:, 256:].reshape(-1, H), src.full("mtp.layers.0.self_attn.v_proj.weight")]))
    assert by["mtp/layer/attention/query_key_gate_value"]["format"] == W8
    check_q("vision/patch_embedding", src.full("model.visual.patch_embed.proj.weight").reshape(128, 1536))
    # direct copies and casts
    bf = lambda name: np.frombuffer(blob(name), dtype="<u2")
    conv = src.full(P + "0.linear_attn.conv1d.weight")
    assert by["text/layers/0/gdn/convolution"]["shape"] == [4, 1024]
    np.testing.assert_array_equal(bf("text/layers/0/gdn/convolution"), cv.f32_to_bf16(conv[:, 0, :].T).ravel())
    np.testing.assert_array_equal(np.frombuffer(blob("text/layers/0/gdn/a_log"), "<f4"), src.full(P + "0.linear_attn.A_log"))
    np.testing.assert_array_equal(np.frombuffer(blob("text/layers/0/gdn/dt_bias"), "<f4"), src.full(P + "0.linear_attn.dt_bias"))
    np.testing.assert_array_equal(bf("text/layers/0/gdn/norm"), cv.f32_to_bf16(src.full(P + "0.linear_attn.norm.weight")))
    np.testing.assert_array_equal(bf("text/layers/0/gdn/a_projection").reshape(Hv, H), cv.f32_to_bf16(src.full(P + "0.linear_attn.in_proj_a.weight")))
    np.testing.assert_array_equal(bf("text/layers/3/attention/query_norm"), cv.f32_to_bf16(src.full(P + "3.self_attn.q_norm.weight")))
    assert by["vision/position_embedding"]["format"] == "BF16" and by["vision/merger/fc2"]["format"] == W8
    # draft head without a ranking: the lowest ids, plus the 14 special ids of the tokenizer, forced
    ids = np.frombuffer(blob("text/draft_head_token_ids"), "<i4")
    special = list(range(151643, 151657))
    assert len(ids) == 131072 and ids[:131058].tolist() == list(range(131058)) and ids[131058:].tolist() == special
    head = src.rows("lm_head.weight", ids[::997].astype(np.int64))
    codes, scales = cv.unpack_row_split(blob("text/draft_head"), Q4, [131072, 128])
    c2, s2 = cv.encode_groupwise(head, Q4)
    np.testing.assert_array_equal(codes[::997], c2)
    np.testing.assert_array_equal(scales[::997], s2)

def test_bf16_profile(work):
    ident, objs, by, blob, data, payload = read_artifact(work / "tiny-bf16.ninfer")
    assert ident == {"model_id": "qwen3.5-synthetic-tiny", "weights_id": "bf16"}
    fmts = {o["format"] for o in objs if o["kind"] == "tensor"}
    assert fmts == {"BF16", "FP32", "I32"}
    assert all(o["layout"] == cv.CONTIGUOUS for o in objs if o["kind"] == "tensor")
    src = cv.SafetensorsSource([str(work / "tiny" / "model.safetensors")])
    q = src.raw("model.language_model.layers.7.self_attn.q_proj.weight").reshape(2, 512, 128)
    k = src.raw("model.language_model.layers.7.self_attn.k_proj.weight")
    want = np.concatenate([q[:, :256].reshape(-1, 128), k])
    np.testing.assert_array_equal(np.frombuffer(blob("text/layers/7/attention/query_key"), "<u2").reshape(-1, 128), want)
    ids = np.frombuffer(blob("text/draft_head_token_ids"), "<i4")
    head = src.raw("lm_head.weight")[ids[-20:]]
    np.testing.assert_array_equal(np.frombuffer(blob("text/draft_head"), "<u2").reshape(-1, 128)[-20:], head)
    assert np.frombuffer(blob("text/layers/0/gdn/a_log"), "<f4").dtype == np.float32

def test_inspect(work):
    out = run("--inspect", work / "tiny.ninfer").stdout
    assert "identity: model_id=qwen3.5-synthetic-tiny weights_id=groupwise-int" in out
    ident, objs, by, blob, data, payload = read_artifact(work / "tiny.ninfer")
    for o in objs:
        assert o["name"] in out
    line = [l for l in out.splitlines() if "text/layers/3/attention/query_key " in l][0].split()
    assert line[1:5] == ["tensor", Q4, cv.ROW_SPLIT, "[768,128]"]  # Hq 2 x 256 query rows + 1 x 256 key rows
    assert int(line[5]) == by["text/layers/3/attention/query_key"]["offset"]
    assert int(line[6]) == by["text/layers/3/attention/query_key"]["bytes"]
    assert re.search(r"Q6G64_F16S +3 objects", out) and re.search(r"resource +6 objects", out)

def test_tied_model_draft_from_the_embedding_and_a_ranking(work, tmp_path):
    # rank by a counts file (I64, row width = vocab rows); the draft head gathers embedding rows
    counts = np.random.default_rng(3).integers(0, 50, size=151936).astype("<i8")
    counts.tofile(tmp_path / "rank.i64")
    run("--synthetic", "tiny-gqa1", "-o", tmp_path / "g1.ninfer", "--draft-ranking", tmp_path / "rank.i64",
        "--draft-rows", "4096", "--model-id", "test-model")
    ident, objs, by, blob, data, payload = read_artifact(tmp_path / "g1.ninfer")
    assert ident["model_id"] == "test-model" and "text/output_head" not in by
    ids = np.frombuffer(blob("text/draft_head_token_ids"), "<i4").tolist()
    # format.md §8.10, written out the slow way
    domain, special = 151669, set(range(151643, 151657))
    ranked = sorted(range(domain), key=lambda i: (-counts[i], i))
    chosen = [i for i in ranked if i not in special][:4096 - len(special)] + sorted(special)
    pos = {i: p for p, i in enumerate(chosen)}
    assert ids == sorted(chosen, key=lambda i: (-counts[i], pos[i]))
    ck = cv.open_synthetic("tiny-gqa1", 0)
    emb = ck.source.rows("model.language_model.embed_tokens.weight", np.array(ids[:50], dtype=np.int64))
    codes, scales = cv.unpack_row_split(blob("text/draft_head"), Q4, [4096, 128])
    np.testing.assert_array_equal(codes[:50], cv.encode_groupwise(emb, Q4)[0])

def test_sharded_checkpoint_converts_to_the_same_bytes(work, tmp_path):
    d = tmp_path / "sharded"
    clone(work / "tiny", d)
    os.remove(d / "model.safetensors")
    src = cv.SafetensorsSource([str(work / "tiny" / "model.safetensors")])
    names = src.names()
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        fname = "model-%05d-of-00002.safetensors" % (i + 1)
        head, offs, total = cv.st_header_bytes([(n, src.dtype(n), src.shape(n)) for n in part])
        with open(d / fname, "wb") as f:
            f.write(head)
            for n in part:
                f.write(src.raw(n).tobytes())
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    run(d, "-o", tmp_path / "s.ninfer")
    assert sha256(tmp_path / "s.ninfer") == sha256(work / "tiny.ninfer")
    out = run("--plan", d).stdout
    assert "objects: %d " % len(cv.read_directory(str(work / "tiny.ninfer"))[2]) in out

# -----------------------------------------------------------------------------
# errors: one line, exit 1, no output file and no temporary left behind

def clone(src, dst):
    """a checkpoint copy whose big files are symlinks (so tests can replace single files)."""
    os.makedirs(dst)
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), os.path.join(dst, f))

def rewrite_safetensors(src_dir, dst_dir, drop=None, replace=None):
    src = cv.SafetensorsSource([os.path.join(src_dir, "model.safetensors")])
    names = [n for n in src.names() if n != drop]
    tensors = [(n, src.dtype(n), src.shape(n)) for n in names]
    if replace:
        tensors = [(n, replace[n][0], replace[n][1].shape) if n in replace else (n, d, s) for n, d, s in tensors]
    head, offs, total = cv.st_header_bytes(tensors)
    path = os.path.join(dst_dir, "model.safetensors")
    os.remove(path)
    with open(path, "wb") as f:
        f.write(head)
        for n, d, s in tensors:
            arr = replace[n][1] if replace and n in replace else src.raw(n)
            f.write(np.ascontiguousarray(arr).tobytes())

def expect_failure(args, out, *needles):
    p = run(*args, check=False)
    assert p.returncode == 1, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.startswith("convert.py: error:")]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert not os.path.exists(out) and not os.path.exists(str(out) + ".tmp")
    return lines[0]

@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.update(model_type="qwen3"), "model_type"),
    (lambda c: c["text_config"].update(head_dim=128), "head_dim"),
    (lambda c: c["text_config"].update(linear_conv_kernel_dim=3), "linear_conv_kernel_dim"),
    (lambda c: c["text_config"]["layer_types"].pop(), "layer_types"),
    (lambda c: c["text_config"]["layer_types"].__setitem__(2, "full_attention"), "full_attention_interval"),
    (lambda c: c["text_config"].update(num_hidden_layers=9, layer_types=None, full_attention_interval=4), "missing"),
    (lambda c: c["text_config"].update(intermediate_size=512), "mlp.gate_proj.weight"),
    (lambda c: c["vision_config"].update(out_hidden_size=64), "out_hidden_size"),
    (lambda c: c["text_config"]["rope_parameters"].update(rope_type="yarn", factor=4.0), "rope_type"),
    (lambda c: c["text_config"]["rope_parameters"].update(rope_theta=1000000), "rope_theta"),
    (lambda c: c["text_config"].update(rms_norm_eps=1e-5), "rms_norm_eps"),
])
def test_bad_config(work, tmp_path, edit, needle):
    d = tmp_path / "ck"
    clone(work / "tiny", d)
    cfg = json.loads((work / "tiny" / "config.json").read_text())
    edit(cfg)
    os.remove(d / "config.json")
    (d / "config.json").write_text(json.dumps(cfg))
    expect_failure([d, "-o", tmp_path / "x.ninfer"], tmp_path / "x.ninfer", needle)

def test_missing_unexpected_and_misshapen_tensors(work, tmp_path):
    d = tmp_path / "ck"
    clone(work / "tiny", d)
    rewrite_safetensors(work / "tiny", d, drop="model.language_model.layers.5.mlp.up_proj.weight")
    expect_failure([d, "-o", tmp_path / "x.ninfer"], tmp_path / "x.ninfer",
                   "model.language_model.layers.5.mlp.up_proj.weight", "missing")
    # an unexpected tensor (say, a leftover quantization scale)
    src = cv.SafetensorsSource([str(work / "tiny" / "model.safetensors")])
    tensors = [(n, src.dtype(n), src.shape(n)) for n in src.names()] + [("model.language_model.layers.5.mlp.up_proj.weight_scale", "F32", (1,))]
    head, offs, total = cv.st_header_bytes(tensors)
    os.remove(d / "model.safetensors")
    with open(d / "model.safetensors", "wb") as f:
        f.write(head)
        for n, dt, s in tensors[:-1]:
            f.write(src.raw(n).tobytes())
        f.write(np.zeros((1,), np.float32).tobytes())
    expect_failure([d, "-o", tmp_path / "x.ninfer"], tmp_path / "x.ninfer", "unexpected tensor", "weight_scale")
    rewrite_safetensors(work / "tiny", d, replace={"model.language_model.norm.weight": ("BF16", np.zeros((64,), np.uint16))})
    expect_failure([d, "-o", tmp_path / "x.ninfer"], tmp_path / "x.ninfer", "model.language_model.norm.weight", "shape")

def test_non_finite_weight_fails_midway_and_cleans_up(work, tmp_path):
    d = tmp_path / "ck"
    clone(work / "tiny", d)
    src = cv.SafetensorsSource([str(work / "tiny" / "model.safetensors")])
    w = src.raw("model.language_model.layers.6.mlp.down_proj.weight").copy()
    w[100, 7] = 0x7FC0  # bf16 NaN
    rewrite_safetensors(work / "tiny", d, replace={"model.language_model.layers.6.mlp.down_proj.weight": ("BF16", w)})
    for jobs in ("1", "2"):
        expect_failure([d, "-o", tmp_path / "x.ninfer", "--jobs", jobs], tmp_path / "x.ninfer",
                       "text/layers/6/mlp/down", "model.language_model.layers.6.mlp.down_proj.weight", "non-finite")

def test_bad_files_and_arguments(work, tmp_path):
    d = tmp_path / "ck"
    clone(work / "tiny", d)
    os.remove(d / "tokenizer.json")
    expect_failure([d, "-o", tmp_path / "x.ninfer"], tmp_path / "x.ninfer", "tokenizer.json")
    expect_failure([work / "tiny", "-o", tmp_path / "x.bin"], tmp_path / "x.bin", ".ninfer")
    expect_failure([work / "tiny", "-o", tmp_path / "x.ninfer", "--draft-rows", "999999"], tmp_path / "x.ninfer", "--draft-rows")
    expect_failure(["--synthetic", "huge", "-o", tmp_path / "x.ninfer"], tmp_path / "x.ninfer", "huge")
    (tmp_path / "r.i64").write_bytes(b"\0" * 12)
    expect_failure([work / "tiny", "-o", tmp_path / "x.ninfer", "--draft-ranking", tmp_path / "r.i64"], tmp_path / "x.ninfer", "I64")

def test_inspect_rejects_corrupt_files(work, tmp_path):
    good = (work / "tiny.ninfer").read_bytes()
    (jn,) = struct.unpack("<Q", good[8:16])
    cases = {
        "magic": b"NINFER\x00\x03" + good[8:],
        "truncated": good[:-1],
        "json": good[:16] + good[16:16 + jn].replace(b'"bytes":', b'"bytez":', 1) + good[16 + jn:],
    }
    text = good[16:16 + jn].decode()
    root = json.loads(text)
    root["objects"][7]["offset"] += 2  # misaligned tensor
    t2 = json.dumps(root, separators=(",", ":")).encode()
    t2 = t2 + b" " * (len(text.encode()) - len(t2)) if len(t2) <= jn else None
    if t2 is not None:
        cases["alignment"] = good[:16] + t2 + good[16 + jn:]
    for name, blob in cases.items():
        p = tmp_path / (name + ".ninfer")
        p.write_bytes(blob)
        r = run("--inspect", p, check=False)
        assert r.returncode == 1 and r.stderr.startswith("convert.py: error:"), (name, r.stderr)
