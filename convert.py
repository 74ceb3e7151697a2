#!/usr/bin/env python3
# convert.py: Hugging Face Qwen3.5 dense checkpoint -> .ninfer artifact (container v2).
#
#   python3 convert.py HF_DIR -o OUT.ninfer [--weights groupwise-int|bf16]
#                      [--draft-ranking FILE] [--draft-rows N] [--model-id ID] [--jobs N]
#   python3 convert.py --synthetic NAME [--seed N] -o DIR          (random-weight HF checkpoint)
#   python3 convert.py --synthetic NAME [--seed N] -o OUT.ninfer   (stream straight into an artifact)
#   python3 convert.py --plan (HF_DIR | --synthetic NAME) [--weights ...]
#   python3 convert.py --inspect FILE.ninfer
#
# the container, the formats, the canonical encoder and the 9b inventory are specified in
# docs/format.md (section numbers below refer to it); the HF names and shapes in docs/model.md §1.
# only numpy and the standard library: the safetensors reader/writer is the 30 lines below.
#
# weights profiles: groupwise-int is NInfer's mixed Q4/Q5/Q6/W8 contract (§8.2-§8.5); bf16 is our
# extension: every matrix BF16, vectors as in groupwise-int (norms/biases BF16, a_log/dt_bias FP32,
# draft ids I32). the draft head has min(131072, token domain) rows, ranked by --draft-ranking
# (§8.10) or, without one, the lowest ids; special ids are always forced in.
# behaviour: nothing is written until config.json, every tensor shape and the whole layout are
# validated; the artifact goes to OUT.tmp and is renamed at the end; stdout is only for --plan and
# --inspect, progress goes to stderr; any failure is one line "convert.py: error: ..." and exit 1,
# with the partial file removed.
#
# contents:
#   1. errors and small helpers
#   2. float words (bf16 <-> f32)
#   3. safetensors: read (mmap) and write
#   4. grouped formats: encoded_size, encode_groupwise (MAXABS_F16_RECIP_RNE_V1),
#      pack_row_split / decode_row_split (row-split-k128-v1)
#   5. geometry: config.json validation, the synthetic size table, the HF tensor inventory
#   6. the artifact inventory (objects, writer order, fusions)
#   7. frontend resources, tokenizer facts, draft head
#   8. planning (offsets, the JSON directory) and writing (serial or a fork pool)
#   9. synthetic checkpoints (counter-based rng, the source, the directory writer)
#  10. inspect (a reader that validates like format.md §3-§5)
#  11. cli

import json
import math
import mmap
import multiprocessing
import os
import struct
import sys
import time

import numpy as np

# -----------------------------------------------------------------------------
# 1. errors and small helpers

class ConvertError(Exception):
    pass

def die(msg):
    raise ConvertError(msg)

def log(msg):
    print("convert.py: " + msg, file=sys.stderr, flush=True)

def align_up(x, a):
    return (x + a - 1) // a * a

def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n

def fmt_shape(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"

MAGIC_V1 = b"NINFER\x00\x01"
MAGIC_V2 = b"NINFER\x00\x02"
PAYLOAD_ALIGN = 4096   # payload_offset = align_up(16 + json_bytes, 4096)
TENSOR_ALIGN = 256     # every tensor starts on a 256-byte boundary; resources on 1
CHUNK_ELEMS = 1 << 22  # a task (one pwrite per plane) covers about this many values
ENC_BLOCK = 1 << 16    # ... which are fetched and encoded in blocks of about this many (cache-sized)

# -----------------------------------------------------------------------------
# 2. float words. bf16 is the top half of an f32; the cast rounds to nearest even, which is
# exactly what torch's .to(bfloat16) does. a value that came from bf16 survives unchanged
# (its low 16 bits are zero), NaN payloads included.

def bf16_to_f32(words):
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)

def f32_to_bf16(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # NaNs are truncated (bf16 NaN words stay exact); set the quiet bit only if that made an inf
        t = (b[nan] >> np.uint32(16)).astype(np.uint16)
        r[nan] = np.where(t & np.uint16(0x7F), t, t | np.uint16(0x40))
    return r

def round_to_bf16(x):
    return bf16_to_f32(f32_to_bf16(x))

# -----------------------------------------------------------------------------
# 3. safetensors: 8-byte LE header length, a JSON header {name: {dtype, shape, data_offsets}},
# then the raw little-endian data. we mmap each file and hand out numpy views, so a tensor is
# only read when its rows are asked for.

ST_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}  # bf16 stays as its words

def st_read_header(path):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            die("%s: not a safetensors file (too short)" % path)
        (n,) = struct.unpack("<Q", head)
        size = os.fstat(f.fileno()).st_size
        if n == 0 or 8 + n > size:
            die("%s: bad safetensors header length %d" % (path, n))
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            die("%s: bad safetensors header JSON (%s)" % (path, e))
    header.pop("__metadata__", None)
    data_start = 8 + n
    for name, t in header.items():
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            die("%s: bad safetensors entry for %s" % (path, name))
        if t["dtype"] not in ST_DTYPES:
            die("%s: tensor %s has dtype %s (only BF16, F16, F32 are supported)" % (path, name, t["dtype"]))
        b0, b1 = t["data_offsets"]
        want = numel(t["shape"]) * np.dtype(ST_DTYPES[t["dtype"]]).itemsize
        if b1 - b0 != want or b0 < 0 or data_start + b1 > size:
            die("%s: tensor %s has a bad data span" % (path, name))
    return header, data_start

class SafetensorsSource:
    """the tensors of a checkpoint directory (one file or shards), memory-mapped."""

    def __init__(self, files):
        self.entries = {}  # name -> (file index, dtype, shape, byte offset)
        self.maps = []
        for path in files:
            header, data_start = st_read_header(path)
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(path) else None
            self.maps.append(mm)
            for name, t in header.items():
                if name in self.entries:
                    die("tensor %s appears in more than one shard (%s)" % (name, path))
                self.entries[name] = (len(self.maps) - 1, t["dtype"], tuple(t["shape"]), data_start + t["data_offsets"][0])

    def names(self):
        return list(self.entries)

    def shape(self, name):
        return self.entries[name][2]

    def dtype(self, name):
        return self.entries[name][1]

    def raw(self, name):
        fi, dt, shape, off = self.entries[name]
        arr = np.frombuffer(self.maps[fi], dtype=ST_DTYPES[dt], count=numel(shape), offset=off)
        return arr.reshape(shape[0] if shape else 1, -1)

    def rows(self, name, idx):
        """rows idx (a range or an index array) of the tensor viewed as [shape0, rest], as f32."""
        arr = self.raw(name)
        if isinstance(idx, range) and idx.step == 1:
            chunk = arr[idx.start:idx.stop]
        else:
            chunk = arr[np.asarray(idx, dtype=np.int64)]
        return to_f32(chunk, self.dtype(name))

    def full(self, name):
        return self.rows(name, range(0, self.raw(name).shape[0])).reshape(self.shape(name))

def to_f32(raw, dtype):
    if dtype == "BF16":
        return bf16_to_f32(raw)
    return np.asarray(raw, dtype=np.float32)

def st_header_bytes(tensors):
    """tensors: list of (name, dtype, shape). returns (header bytes incl. the length word, data offsets)."""
    header, offs, pos = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dt, shape in tensors:
        n = numel(shape) * np.dtype(ST_DTYPES[dt]).itemsize
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + n]}
        offs.append(pos)
        pos += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (align_up(len(text), 8) - len(text))  # keep the data 8-byte aligned, as the library does
    return struct.pack("<Q", len(text)) + text, offs, pos

# -----------------------------------------------------------------------------
# 4. grouped formats (format.md §6.2, §6.3, §7.2)

# format -> (code bits, group size G, qmin, qmax, high bytes per group)
GROUPED = {
    "Q4G64_F16S": (4, 64, -8, 7, 0),
    "Q5G64_F16S": (5, 64, -16, 15, 8),
    "Q6G64_F16S": (6, 64, -32, 31, 16),
    "W8G32_F16S": (8, 32, -127, 127, 0),   # -128 is illegal: the clamp is to the legal interval
}
DIRECT = {"BF16": 2, "FP32": 4, "I32": 4}  # word size
CONTIGUOUS = "contiguous-le-v1"
ROW_SPLIT = "row-split-k128-v1"
RAW_BYTES = "raw-bytes-v1"

def row_split_geometry(fmt, n, k):
    """plane offsets and per-row byte counts of row-split-k128-v1 for an [n, k] tensor."""
    bits, g, qmin, qmax, hb = GROUPED[fmt]
    k_pad = align_up(k, 128)
    gpr = k_pad // g
    base = n * gpr * 32
    high = n * gpr * hb
    high_offset = align_up(base, 256)
    scale_offset = high_offset + align_up(high, 256)
    return dict(k_pad=k_pad, gpr=gpr, base=base, high=high, scales=n * gpr * 2,
                high_offset=high_offset, scale_offset=scale_offset, bytes=scale_offset + n * gpr * 2,
                base_row=gpr * 32, high_row=gpr * hb, scale_row=gpr * 2)

def encoded_size(fmt, layout, shape):
    if layout == CONTIGUOUS:
        if fmt not in DIRECT:
            die("format %s cannot use layout %s" % (fmt, layout))
        return numel(shape) * DIRECT[fmt]
    if layout == ROW_SPLIT:
        if fmt not in GROUPED:
            die("format %s cannot use layout %s" % (fmt, layout))
        if len(shape) != 2:
            die("layout %s needs a rank-2 shape, got %s" % (layout, fmt_shape(shape)))
        return row_split_geometry(fmt, shape[0], shape[1])["bytes"]
    die("unknown layout %s" % layout)

def encode_groupwise(x, fmt):
    """MAXABS_F16_RECIP_RNE_V1 (format.md §6.3), vectorized.

    x: [N, K] values (converted to f32). returns codes int8 [N, K_pad] and scales uint16 [N, gpr]
    (fp16 words). every step is a single IEEE binary32/binary16 operation with round-to-nearest-even:
    numpy's f32 divide and multiply, its f32->f16 cast (subnormals kept) and np.rint (half to even)."""
    bits, g, qmin, qmax, hb = GROUPED[fmt]
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        die("encode_groupwise needs a rank-2 array")
    n, k = x.shape
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        die("non-finite value %r at [%d,%d]" % (float(x[bad[0], bad[1]]), bad[0], bad[1]))
    k_pad = align_up(k, 128)
    gpr = k_pad // g
    if k_pad != k:  # padding lanes are zero: they neither raise amax nor get a non-zero code
        xp = np.zeros((n, k_pad), dtype=np.float32)
        xp[:, :k] = x
        x = xp
    xg = x.reshape(n, gpr, g)
    amax = np.abs(xg).max(axis=2)                           # 1. exact in f32
    raw = amax / np.float32(qmax)                           # 3. f32(amax / qmax)
    with np.errstate(over="ignore"):
        s16 = raw.astype(np.float16)                        # 4. f16(raw), rne
    s16[(s16 == 0) & (amax > 0)] = np.float16(2.0 ** -24)   #    underflow rescue: 0x0001
    if np.isinf(s16).any():                                 # 5. never clip an overflowing scale
        r = np.argwhere(np.isinf(s16))[0]
        die("scale overflows fp16 (amax %r) in row %d group %d" % (float(amax[r[0], r[1]]), r[0], r[1]))
    s32 = s16.astype(np.float32)                            #    exact
    inv = np.zeros_like(s32)
    np.divide(np.float32(1.0), s32, out=inv, where=s32 > 0)  # 6. f32(1 / s), zero groups stay 0
    q = xg * inv[:, :, None]                                # 7. f32(x * inv)
    np.rint(q, out=q)                                       #    ties to even
    np.clip(q, qmin, qmax, out=q)                           #    clamp after rounding
    codes = q.astype(np.int8).reshape(n, k_pad)
    return codes, s16.view(np.uint16).copy()

def pack_planes(codes, scales, fmt):
    """the three row-split planes for these rows, unpadded: base [N, gpr*32], high [N, gpr*Hb],
    scales [N, gpr] (uint16). a chunk of rows packs independently of the others."""
    bits, g, qmin, qmax, hb = GROUPED[fmt]
    n, k_pad = codes.shape
    gpr = k_pad // g
    u = np.ascontiguousarray(codes).view(np.uint8).reshape(n, gpr, g)  # two's complement words
    if bits == 8:
        base = u.reshape(n, gpr * 32)
    else:
        lo = u & np.uint8(0x0F)
        base = (lo[:, :, 0::2] | (lo[:, :, 1::2] << np.uint8(4))).reshape(n, gpr * 32)
    if bits == 5:   # one bit per lane: lane i bit 4 -> stream bit i
        hbits = (u >> np.uint8(4)) & np.uint8(1)
    elif bits == 6:  # two bits per lane, lane-major: lane0 b4, lane0 b5, lane1 b4, ...
        hbits = np.stack([(u >> np.uint8(4)) & np.uint8(1), (u >> np.uint8(5)) & np.uint8(1)], axis=3).reshape(n, gpr, 2 * g)
    if hb:
        high = np.packbits(hbits, axis=2, bitorder="little").reshape(n, gpr * hb)  # stream bit t -> byte t/8 bit t%8
    else:
        high = np.zeros((n, 0), dtype=np.uint8)
    return base, high, np.ascontiguousarray(scales, dtype=np.uint16).reshape(n, gpr)

def pack_row_split(codes, scales, fmt):
    """the complete row-split-k128-v1 bytes of a tensor."""
    base, high, sc = pack_planes(codes, scales, fmt)
    pad = lambda b: b + bytes(align_up(len(b), 256) - len(b))
    return pad(base.tobytes()) + pad(high.tobytes()) + sc.astype("<u2").tobytes()

def unpack_row_split(buf, fmt, shape):
    """bytes -> (codes int8 [N, K_pad], scales uint16 [N, gpr])."""
    bits, g, qmin, qmax, hb = GROUPED[fmt]
    n, k = shape
    geo = row_split_geometry(fmt, n, k)
    buf = np.frombuffer(buf, dtype=np.uint8)
    if buf.size != geo["bytes"]:
        die("row-split buffer is %d bytes, expected %d" % (buf.size, geo["bytes"]))
    gpr = geo["gpr"]
    base = buf[:geo["base"]].reshape(n, gpr, 32)
    scales = buf[geo["scale_offset"]:].view("<u2").reshape(n, gpr).astype(np.uint16)
    if bits == 8:
        return base.reshape(n, -1).view(np.int8).copy(), scales
    u = np.empty((n, gpr, g), dtype=np.uint8)
    u[:, :, 0::2] = base & 0x0F
    u[:, :, 1::2] = base >> 4
    if hb:
        high = buf[geo["high_offset"]:geo["high_offset"] + geo["high"]].reshape(n, gpr, hb)
        hbits = np.unpackbits(high, axis=2, bitorder="little")
        if bits == 5:
            u |= hbits << 4
        else:
            hbits = hbits.reshape(n, gpr, g, 2)
            u |= (hbits[..., 0] << 4) | (hbits[..., 1] << 5)
    codes = u.astype(np.int16)
    codes[codes >= (1 << (bits - 1))] -= (1 << bits)  # sign-extend from b bits
    return codes.astype(np.int8).reshape(n, gpr * g), scales

def decode_row_split(buf, fmt, shape):
    """bytes -> f32 [N, K]: w = f32(scale) * code."""
    n, k = shape
    codes, scales = unpack_row_split(buf, fmt, shape)
    g = GROUPED[fmt][1]
    s = scales.view(np.float16).astype(np.float32)
    w = codes.astype(np.float32).reshape(n, -1, g) * s[:, :, None]
    return w.reshape(n, -1)[:, :k]

# -----------------------------------------------------------------------------
# 5. geometry. everything the converter needs comes from config.json and is checked against the
# tensor shapes; the family constants (head_dim 256, dk = dv = 128, conv kernel 4) are enforced.

class Geom:
    pass

# the synthetic sizes: H, L, I, Hq, Hkv, Hk, Hv, vocab rows, tied, (vision depth, Dv, heads, Iv)
SYNTHETIC = {
    "tiny":      (128, 8, 384, 2, 1, 2, 4, 151936, False, (2, 128, 2, 256)),
    "tiny-gqa1": (128, 8, 256, 4, 2, 2, 2, 151936, True, (2, 128, 2, 256)),
    "tiny-gqa3": (128, 8, 384, 6, 1, 2, 6, 151936, True, (2, 128, 2, 256)),
    "0.8b":      (1024, 24, 3584, 8, 2, 16, 16, 248320, True, (12, 768, 12, 3072)),
    "4b":        (2560, 32, 9216, 16, 4, 16, 32, 248320, True, (24, 1024, 16, 4096)),
    "9b":        (4096, 32, 12288, 16, 4, 16, 32, 248320, False, (27, 1152, 16, 4304)),
    "27b":       (5120, 64, 17408, 24, 4, 16, 48, 248320, False, (27, 1152, 16, 4304)),
}
# released sizes by (hidden, layers), for the default model_id
RELEASED = {(1024, 24): "0.8b", (2048, 24): "2b", (2560, 32): "4b", (4096, 32): "9b", (5120, 64): "27b"}

def parse_config(cfg):
    """validate config.json and return the geometry. raises naming the offending key."""
    def need(d, where, key, kind=int):
        if key not in d:
            die("config.json: %s%s is missing" % (where, key))
        v = d[key]
        if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            die("config.json: %s%s = %r is not a positive integer" % (where, key, v))
        return v

    def expect(d, where, key, want):
        v = d.get(key, want)
        if v != want:
            die("config.json: %s%s = %r, expected %r" % (where, key, v, want))

    if not isinstance(cfg, dict):
        die("config.json: not a JSON object")
    mt = cfg.get("model_type")
    if mt == "qwen3_5":
        tc, where = cfg.get("text_config"), "text_config."
        if not isinstance(tc, dict):
            die("config.json: text_config is missing")
    elif mt == "qwen3_5_text":
        tc, where = cfg, ""
    else:
        die("config.json: model_type is %r, expected 'qwen3_5' (a Qwen3.5 dense checkpoint)" % (mt,))
    if "model_type" in tc and tc["model_type"] != "qwen3_5_text":
        die("config.json: %smodel_type is %r, expected 'qwen3_5_text'" % (where, tc["model_type"]))
    g = Geom()
    g.H = need(tc, where, "hidden_size")
    g.L = need(tc, where, "num_hidden_layers")
    g.I = need(tc, where, "intermediate_size")
    g.Hq = need(tc, where, "num_attention_heads")
    g.Hkv = need(tc, where, "num_key_value_heads")
    g.Hk = need(tc, where, "linear_num_key_heads")
    g.Hv = need(tc, where, "linear_num_value_heads")
    g.vocab = need(tc, where, "vocab_size")
    expect(tc, where, "head_dim", 256)
    expect(tc, where, "linear_key_head_dim", 128)
    expect(tc, where, "linear_value_head_dim", 128)
    expect(tc, where, "linear_conv_kernel_dim", 4)
    expect(tc, where, "attention_bias", False)
    if "num_experts" in tc:
        die("config.json: %snum_experts present: MoE checkpoints are not dense Qwen3.5" % where)
    # family constants the artifact cannot express (ninfer keeps them in its per-size table)
    expect(tc, where, "hidden_act", "silu")
    eps = tc.get("rms_norm_eps", 1e-6)
    if eps != 1e-6:
        die("config.json: %srms_norm_eps = %r, expected 1e-06" % (where, eps))
    rope = tc.get("rope_parameters") or tc.get("rope_scaling") or {}  # rope_scaling: the pre-5.x spelling
    if not isinstance(rope, dict):
        die("config.json: %srope_parameters is not an object" % where)
    for key, want in (("rope_type", "default"), ("rope_theta", 10000000), ("partial_rotary_factor", 0.25),
                      ("mrope_section", [11, 11, 10]), ("mrope_interleaved", True)):
        v = rope.get(key, tc.get(key, want))  # older configs keep rope_theta / partial_rotary_factor at the top
        if v != want:
            die("config.json: %srope_parameters.%s = %r, expected %r (not supported by the artifact)" % (where, key, v, want))
    g.hd, g.dk, g.dv, g.conv = 256, 128, 128, 4
    if g.Hq % g.Hkv:
        die("config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d" % (g.Hq, g.Hkv))
    if g.Hv % g.Hk:
        die("config.json: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d" % (g.Hv, g.Hk))
    lt = tc.get("layer_types")
    if lt is None:
        iv = tc.get("full_attention_interval", 4)
        lt = ["full_attention" if (i + 1) % iv == 0 else "linear_attention" for i in range(g.L)]
    if not isinstance(lt, list) or len(lt) != g.L:
        die("config.json: %slayer_types has %s entries, num_hidden_layers is %d" % (where, len(lt) if isinstance(lt, list) else "no", g.L))
    for i, t in enumerate(lt):
        if t not in ("full_attention", "linear_attention"):
            die("config.json: %slayer_types[%d] = %r" % (where, i, t))
    if "full_attention_interval" in tc and "layer_types" in tc:
        iv = tc["full_attention_interval"]
        if [t == "full_attention" for t in lt] != [(i + 1) % iv == 0 for i in range(g.L)]:
            die("config.json: %slayer_types disagrees with full_attention_interval %r" % (where, iv))
    g.full = [t == "full_attention" for t in lt]
    tie = cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))
    if tc.get("tie_word_embeddings", tie) != tie:
        die("config.json: tie_word_embeddings differs between the root and %s" % where)
    g.tied = bool(tie)
    g.mtp_layers = tc.get("mtp_num_hidden_layers", 0)
    if g.mtp_layers not in (0, 1):
        die("config.json: mtp_num_hidden_layers = %r (only 0 or 1 supported)" % g.mtp_layers)
    g.vision = None
    vc = cfg.get("vision_config") if mt == "qwen3_5" else None
    if vc is not None:
        w = "vision_config."
        v = Geom()
        v.depth = need(vc, w, "depth")
        v.Dv = need(vc, w, "hidden_size")
        v.Iv = need(vc, w, "intermediate_size")
        v.heads = need(vc, w, "num_heads")
        v.out = need(vc, w, "out_hidden_size")
        v.pos = need(vc, w, "num_position_embeddings")
        expect(vc, w, "patch_size", 16)
        expect(vc, w, "temporal_patch_size", 2)
        expect(vc, w, "spatial_merge_size", 2)
        expect(vc, w, "in_channels", 3)
        expect(vc, w, "hidden_act", "gelu_pytorch_tanh")
        if v.out != g.H:
            die("config.json: vision_config.out_hidden_size %d != text hidden_size %d" % (v.out, g.H))
        if v.Dv % v.heads:
            die("config.json: vision_config.hidden_size %d is not a multiple of num_heads %d" % (v.Dv, v.heads))
        g.vision = v
    g.synthetic = cfg.get("ninfer_synthetic")
    return g

def synthetic_config(name):
    """an HF config.json for a synthetic size, in the official layout (loads in transformers 5.x).
    the token ids are those of the Qwen3 tokenizer fixture the synthetic models ship with."""
    H, L, I, Hq, Hkv, Hk, Hv, vocab, tied, (depth, Dv, heads, Iv) = SYNTHETIC[name]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": 151655,
        "model_type": "qwen3_5",
        "ninfer_synthetic": name,  # marks random weights: the artifact gets model_id qwen3.5-synthetic-<name>
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "bos_token_id": None,
            "dtype": "bfloat16",
            "eos_token_id": 151643,
            "full_attention_interval": 4,
            "head_dim": 256,
            "hidden_act": "silu",
            "hidden_size": H,
            "initializer_range": 0.02,
            "intermediate_size": I,
            "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": Hk,
            "linear_num_value_heads": Hv,
            "linear_value_head_dim": 128,
            "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 262144,
            "model_type": "qwen3_5_text",
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "num_attention_heads": Hq,
            "num_hidden_layers": L,
            "num_key_value_heads": Hkv,
            "pad_token_id": None,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "mrope_interleaved": True,
                "mrope_section": [11, 11, 10],
                "partial_rotary_factor": 0.25,
                "rope_theta": 10000000,
                "rope_type": "default",
            },
            "tie_word_embeddings": tied,
            "use_cache": True,
            "vocab_size": vocab,
        },
        "tie_word_embeddings": tied,
        "transformers_version": "5.13.0",
        "video_token_id": 151656,
        "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": depth,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": Dv,
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": Iv,
            "model_type": "qwen3_5",
            "num_heads": heads,
            "num_position_embeddings": 2304,
            "out_hidden_size": H,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": 151653,
        "vision_start_token_id": 151652,
    }

TEXT = "model.language_model."

def hf_inventory(g, text_prefix=TEXT, mtp=True, vision=True):
    """every HF tensor of this geometry: list of (name, shape, stored dtype, synthetic init).

    init is how the synthetic generator fills it: ("normal", mean, std), ("uniform", lo, hi) or
    ("log_uniform", lo, hi) (= log of a uniform draw). scales are ~1/sqrt(fan_in) so activations
    stay O(1); the head is 4/sqrt(H) so logits spread over a few units (clear greedy margins);
    zero-centred norms are N(0, 0.1^2) around the (1+w) offset, the GDN gated norm and the vision
    LayerNorms around 1."""
    H, I, hd = g.H, g.I, g.hd
    inv = lambda n: 1.0 / math.sqrt(n)
    znorm = ("normal", 0.0, 0.1)
    out = []
    P = text_prefix
    t = lambda name, shape, init, dt="BF16": out.append((name, tuple(shape), dt, init))

    def attention(p):
        t(p + "self_attn.q_proj.weight", (2 * g.Hq * hd, H), ("normal", 0.0, inv(H)))
        t(p + "self_attn.k_proj.weight", (g.Hkv * hd, H), ("normal", 0.0, inv(H)))
        t(p + "self_attn.v_proj.weight", (g.Hkv * hd, H), ("normal", 0.0, inv(H)))
        t(p + "self_attn.o_proj.weight", (H, g.Hq * hd), ("normal", 0.0, inv(g.Hq * hd)))
        t(p + "self_attn.q_norm.weight", (hd,), znorm)
        t(p + "self_attn.k_norm.weight", (hd,), znorm)

    def mlp(p):
        t(p + "mlp.gate_proj.weight", (I, H), ("normal", 0.0, inv(H)))
        t(p + "mlp.up_proj.weight", (I, H), ("normal", 0.0, inv(H)))
        t(p + "mlp.down_proj.weight", (H, I), ("normal", 0.0, inv(I)))

    t(P + "embed_tokens.weight", (g.vocab, H), ("normal", 0.0, 4.0 * inv(H)))
    conv_dim = 2 * g.Hk * g.dk + g.Hv * g.dv
    for l in range(g.L):
        p = P + "layers.%d." % l
        t(p + "input_layernorm.weight", (H,), znorm)
        t(p + "post_attention_layernorm.weight", (H,), znorm)
        if g.full[l]:
            attention(p)
        else:
            a = p + "linear_attn."
            t(a + "in_proj_qkv.weight", (conv_dim, H), ("normal", 0.0, inv(H)))
            t(a + "in_proj_z.weight", (g.Hv * g.dv, H), ("normal", 0.0, inv(H)))
            t(a + "in_proj_b.weight", (g.Hv, H), ("normal", 0.0, inv(H)))
            t(a + "in_proj_a.weight", (g.Hv, H), ("normal", 0.0, inv(H)))
            t(a + "conv1d.weight", (conv_dim, 1, g.conv), ("normal", 0.0, 0.5))
            t(a + "A_log", (g.Hv,), ("log_uniform", 1.0, 16.0), "F32")
            t(a + "dt_bias", (g.Hv,), ("uniform", -5.0, 0.0))  # softplus in [0.007, 0.69]: slow and fast heads
            t(a + "norm.weight", (g.dv,), ("normal", 1.0, 0.1), "F32")
            t(a + "out_proj.weight", (H, g.Hv * g.dv), ("normal", 0.0, inv(g.Hv * g.dv)))
        mlp(p)
    t(P + "norm.weight", (H,), znorm)
    if not g.tied:
        t("lm_head.weight", (g.vocab, H), ("normal", 0.0, 4.0 * inv(H)))
    if mtp:
        t("mtp.fc.weight", (H, 2 * H), ("normal", 0.0, inv(2 * H)))
        t("mtp.pre_fc_norm_embedding.weight", (H,), znorm)
        t("mtp.pre_fc_norm_hidden.weight", (H,), znorm)
        t("mtp.norm.weight", (H,), znorm)
        t("mtp.layers.0.input_layernorm.weight", (H,), znorm)
        t("mtp.layers.0.post_attention_layernorm.weight", (H,), znorm)
        attention("mtp.layers.0.")
        mlp("mtp.layers.0.")
    if vision and g.vision is not None:
        v, V = g.vision, "model.visual."
        ln_w, ln_b, bias = ("normal", 1.0, 0.1), ("normal", 0.0, 0.05), ("normal", 0.0, 0.02)
        t(V + "patch_embed.proj.weight", (v.Dv, 3, 2, 16, 16), ("normal", 0.0, inv(1536)))
        t(V + "patch_embed.proj.bias", (v.Dv,), bias)
        t(V + "pos_embed.weight", (v.pos, v.Dv), ("normal", 0.0, 0.1))
        for b in range(v.depth):
            p = V + "blocks.%d." % b
            t(p + "norm1.weight", (v.Dv,), ln_w)
            t(p + "norm1.bias", (v.Dv,), ln_b)
            t(p + "norm2.weight", (v.Dv,), ln_w)
            t(p + "norm2.bias", (v.Dv,), ln_b)
            t(p + "attn.qkv.weight", (3 * v.Dv, v.Dv), ("normal", 0.0, inv(v.Dv)))
            t(p + "attn.qkv.bias", (3 * v.Dv,), bias)
            t(p + "attn.proj.weight", (v.Dv, v.Dv), ("normal", 0.0, inv(v.Dv)))
            t(p + "attn.proj.bias", (v.Dv,), bias)
            t(p + "mlp.linear_fc1.weight", (v.Iv, v.Dv), ("normal", 0.0, inv(v.Dv)))
            t(p + "mlp.linear_fc1.bias", (v.Iv,), bias)
            t(p + "mlp.linear_fc2.weight", (v.Dv, v.Iv), ("normal", 0.0, inv(v.Iv)))
            t(p + "mlp.linear_fc2.bias", (v.Dv,), bias)
        t(V + "merger.norm.weight", (v.Dv,), ln_w)
        t(V + "merger.norm.bias", (v.Dv,), ln_b)
        t(V + "merger.linear_fc1.weight", (4 * v.Dv, 4 * v.Dv), ("normal", 0.0, inv(4 * v.Dv)))
        t(V + "merger.linear_fc1.bias", (4 * v.Dv,), bias)
        t(V + "merger.linear_fc2.weight", (v.out, 4 * v.Dv), ("normal", 0.0, inv(4 * v.Dv)))
        t(V + "merger.linear_fc2.bias", (v.out,), bias)
    return out

def check_source(g, src):
    """match the checkpoint's tensors against the inventory: the text prefix, which optional groups
    (mtp, vision) are present, every shape, and nothing left over. returns the HF inventory."""
    names = set(src.names())
    if TEXT + "embed_tokens.weight" in names:
        prefix = TEXT
    elif "model.embed_tokens.weight" in names:
        prefix = "model."  # a text-only (Qwen3_5ForCausalLM) save
    else:
        die("tensor %sembed_tokens.weight is missing" % TEXT)
    has_mtp = any(n.startswith("mtp.") for n in names)
    has_vision = any(n.startswith("model.visual.") for n in names)
    if has_vision and g.vision is None:
        die("the checkpoint has model.visual.* tensors but config.json has no vision_config")
    if has_mtp and g.mtp_layers == 0:
        log("note: mtp.* tensors present although mtp_num_hidden_layers is 0; converting them")
    inv = hf_inventory(g, prefix, has_mtp, has_vision)
    want = {n: (shape, dt) for n, shape, dt, init in inv}
    for n, shape, dt, init in inv:
        if n not in names:
            die("tensor %s is missing from the checkpoint" % n)
        if tuple(src.shape(n)) != shape:
            die("tensor %s has shape %s, expected %s" % (n, fmt_shape(src.shape(n)), fmt_shape(shape)))
    for n in sorted(names):
        if n not in want:
            why = " (tie_word_embeddings is true)" if n == "lm_head.weight" else ""
            die("unexpected tensor %s in the checkpoint%s" % (n, why))
    g.has_mtp, g.has_vision, g.prefix = has_mtp, has_vision, prefix
    if not has_mtp:
        log("note: no mtp.* tensors; the artifact has no MTP objects")
    if g.vision is not None and not has_vision:
        log("note: no model.visual.* tensors; the artifact has no vision objects")
    return inv

# -----------------------------------------------------------------------------
# 6. the artifact inventory (format.md §8). an object is either a resource (bytes), a matrix
# assembled from row segments of HF tensors (segs; streamed in row chunks), or a small tensor
# computed whole (fn). fusions are row concatenations, so a chunk of an object's rows maps back to
# a few contiguous row ranges of the sources.

class Obj:
    def __init__(self, name, kind, shape=None, fmt=None, layout=None, segs=None, fn=None, data=None, group=None):
        self.name, self.kind, self.shape, self.format, self.layout = name, kind, shape, fmt, layout
        self.segs, self.fn, self.data, self.group = segs, fn, data, group
        self.offset = None
        self.nbytes = len(data) if kind == "resource" else encoded_size(fmt, layout, shape)
        self.sources = sorted({s for s, _ in segs}) if segs else []

    def directory_entry(self):
        if self.kind == "resource":
            return {"name": self.name, "kind": "resource", "encoding": RAW_BYTES, "offset": self.offset, "bytes": self.nbytes}
        return {"name": self.name, "kind": "tensor", "shape": list(self.shape), "format": self.format,
                "layout": self.layout, "offset": self.offset, "bytes": self.nbytes}

# role -> format of the groupwise-int profile (format.md §8.2-§8.5); the bf16 profile stores every
# matrix as BF16 and keeps the vector formats.
GROUPWISE = {
    "embedding": "Q6G64_F16S", "head": "Q6G64_F16S", "draft": "Q4G64_F16S",
    "attn.qk": "Q4G64_F16S", "attn.gv": "Q5G64_F16S", "attn.out": "Q5G64_F16S",
    "gdn.qk": "Q4G64_F16S", "gdn.vz": "Q5G64_F16S", "gdn.out": "Q5G64_F16S", "gdn.ab": "BF16",
    "mlp.gu": "Q4G64_F16S", "mlp.down": "Q5G64_F16S",
    "mtp": "W8G32_F16S",
    "vis.patch": "Q6G64_F16S", "vis.pos": "BF16", "vis.qkv": "Q4G64_F16S", "vis.out": "Q5G64_F16S",
    "vis.fc1": "Q4G64_F16S", "vis.fc2": "Q5G64_F16S", "vis.merger": "W8G32_F16S",
}
WEIGHTS = ("groupwise-int", "bf16")

def build_objects(g, weights, resources, draft_ids):
    """the objects in writer order (format.md §8.1). resources: list of (name, bytes)."""
    objs = [Obj(name, "resource", data=data, group="resources") for name, data in resources]
    H, hd = g.H, g.hd
    P = g.prefix

    def matrix(name, role, segs, k, group):
        fmt = GROUPWISE[role] if weights == "groupwise-int" else "BF16"
        n = sum(len(idx) for _, idx in segs)
        layout = ROW_SPLIT if fmt in GROUPED else CONTIGUOUS
        objs.append(Obj(name, "tensor", (n, k), fmt, layout, segs=segs, group=group))

    def rows(src_name, n, a=0, b=None):
        return (src_name, range(a, n if b is None else b))

    def vec(name, src_name, shape, group, fmt="BF16", fn=None):
        f = fn or (lambda s, src_name=src_name: s.full(src_name))
        o = Obj(name, "tensor", tuple(shape), fmt, CONTIGUOUS, fn=f, group=group)
        o.sources = [src_name]
        objs.append(o)

    def q_parts(q_proj, Hq):
        # q_proj rows are per-head interleaved [query 256 | gate 256] x Hq (model.md §2.1)
        query = [(q_proj, range(h * 2 * hd, h * 2 * hd + hd)) for h in range(Hq)]
        gate = [(q_proj, range(h * 2 * hd + hd, (h + 1) * 2 * hd)) for h in range(Hq)]
        return query, gate

    head_src = P + "embed_tokens.weight" if g.tied else "lm_head.weight"
    matrix("text/token_embedding", "embedding", [rows(P + "embed_tokens.weight", g.vocab)], H, "text")
    kvd, vd, kd = g.Hkv * hd, g.Hv * g.dv, g.Hk * g.dk
    for l in range(g.L):
        p, o = P + "layers.%d." % l, "text/layers/%d/" % l
        vec(o + "input_norm", p + "input_layernorm.weight", (H,), "text")
        if g.full[l]:
            a = p + "self_attn."
            query, gate = q_parts(a + "q_proj.weight", g.Hq)
            matrix(o + "attention/query_key", "attn.qk", query + [rows(a + "k_proj.weight", kvd)], H, "text")
            matrix(o + "attention/gate_value", "attn.gv", gate + [rows(a + "v_proj.weight", kvd)], H, "text")
            vec(o + "attention/query_norm", a + "q_norm.weight", (hd,), "text")
            vec(o + "attention/key_norm", a + "k_norm.weight", (hd,), "text")
            matrix(o + "attention/output", "attn.out", [rows(a + "o_proj.weight", H)], g.Hq * hd, "text")
        else:
            a = p + "linear_attn."
            conv_dim = 2 * kd + vd
            vec(o + "gdn/a_log", a + "A_log", (g.Hv,), "text", "FP32")
            vec(o + "gdn/dt_bias", a + "dt_bias", (g.Hv,), "text", "FP32")
            # conv1d [C, 1, 4] -> [4, C], tap-major
            vec(o + "gdn/convolution", a + "conv1d.weight", (g.conv, conv_dim), "text",
                fn=lambda s, n=a + "conv1d.weight": np.ascontiguousarray(s.full(n)[:, 0, :].T))
            matrix(o + "gdn/a_projection", "gdn.ab", [rows(a + "in_proj_a.weight", g.Hv)], H, "text")
            matrix(o + "gdn/b_projection", "gdn.ab", [rows(a + "in_proj_b.weight", g.Hv)], H, "text")
            matrix(o + "gdn/query_key", "gdn.qk", [rows(a + "in_proj_qkv.weight", conv_dim, 0, 2 * kd)], H, "text")
            matrix(o + "gdn/value_z", "gdn.vz", [rows(a + "in_proj_qkv.weight", conv_dim, 2 * kd, conv_dim),
                                                rows(a + "in_proj_z.weight", vd)], H, "text")
            vec(o + "gdn/norm", a + "norm.weight", (g.dv,), "text")
            matrix(o + "gdn/output", "gdn.out", [rows(a + "out_proj.weight", H)], vd, "text")
        vec(o + "post_attention_norm", p + "post_attention_layernorm.weight", (H,), "text")
        matrix(o + "mlp/gate_up", "mlp.gu", [rows(p + "mlp.gate_proj.weight", g.I), rows(p + "mlp.up_proj.weight", g.I)], H, "text")
        matrix(o + "mlp/down", "mlp.down", [rows(p + "mlp.down_proj.weight", H)], g.I, "text")
    vec("text/final_norm", P + "norm.weight", (H,), "text")
    if not g.tied:
        matrix("text/output_head", "head", [rows("lm_head.weight", g.vocab)], H, "text")
    if draft_ids is not None:
        ids = np.asarray(draft_ids, dtype=np.int64)
        matrix("text/draft_head", "draft", [(head_src, ids)], H, "draft")
        vec("text/draft_head_token_ids", None, (len(ids),), "draft", "I32",
            fn=lambda s, ids=ids: ids.astype(np.int32))
        objs[-1].sources = [head_src]
    if g.has_mtp:
        m, a = "mtp.", "mtp.layers.0.self_attn."
        matrix("mtp/input_projection", "mtp", [rows(m + "fc.weight", H)], 2 * H, "mtp")
        vec("mtp/embedding_norm", m + "pre_fc_norm_embedding.weight", (H,), "mtp")
        vec("mtp/hidden_norm", m + "pre_fc_norm_hidden.weight", (H,), "mtp")
        vec("mtp/layer/input_norm", m + "layers.0.input_layernorm.weight", (H,), "mtp")
        query, gate = q_parts(a + "q_proj.weight", g.Hq)
        matrix("mtp/layer/attention/query_key_gate_value", "mtp",
               query + [rows(a + "k_proj.weight", kvd)] + gate + [rows(a + "v_proj.weight", kvd)], H, "mtp")
        vec("mtp/layer/attention/query_norm", a + "q_norm.weight", (hd,), "mtp")
        vec("mtp/layer/attention/key_norm", a + "k_norm.weight", (hd,), "mtp")
        matrix("mtp/layer/attention/output", "mtp", [rows(a + "o_proj.weight", H)], g.Hq * hd, "mtp")
        vec("mtp/layer/post_attention_norm", m + "layers.0.post_attention_layernorm.weight", (H,), "mtp")
        matrix("mtp/layer/mlp/gate_up", "mtp", [rows(m + "layers.0.mlp.gate_proj.weight", g.I),
                                                rows(m + "layers.0.mlp.up_proj.weight", g.I)], H, "mtp")
        matrix("mtp/layer/mlp/down", "mtp", [rows(m + "layers.0.mlp.down_proj.weight", H)], g.I, "mtp")
        vec("mtp/final_norm", m + "norm.weight", (H,), "mtp")
    if g.has_vision:
        v, V = g.vision, "model.visual."
        matrix("vision/patch_embedding", "vis.patch", [rows(V + "patch_embed.proj.weight", v.Dv)], 1536, "vision")
        vec("vision/patch_embedding_bias", V + "patch_embed.proj.bias", (v.Dv,), "vision")
        matrix("vision/position_embedding", "vis.pos", [rows(V + "pos_embed.weight", v.pos)], v.Dv, "vision")
        for b in range(v.depth):
            p, o = V + "blocks.%d." % b, "vision/layers/%d/" % b
            matrix(o + "attention/qkv", "vis.qkv", [rows(p + "attn.qkv.weight", 3 * v.Dv)], v.Dv, "vision")
            vec(o + "attention/qkv_bias", p + "attn.qkv.bias", (3 * v.Dv,), "vision")
            matrix(o + "attention/output", "vis.out", [rows(p + "attn.proj.weight", v.Dv)], v.Dv, "vision")
            vec(o + "attention/output_bias", p + "attn.proj.bias", (v.Dv,), "vision")
            matrix(o + "mlp/fc1", "vis.fc1", [rows(p + "mlp.linear_fc1.weight", v.Iv)], v.Dv, "vision")
            vec(o + "mlp/fc1_bias", p + "mlp.linear_fc1.bias", (v.Iv,), "vision")
            matrix(o + "mlp/fc2", "vis.fc2", [rows(p + "mlp.linear_fc2.weight", v.Dv)], v.Iv, "vision")
            vec(o + "mlp/fc2_bias", p + "mlp.linear_fc2.bias", (v.Dv,), "vision")
            vec(o + "norm1/weight", p + "norm1.weight", (v.Dv,), "vision")
            vec(o + "norm1/bias", p + "norm1.bias", (v.Dv,), "vision")
            vec(o + "norm2/weight", p + "norm2.weight", (v.Dv,), "vision")
            vec(o + "norm2/bias", p + "norm2.bias", (v.Dv,), "vision")
        matrix("vision/merger/fc1", "vis.merger", [rows(V + "merger.linear_fc1.weight", 4 * v.Dv)], 4 * v.Dv, "vision")
        vec("vision/merger/fc1_bias", V + "merger.linear_fc1.bias", (4 * v.Dv,), "vision")
        matrix("vision/merger/fc2", "vis.merger", [rows(V + "merger.linear_fc2.weight", v.out)], 4 * v.Dv, "vision")
        vec("vision/merger/fc2_bias", V + "merger.linear_fc2.bias", (v.out,), "vision")
        vec("vision/merger/norm/weight", V + "merger.norm.weight", (v.Dv,), "vision")
        vec("vision/merger/norm/bias", V + "merger.norm.bias", (v.Dv,), "vision")
    return objs

def consumed_sources(objs):
    return {s for o in objs for s in o.sources}

# -----------------------------------------------------------------------------
# 7. frontend resources (format.md §8.11), tokenizer facts, the draft head (§8.10)

RESOURCE_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                  "preprocessor_config.json", "video_preprocessor_config.json"]

# model.md §6.1 / §6.2 values, for checkpoints that ship no processor files (and the synthetic ones)
PREPROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessorFast",
    "image_std": [0.5, 0.5, 0.5], "merge_size": 2, "patch_size": 16,
    "processor_class": "Qwen3VLProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "temporal_patch_size": 2,
}
VIDEO_PREPROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "do_sample_frames": True, "fps": 2.0, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "max_frames": 768, "merge_size": 2, "min_frames": 4, "patch_size": 16,
    "processor_class": "Qwen3VLProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "temporal_patch_size": 2,
    "video_processor_type": "Qwen3VLVideoProcessor",
}

def hf_json_bytes(d):
    # transformers' to_json_string: 2-space indent, sorted keys, trailing newline
    return (json.dumps(d, indent=2, sort_keys=True) + "\n").encode()

class TokInfo:
    pass

def tokenizer_info(tok_bytes, tok_cfg_bytes):
    try:
        tok = json.loads(tok_bytes)
    except ValueError as e:
        die("tokenizer.json: bad JSON (%s)" % e)
    try:
        cfg = json.loads(tok_cfg_bytes)
    except ValueError as e:
        die("tokenizer_config.json: bad JSON (%s)" % e)
    vocab = tok.get("model", {}).get("vocab") if isinstance(tok, dict) else None
    if not isinstance(vocab, dict):
        die("tokenizer.json: model.vocab is not a BPE vocabulary")
    info = TokInfo()
    ids = set(vocab.values())
    info.added, special = {}, set()
    for a in tok.get("added_tokens", []):
        ids.add(a["id"])
        info.added[a["content"]] = a["id"]
        if a.get("special"):
            special.add(a["id"])
    # tokenizer_config's added_tokens_decoder wins where both speak ("merged" in format.md §8.10)
    for k, d in (cfg.get("added_tokens_decoder") or {}).items():
        i = int(k)
        ids.add(i)
        info.added.setdefault(d.get("content"), i)
        if d.get("special"):
            special.add(i)
        else:
            special.discard(i)
    info.domain = max(ids) + 1
    if len(ids) != info.domain:
        log("note: tokenizer ids are not contiguous (%d ids, max %d)" % (len(ids), info.domain - 1))
    info.special = sorted(special)
    info.cfg = cfg
    return info

def token_id(info, tok):
    if isinstance(tok, dict):
        tok = tok.get("content")
    return info.added.get(tok) if tok is not None else None

def synth_generation_config(info, text_cfg):
    """NInfer's synthesized generation_config.json (format.md §8.11). the stop ids are
    [<|im_end|>, <|endoftext|>] of the Qwen3.5 vocabulary; for another vocabulary they come from the
    tokenizer (eos_token, pad_token) and config text_config.eos_token_id."""
    if info.added.get("<|im_end|>") == 248046 and info.added.get("<|endoftext|>") == 248044:
        eos, bos = [248046, 248044], 248044
    else:
        eos = []
        for i in (token_id(info, info.cfg.get("eos_token")), token_id(info, info.cfg.get("pad_token"))):
            if i is not None and i not in eos:
                eos.append(i)
        e = text_cfg.get("eos_token_id")
        for i in (e if isinstance(e, list) else [e]):
            if isinstance(i, int) and i not in eos:
                eos.append(i)
        if not eos:
            die("cannot synthesize generation_config.json: no eos token in tokenizer_config.json or config.json")
        bos = token_id(info, info.cfg.get("pad_token"))
        bos = bos if bos is not None else eos[-1]
    return hf_json_bytes({"bos_token_id": bos, "do_sample": True, "eos_token_id": eos, "pad_token_id": bos,
                          "temperature": 1.0, "top_k": 20, "top_p": 0.95, "transformers_version": "5.13.0"})

def read_ranking(path, vocab_rows, domain):
    """row 0 of a little-endian I64 count array of row width vocab_rows (format.md §8.10)."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        die("--draft-ranking %s: %s" % (path, e.strerror))
    if size % 8 or size == 0:
        die("--draft-ranking %s: %d bytes is not an I64 array" % (path, size))
    width = vocab_rows if size % (vocab_rows * 8) == 0 else size // 8
    if width < domain:
        die("--draft-ranking %s: row width %d is smaller than the token domain %d" % (path, width, domain))
    counts = np.fromfile(path, dtype="<i8", count=width)
    return counts[:domain]

def draft_ids(counts, special, rows, domain):
    """format.md §8.10: stable sort by count descending (ties by id), keep the forced (special) ids,
    fill with the best others, then stable sort again."""
    forced = [i for i in special if i < domain]
    if rows < len(forced):
        die("--draft-rows %d is smaller than the %d special ids" % (rows, len(forced)))
    order = np.argsort(-counts, kind="stable")
    is_forced = np.zeros(domain, dtype=bool)
    is_forced[forced] = True
    chosen = np.concatenate([order[~is_forced[order]][:rows - len(forced)], np.asarray(forced, dtype=np.int64)])
    chosen = chosen[np.argsort(-counts[chosen], kind="stable")]
    if len(np.unique(chosen)) != rows:
        die("draft head: %d unique ids, expected %d" % (len(np.unique(chosen)), rows))
    return chosen.astype(np.int64)

# -----------------------------------------------------------------------------
# 8. planning and writing

class Checkpoint:
    """what a conversion reads: config, geometry, tensor source, resource bytes."""
    pass

def fixtures_dir():
    d = os.environ.get("NINFER_FIXTURES") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shared", "fixtures")
    if not os.path.isdir(d):
        die("fixtures not found at %s (set NINFER_FIXTURES)" % d)
    return d

def read_file(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        die("%s: %s" % (path, e.strerror))

def open_hf_dir(d, with_tensors=True):
    ck = Checkpoint()
    if not os.path.isdir(d):
        die("%s: not a directory" % d)
    cfg_bytes = read_file(os.path.join(d, "config.json"))
    try:
        ck.config = json.loads(cfg_bytes)
    except ValueError as e:
        die("%s: bad JSON (%s)" % (os.path.join(d, "config.json"), e))
    ck.geom = parse_config(ck.config)
    index = os.path.join(d, "model.safetensors.index.json")
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(index):
        try:
            wm = json.loads(read_file(index))["weight_map"]
        except (ValueError, KeyError, TypeError):
            die("%s: bad index (no weight_map)" % index)
        files = sorted(set(wm.values()))
        paths = [os.path.join(d, f) for f in files]
        for p in paths:
            if not os.path.exists(p):
                die("%s: shard listed in the index is missing" % p)
    elif os.path.exists(single):
        paths = [single]
    else:
        die("%s: no model.safetensors or model.safetensors.index.json" % d)
    ck.source = SafetensorsSource(paths)
    if os.path.exists(index):
        for n in ck.source.names():
            if wm.get(n) is None:
                die("tensor %s is in a shard but not in %s" % (n, index))
    ck.resources = {}
    for name in RESOURCE_FILES:
        p = os.path.join(d, name)
        if os.path.exists(p):
            ck.resources[name] = read_file(p)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if name not in ck.resources:
            die("%s is missing" % os.path.join(d, name))
    ck.label = d
    return ck

def text_config(cfg):
    return cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}

def finish_resources(ck):
    """fill in the resources a checkpoint may lack and return them in §8.11 order."""
    ck.tok = tokenizer_info(ck.resources["tokenizer.json"], ck.resources["tokenizer_config.json"])
    if "generation_config.json" not in ck.resources:
        log("no generation_config.json: synthesizing NInfer's (format.md §8.11)")
        ck.resources["generation_config.json"] = synth_generation_config(ck.tok, text_config(ck.config))
    else:
        try:
            json.loads(ck.resources["generation_config.json"])
        except ValueError as e:
            die("generation_config.json: bad JSON (%s)" % e)
    for name, d in (("preprocessor_config.json", PREPROCESSOR), ("video_preprocessor_config.json", VIDEO_PREPROCESSOR)):
        if name not in ck.resources:
            log("no %s: writing the Qwen3.5 defaults (model.md §6)" % name)
            ck.resources[name] = hf_json_bytes(d)
    return [("frontend/" + n, ck.resources[n]) for n in RESOURCE_FILES]

def default_model_id(g):
    if g.synthetic:
        return "qwen3.5-synthetic-%s" % g.synthetic
    size = RELEASED.get((g.H, g.L))
    if size is None:
        size = "h%dl%d" % (g.H, g.L)
        log("note: hidden %d / %d layers is not a released size; model_id qwen3.5-%s (use --model-id)" % (g.H, g.L, size))
    return "qwen3.5-" + size

def plan(ck, weights, ranking=None, draft_rows=None, model_id=None):
    """validate everything and lay out the file. returns (identity, objs, header bytes, file size)."""
    g = ck.geom
    if weights not in WEIGHTS:
        die("--weights must be one of %s" % ", ".join(WEIGHTS))
    check_source(g, ck.source)
    resources = finish_resources(ck)
    tok = ck.tok
    if tok.domain > g.vocab:
        die("tokenizer.json has %d ids but the embedding has only %d rows" % (tok.domain, g.vocab))
    rows = min(131072, tok.domain) if draft_rows is None else draft_rows
    if rows < 0 or rows > tok.domain:
        die("--draft-rows %d is outside [0, %d] (the token domain)" % (rows, tok.domain))
    ids = None
    if rows:
        if ranking:
            counts = read_ranking(ranking, g.vocab, tok.domain)
            log("draft head: %d rows from the frequency ranking %s (+%d special ids forced)" % (rows, ranking, len(tok.special)))
        else:
            counts = np.zeros(tok.domain, dtype=np.int64)  # no ranking = every count zero = lowest ids first
            log("draft head: %d rows from the lowest token ids (+%d special ids forced); no --draft-ranking" % (rows, len(tok.special)))
        ids = draft_ids(counts, tok.special, rows, tok.domain)
    objs = build_objects(g, weights, resources, ids)
    hf = {n for n, _, _, _ in hf_inventory(g, g.prefix, g.has_mtp, g.has_vision)}
    left = hf - consumed_sources(objs)
    if left:
        die("source tensor %s is not consumed by the recipe" % sorted(left)[0])
    names = [o.name for o in objs]
    if len(set(names)) != len(names):
        die("internal: duplicate object names")
    identity = {"model_id": model_id or default_model_id(g), "weights_id": weights}
    cursor = 0
    for o in objs:
        o.offset = align_up(cursor, TENSOR_ALIGN if o.kind == "tensor" else 1)
        cursor = o.offset + o.nbytes
    directory = {"identity": identity, "objects": [o.directory_entry() for o in objs]}
    text = json.dumps(directory, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    header = MAGIC_V2 + struct.pack("<Q", len(text)) + text
    payload = align_up(len(header), PAYLOAD_ALIGN)
    header += bytes(payload - len(header))
    return identity, objs, header, payload + cursor

def plan_summary(identity, objs, header, size, out=sys.stdout):
    tensors = [o for o in objs if o.kind == "tensor"]
    groups = {}
    for o in tensors:
        groups.setdefault(o.group, [0, 0])
        groups[o.group][0] += 1
        groups[o.group][1] += o.nbytes
    fmts = {}
    for o in tensors:
        fmts.setdefault(o.format, 0)
        fmts[o.format] += 1
    first = tensors[0].offset if tensors else 0
    end = max(o.offset + o.nbytes for o in objs)
    print("identity: model_id=%s weights_id=%s" % (identity["model_id"], identity["weights_id"]), file=out)
    print("objects: %d (%d resources, %d tensors)" % (len(objs), len(objs) - len(tensors), len(tensors)), file=out)
    for gname in ("text", "draft", "mtp", "vision"):
        if gname in groups:
            print("  %-7s %4d tensors %16s bytes" % (gname, groups[gname][0], "{:,}".format(groups[gname][1])), file=out)
    print("formats: " + ", ".join("%s %d" % (f, fmts[f]) for f in sorted(fmts)), file=out)
    print("json: %s bytes, payload at %s" % ("{:,}".format(struct.unpack("<Q", header[8:16])[0]), "{:,}".format(len(header))), file=out)
    print("tensor span: %s bytes (payload %s -> %s)" % ("{:,}".format(end - first), "{:,}".format(first), "{:,}".format(end)), file=out)
    print("file size: %s bytes" % "{:,}".format(size), file=out)

# the row chunks of one object
def object_tasks(i, o):
    if o.kind != "tensor" or o.segs is None:
        return [(i, 0, 0)]
    n, k = o.shape
    step = max(1, CHUNK_ELEMS // align_up(k, 128))
    return [(i, r, min(n, r + step)) for r in range(0, n, step)]

def fetch_rows(o, r0, r1, src):
    parts, pos = [], 0
    for name, idx in o.segs:
        a, b = max(r0, pos), min(r1, pos + len(idx))
        if a < b:
            parts.append(src.rows(name, idx[a - pos:b - pos]))
        pos += len(idx)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

def pwrite_all(fd, data, off):
    mv = memoryview(data)
    while mv:
        n = os.pwrite(fd, mv, off)
        mv, off = mv[n:], off + n

def write_object_chunk(fd, payload, o, r0, r1, src):
    """encode rows [r0, r1) of a matrix object (or the whole of a small one) and write them in place."""
    base_off = payload + o.offset
    try:
        if o.segs is None:
            x = o.fn(src)
            if tuple(x.shape) != tuple(o.shape):
                die("internal: %s computed %s" % (o.name, fmt_shape(x.shape)))
            if o.format == "BF16":
                data = f32_to_bf16(x).astype("<u2")
            elif o.format == "FP32":
                data = np.ascontiguousarray(x, dtype="<f4")
            else:
                data = np.ascontiguousarray(x, dtype="<i4")
            pwrite_all(fd, data.tobytes(), base_off)
            return
        # a task is a few million values; it is fetched and encoded in cache-sized sub-blocks of rows
        n, k = o.shape
        step = max(1, ENC_BLOCK // align_up(k, 128))
        if o.format == "BF16":
            buf = np.empty((r1 - r0, k), dtype="<u2")
            for a in range(r0, r1, step):
                b = min(r1, a + step)
                buf[a - r0:b - r0] = f32_to_bf16(fetch_rows(o, a, b, src))
            pwrite_all(fd, buf.tobytes(), base_off + r0 * k * 2)
            return
        geo = row_split_geometry(o.format, n, k)
        base = np.empty((r1 - r0, geo["base_row"]), dtype=np.uint8)
        high = np.empty((r1 - r0, geo["high_row"]), dtype=np.uint8)
        scales = np.empty((r1 - r0, geo["gpr"]), dtype="<u2")
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            codes, sc = encode_groupwise(fetch_rows(o, a, b, src), o.format)
            base[a - r0:b - r0], high[a - r0:b - r0], scales[a - r0:b - r0] = pack_planes(codes, sc, o.format)
        pwrite_all(fd, base.tobytes(), base_off + r0 * geo["base_row"])
        if geo["high_row"]:
            pwrite_all(fd, high.tobytes(), base_off + geo["high_offset"] + r0 * geo["high_row"])
        pwrite_all(fd, scales.tobytes(), base_off + geo["scale_offset"] + r0 * geo["scale_row"])
    except ConvertError as e:
        src_names = (" (from %s)" % ", ".join(o.sources)) if o.sources else ""
        die("%s%s: %s" % (o.name, src_names, e))

# the fork pool: workers inherit the plan and the (memory-mapped or synthetic) source, open the
# output themselves and pwrite their chunks at fixed offsets, so the bytes do not depend on the
# number of workers or the order chunks finish in.
_JOB = None

def _worker_init():
    global _FD
    _FD = os.open(_JOB["path"], os.O_WRONLY)

def _worker_run(task):
    _JOB["fn"](_FD, task)
    return task

def run_tasks(path, tasks, fn, jobs, on_done):
    global _JOB
    if jobs <= 1 or len(tasks) <= 1:
        fd = os.open(path, os.O_WRONLY)
        try:
            for t in tasks:
                fn(fd, t)
                on_done(t)
        finally:
            os.close(fd)
        return
    _JOB = {"path": path, "fn": fn}
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs, initializer=_worker_init) as pool:
        for t in pool.imap_unordered(_worker_run, tasks, chunksize=1):
            on_done(t)
    _JOB = None

def write_atomically(out, size, prefix_parts, tasks, fn, jobs, on_done):
    """write to OUT.tmp (sized up front, gaps stay zero), then rename; remove it on any failure."""
    tmp = out + ".tmp"
    try:
        with open(tmp, "wb") as f:
            for off, data in prefix_parts:
                f.seek(off)
                f.write(data)
            f.truncate(size)
        run_tasks(tmp, tasks, fn, jobs, on_done)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise

def write_artifact(out, ck, identity, objs, header, size, jobs):
    payload = len(header)
    parts = [(0, header)] + [(payload + o.offset, o.data) for o in objs if o.kind == "resource"]
    tensors = [(i, o) for i, o in enumerate(objs) if o.kind == "tensor"]
    tasks = [t for i, o in tensors for t in object_tasks(i, o)]
    left = {}
    for i, r0, r1 in tasks:
        left[i] = left.get(i, 0) + 1
    done, t0 = [0], time.time()
    src = ck.source

    def fn(fd, t):
        i, r0, r1 = t
        write_object_chunk(fd, payload, objs[i], r0, r1, src)

    def on_done(t):
        i = t[0]
        left[i] -= 1
        if left[i] == 0:
            done[0] += 1
            o = objs[i]
            log("[%d/%d] %s %s %s %s bytes (%.0fs)" % (done[0], len(tensors), o.name, fmt_shape(o.shape), o.format,
                                                       "{:,}".format(o.nbytes), time.time() - t0))
    log("writing %s: %d objects, %s bytes, %d job(s)" % (out, len(objs), "{:,}".format(size), jobs))
    write_atomically(out, size, parts, tasks, fn, jobs, on_done)
    log("wrote %s (%s bytes, %.1fs)" % (out, "{:,}".format(size), time.time() - t0))

# -----------------------------------------------------------------------------
# 9. synthetic checkpoints
#
# the random stream is a counter-based generator built only from exactly-specified operations, so
# it is the same on every machine and numpy version:
#   key(tensor)  = mix(seed * GAMMA + fnv1a64(tensor name))            (python ints, mod 2^64)
#   word(i)      = mix(key + (i + 1) * GAMMA)   for flat element index i (numpy uint64, wraps)
# where mix is the splitmix64 finalizer. a tensor's element i depends only on (seed, name, i), so
# any row range or row list can be generated on its own, in any order, in any process.
#   normal(mean, std): the sum s of the four 16-bit halves of word(i) (Irwin-Hall, n = 4: bell
#     shaped, |z| <= 3.46), z = (s - 131070) * f32(std * sqrt(3) / 65536) + mean, in f32.
#     we do not use Box-Muller: numpy's SIMD log/cos may differ in the last ulp between CPUs.
#   uniform(lo, hi): lo + (hi - lo) * u with u = (word >> 11) * 2^-53, in f64.
#   log_uniform(lo, hi): our own series log of a uniform draw (libm-free, bit-reproducible).
# values are then rounded to the stored dtype (bf16 words, or f32).

GAMMA = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1

def mix64_int(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)

def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return h

def mix64(z):
    """splitmix64 finalizer over a uint64 array, in place."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z

def tensor_key(seed, name):
    return mix64_int((seed * GAMMA + fnv1a64(name)) & M64)

_GAMMA_TABLES = {}

def gamma_table(k):
    """GAMMA * j for j < k (uint64, wrapping): word(r*k + j) = mix(key + GAMMA*(r*k + 1) + table[j])."""
    t = _GAMMA_TABLES.get(k)
    if t is None:
        t = _GAMMA_TABLES[k] = np.arange(k, dtype=np.uint64) * np.uint64(GAMMA)
    return t

def series_log(x):
    """natural log of positive float64 x with only IEEE +,-,*,/ (bit-reproducible everywhere)."""
    m, e = np.frexp(x)                # x = m * 2^e, m in [0.5, 1), exact
    small = m < math.sqrt(0.5)
    m = np.where(small, m * 2.0, m)   # m in [0.707, 1.414)
    e = np.where(small, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)         # log m = 2 atanh s, |s| < 0.172
    s2 = s * s
    p = np.full_like(s, 1.0 / 29.0)
    for k in range(13, -1, -1):
        p = p * s2 + 1.0 / (2 * k + 1)
    return 2.0 * s * p + e * 0.6931471805599453

def words_to_values(z, init):
    """uint64 words [n, k] -> f32 values of the distribution init."""
    kind, a, b = init
    if kind == "normal":
        h = z.view(np.uint16).reshape(z.shape + (4,))  # the sum of the four halves does not depend on byte order
        s = np.add(h[..., 0], h[..., 1], dtype=np.int32)
        s += h[..., 2]
        s += h[..., 3]
        s -= 131070
        v = np.multiply(s, np.float32(b * math.sqrt(3.0) / 65536.0), dtype=np.float32, casting="unsafe")  # exact int -> f32, one rne multiply
        if a:
            v += np.float32(a)
        return v
    u = (z >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)
    u = a + (b - a) * u
    return (series_log(u) if kind == "log_uniform" else u).astype(np.float32)

RNG_BLOCK = 1 << 15  # values per block: small enough that the uint64 temporaries stay in cache

def rng_rows(seed, name, rows, k, init, dtype):
    """rows `rows` of a tensor viewed as [shape0, k], in the stored dtype (bf16 words or f32)."""
    rows = np.asarray(rows, dtype=np.uint64)
    key = tensor_key(seed, name)
    off = rows * np.uint64((GAMMA * k) & M64) + np.uint64((key + GAMMA) & M64)
    tab = gamma_table(k)
    out = np.empty((len(rows), k), dtype=np.uint16 if dtype == "BF16" else np.float32)
    bn = max(1, RNG_BLOCK // k)
    for r in range(0, len(rows), bn):
        z = off[r:r + bn, None] + tab[None, :]
        v = words_to_values(mix64(z), init)
        out[r:r + bn] = f32_to_bf16(v) if dtype == "BF16" else v
    return out

class SyntheticSource:
    """the tensors of a synthetic checkpoint, generated on demand (rows or row lists)."""

    def __init__(self, g, seed):
        self.seed = seed
        self.inv = {n: (shape, dt, init) for n, shape, dt, init in hf_inventory(g)}

    def names(self):
        return list(self.inv)

    def shape(self, name):
        return self.inv[name][0]

    def dtype(self, name):
        return self.inv[name][1]

    def raw(self, name, idx):
        """rows idx of [shape0, rest] in the stored dtype: bf16 words (uint16) or f32."""
        shape, dt, init = self.inv[name]
        if isinstance(idx, range) and idx.step == 1:
            rows = np.arange(idx.start, idx.stop, dtype=np.uint64)
        else:
            rows = np.asarray(idx, dtype=np.uint64)
        return rng_rows(self.seed, name, rows, numel(shape[1:]), init, dt)

    def rows(self, name, idx):
        return to_f32(self.raw(name, idx), self.dtype(name))

    def full(self, name):
        return self.rows(name, range(0, self.shape(name)[0])).reshape(self.shape(name))

def synthetic_files(name):
    """the non-tensor files of a synthetic checkpoint (byte-identical on every run)."""
    fx = fixtures_dir()
    files = {
        "config.json": hf_json_bytes(synthetic_config(name)),
        "tokenizer.json": read_file(os.path.join(fx, "qwen3-tokenizer", "tokenizer.json")),
        "tokenizer_config.json": read_file(os.path.join(fx, "qwen3-tokenizer", "tokenizer_config.json")),
        "chat_template.jinja": read_file(os.path.join(fx, "qwen3.5", "chat_template.jinja")),
        "preprocessor_config.json": hf_json_bytes(PREPROCESSOR),
        "video_preprocessor_config.json": hf_json_bytes(VIDEO_PREPROCESSOR),
    }
    tok = tokenizer_info(files["tokenizer.json"], files["tokenizer_config.json"])
    files["generation_config.json"] = synth_generation_config(tok, synthetic_config(name)["text_config"])
    return files

def open_synthetic(name, seed):
    ck = Checkpoint()
    if name not in SYNTHETIC:
        die("unknown synthetic model %r (one of: %s)" % (name, ", ".join(SYNTHETIC)))
    ck.config = synthetic_config(name)
    ck.geom = parse_config(ck.config)
    ck.source = SyntheticSource(ck.geom, seed)
    files = synthetic_files(name)
    ck.resources = {n: files[n] for n in RESOURCE_FILES}
    ck.label = "synthetic %s (seed %d)" % (name, seed)
    return ck

def write_synthetic_dir(name, seed, out, jobs):
    """config.json, model.safetensors (F32 tensors first, then BF16, each by name) and the frontend files."""
    ck = open_synthetic(name, seed)
    src = ck.source
    names = sorted(src.names(), key=lambda n: (src.dtype(n) != "F32", n))
    tensors = [(n, src.dtype(n), src.shape(n)) for n in names]
    head, offs, data_bytes = st_header_bytes(tensors)
    tasks = []
    for i, (n, dt, shape) in enumerate(tensors):
        k = numel(shape[1:])
        step = max(1, CHUNK_ELEMS // k)
        tasks += [(i, r, min(shape[0], r + step)) for r in range(0, shape[0], step)]

    def fn(fd, t):
        i, r0, r1 = t
        n, dt, shape = tensors[i]
        raw = src.raw(n, range(r0, r1))
        pwrite_all(fd, np.ascontiguousarray(raw).astype("<u2" if dt == "BF16" else "<f4").tobytes(),
                   len(head) + offs[i] + r0 * numel(shape[1:]) * raw.itemsize)

    os.makedirs(out, exist_ok=True)
    files = synthetic_files(name)
    written = []
    try:
        t0 = time.time()
        log("writing %s/model.safetensors: %d tensors, %s bytes" % (out, len(tensors), "{:,}".format(len(head) + data_bytes)))
        left = {}
        for t in tasks:
            left[t[0]] = left.get(t[0], 0) + 1

        def on_done(t):
            left[t[0]] -= 1
            if left[t[0]] == 0:
                n, dt, shape = tensors[t[0]]
                log("[%d/%d] %s %s %s (%.0fs)" % (len(tensors) - sum(1 for v in left.values() if v), len(tensors),
                                                   n, fmt_shape(shape), dt, time.time() - t0))
        write_atomically(os.path.join(out, "model.safetensors"), len(head) + data_bytes, [(0, head)], tasks, fn, jobs, on_done)
        written.append(os.path.join(out, "model.safetensors"))
        for fname in ["config.json"] + RESOURCE_FILES:
            path = os.path.join(out, fname)
            write_atomically(path, len(files[fname]), [(0, files[fname])], [], None, 1, None)
            written.append(path)
        log("wrote synthetic %s (seed %d) to %s (%.1fs)" % (name, seed, out, time.time() - t0))
    except BaseException:
        for p in written:
            try:
                os.remove(p)
            except OSError:
                pass
        raise

# -----------------------------------------------------------------------------
# 10. inspect: read a .ninfer like a loader would (format.md §2-§5) and print its directory

def read_directory(path):
    """validate the framing, the directory schema and the payload geometry. returns
    (version, identity or model_id, objects, payload_offset, file size)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(16)
            if len(prefix) < 16:
                die("%s: too short for a .ninfer prefix" % path)
            magic = prefix[:8]
            if magic not in (MAGIC_V1, MAGIC_V2):
                die("%s: bad magic %s (expected NINFER\\0\\2)" % (path, magic.hex()))
            (jn,) = struct.unpack("<Q", prefix[8:])
            if jn == 0 or 16 + jn > size:
                die("%s: json_bytes %d out of range" % (path, jn))
            text = f.read(jn)
    except OSError as e:
        die("%s: %s" % (path, e.strerror))
    version = magic[7]

    def no_dups(pairs):
        d = {}
        for k, v in pairs:
            if k in d:
                die("%s: duplicate JSON member %r" % (path, k))
            d[k] = v
        return d
    try:
        root = json.loads(text.decode("utf-8"), object_pairs_hook=no_dups)
    except (UnicodeDecodeError, ValueError) as e:
        die("%s: bad JSON directory (%s)" % (path, e))
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
    is_str = lambda v: isinstance(v, str) and v != ""
    if not isinstance(root, dict):
        die("%s: the directory is not a JSON object" % path)
    if version == 2:
        if set(root) != {"identity", "objects"}:
            die("%s: v2 root members are %s, expected identity and objects" % (path, sorted(root)))
        ident = root["identity"]
        if not isinstance(ident, dict) or set(ident) != {"model_id", "weights_id"} or not all(is_str(ident[k]) for k in ident):
            die("%s: bad identity %r" % (path, ident))
    else:
        if set(root) != {"model_id", "objects"} or not is_str(root["model_id"]):
            die("%s: bad v1 root" % path)
        ident = {"model_id": root["model_id"]}
    objs = root["objects"]
    if not isinstance(objs, list) or not objs:
        die("%s: objects is not a non-empty array" % path)
    payload = align_up(16 + jn, PAYLOAD_ALIGN)
    if payload > size:
        die("%s: file ends before the payload" % path)
    cursor, seen = 0, set()
    for o in objs:
        if not isinstance(o, dict) or not is_str(o.get("name")):
            die("%s: object without a name: %r" % (path, o))
        nm = o["name"]
        if nm in seen:
            die("%s: duplicate object name %s" % (path, nm))
        seen.add(nm)
        if o.get("kind") == "tensor":
            if list(o) != ["name", "kind", "shape", "format", "layout", "offset", "bytes"] and \
               set(o) != {"name", "kind", "shape", "format", "layout", "offset", "bytes"}:
                die("%s: tensor %s has members %s" % (path, nm, list(o)))
            shape = o["shape"]
            if not isinstance(shape, list) or not all(is_int(d) and d > 0 for d in shape) or len(shape) > 16:
                die("%s: tensor %s has a bad shape %r" % (path, nm, shape))
            if o["format"] not in DIRECT and o["format"] not in GROUPED:
                die("%s: tensor %s has an unknown format %r" % (path, nm, o["format"]))
            want_layout = CONTIGUOUS if o["format"] in DIRECT else ROW_SPLIT
            if o["layout"] != want_layout:
                die("%s: tensor %s: format %s needs layout %s, not %r" % (path, nm, o["format"], want_layout, o["layout"]))
            align = TENSOR_ALIGN
        elif o.get("kind") == "resource":
            if set(o) != {"name", "kind", "encoding", "offset", "bytes"}:
                die("%s: resource %s has members %s" % (path, nm, list(o)))
            if o["encoding"] != RAW_BYTES:
                die("%s: resource %s has an unknown encoding %r" % (path, nm, o["encoding"]))
            align = 1
        else:
            die("%s: object %s has kind %r" % (path, nm, o.get("kind")))
        off, nb = o["offset"], o["bytes"]
        if not is_int(off) or off < 0 or not is_int(nb) or nb <= 0:
            die("%s: object %s has a bad offset/bytes" % (path, nm))
        if o["kind"] == "tensor" and nb != encoded_size(o["format"], o["layout"], o["shape"]):
            die("%s: tensor %s: bytes %d != encoded size %d" % (path, nm, nb, encoded_size(o["format"], o["layout"], o["shape"])))
        if off < cursor:
            die("%s: object %s overlaps the previous one (offset %d < %d)" % (path, nm, off, cursor))
        if off % align:
            die("%s: object %s offset %d is not %d-aligned" % (path, nm, off, align))
        if off + nb > size - payload:
            die("%s: object %s runs past the end of the file" % (path, nm))
        cursor = off + nb
    return version, ident, objs, payload, size

def inspect(path, out=sys.stdout):
    version, ident, objs, payload, size = read_directory(path)
    print("%s: container v%d, %s bytes, payload at %d" % (path, version, "{:,}".format(size), payload), file=out)
    print("identity: " + " ".join("%s=%s" % kv for kv in ident.items()), file=out)
    print("objects: %d" % len(objs), file=out)
    w = max(len(o["name"]) for o in objs)
    for o in objs:
        if o["kind"] == "tensor":
            print("  %-*s tensor   %-10s %-17s %-16s %14d %14d" % (w, o["name"], o["format"], o["layout"],
                  fmt_shape(o["shape"]), o["offset"], o["bytes"]), file=out)
        else:
            print("  %-*s resource %-10s %-17s %-16s %14d %14d" % (w, o["name"], "-", o["encoding"], "-",
                  o["offset"], o["bytes"]), file=out)
    totals = {}
    for o in objs:
        key = o["format"] if o["kind"] == "tensor" else "resource"
        c = totals.setdefault(key, [0, 0])
        c[0] += 1
        c[1] += o["bytes"]
    print("totals:", file=out)
    for k in sorted(totals):
        print("  %-12s %5d objects %16s bytes" % (k, totals[k][0], "{:,}".format(totals[k][1])), file=out)
    tensors = [o for o in objs if o["kind"] == "tensor"]
    if tensors:
        first = tensors[0]["offset"]
        end = max(o["offset"] + o["bytes"] for o in objs)
        print("tensor span: %s bytes" % "{:,}".format(end - first), file=out)

# -----------------------------------------------------------------------------
# 11. cli (argparse; errors are one line "convert.py: error: ..." and exit 1)

def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="convert.py", description="Qwen3.5 dense HF checkpoint -> .ninfer (container v2)")
    ap.add_argument("hf_dir", nargs="?", help="Hugging Face checkpoint directory")
    ap.add_argument("-o", "--output", help="output .ninfer file (or, with --synthetic, a checkpoint directory)")
    ap.add_argument("--weights", default="groupwise-int", choices=WEIGHTS, help="weights profile (default groupwise-int)")
    ap.add_argument("--draft-ranking", help="I64 token frequency counts for the draft head (format.md §8.10)")
    ap.add_argument("--draft-rows", type=int, help="draft head rows (default min(131072, token domain); 0 = none)")
    ap.add_argument("--model-id", help="identity model_id (default qwen3.5-<size> from the geometry)")
    ap.add_argument("--synthetic", metavar="NAME", help="random weights: " + ", ".join(SYNTHETIC))
    ap.add_argument("--seed", type=int, default=0, help="synthetic seed (default 0)")
    ap.add_argument("--plan", action="store_true", help="validate and lay out the file, write nothing")
    ap.add_argument("--inspect", metavar="FILE", help="print the directory of a .ninfer file")
    ap.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 16), help="worker processes (default: cores, max 16)")
    a = ap.parse_args(argv)
    try:
        if a.inspect:
            inspect(a.inspect)
            return 0
        if a.synthetic and a.hf_dir:
            die("give either HF_DIR or --synthetic, not both")
        if not a.synthetic and not a.hf_dir:
            die("nothing to do: give HF_DIR, --synthetic NAME or --inspect FILE (see --help)")
        if a.seed < 0 or a.seed >= 1 << 63:
            die("--seed must be in [0, 2^63)")
        if a.synthetic and not a.plan and a.output and not a.output.endswith(".ninfer"):
            write_synthetic_dir(a.synthetic, a.seed, a.output, a.jobs)
            return 0
        if not a.plan and not a.output:
            die("-o OUT.ninfer is required")
        if not a.plan and not a.output.endswith(".ninfer"):
            die("-o %s: the artifact name must end in .ninfer" % a.output)
        ck = open_synthetic(a.synthetic, a.seed) if a.synthetic else open_hf_dir(a.hf_dir)
        identity, objs, header, size = plan(ck, a.weights, a.draft_ranking, a.draft_rows, a.model_id)
        if a.plan:
            plan_summary(identity, objs, header, size)
            return 0
        write_artifact(a.output, ck, identity, objs, header, size, max(1, a.jobs))
        return 0
    except ConvertError as e:
        print("convert.py: error: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:  # e.g. the output directory does not exist, or the disk is full
        print("convert.py: error: %s%s" % (e.filename + ": " if e.filename else "", e.strerror or e), file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main())
