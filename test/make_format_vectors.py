"""write a small .ninfer v2 file of format test vectors: for every numeric format, tensors encoded
by convert.py's canonical encoder (format.md 6.3) next to FP32 copies of the values they must
decode to, computed here independently of the C++ reader (w = f32(scale) * code). the C++ test
(test/test_format.cu, RoundTrip) decodes each tensor and compares bit for bit.

usage: python3 test/make_format_vectors.py OUT.ninfer"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import convert  # noqa: E402

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def cases(rng):
    """(name, f32 matrix) pairs that hit the encoder's corners."""
    out = []
    out.append(("random", rng.standard_normal((7, 384)).astype(np.float32)))
    out.append(("partial", rng.standard_normal((3, 130)).astype(np.float32) * 3))   # k_pad 256
    out.append(("short", rng.standard_normal((5, 64)).astype(np.float32)))          # padding group
    out.append(("wide", rng.standard_normal((2, 4304)).astype(np.float32)))          # vision fc2 k
    z = rng.standard_normal((4, 128)).astype(np.float32)
    z[1] = 0.0                                                                        # zero row: scale 0
    z[2, :64] = 0.0                                                                   # zero group
    z[3] *= np.float32(1e-9)                                                          # subnormal scales
    out.append(("zeros_tiny", z))
    # exact ties: values at (c + 0.5) * s for an exactly representable scale
    t = np.zeros((2, 128), dtype=np.float32)
    t[0, :] = (np.arange(128) % 16 - 8 + 0.5).astype(np.float32)
    t[0, 0] = 7.0
    t[1, :] = -t[0, :]
    out.append(("ties", t))
    out.append(("huge", (rng.standard_normal((2, 128)) * 60000).astype(np.float32)))
    return out


def main():
    path = sys.argv[1]
    rng = np.random.default_rng(20261129)  # only picks test values; the encoder is deterministic
    objects, blobs = [], []

    def add(name, fmt, layout, shape, data):
        blobs.append((name, fmt, layout, list(shape), data))

    for fmt in GROUPED:
        for cname, x in cases(rng):
            codes, scales = convert.encode_groupwise(x, fmt)
            g = convert.GROUPED[fmt][1]
            n, k = x.shape
            ref = (codes.astype(np.float32).reshape(n, -1, g) *
                   scales.view(np.float16).astype(np.float32)[:, :, None]).reshape(n, -1)[:, :k]
            add("t/%s/%s" % (fmt, cname), fmt, convert.ROW_SPLIT, x.shape, convert.pack_row_split(codes, scales, fmt))
            add("ref/%s/%s" % (fmt, cname), "FP32", convert.CONTIGUOUS, x.shape, np.ascontiguousarray(ref, "<f4").tobytes())
    x = rng.standard_normal((3, 50)).astype(np.float32)
    bf = convert.f32_to_bf16(x)
    add("t/BF16/random", "BF16", convert.CONTIGUOUS, x.shape, np.ascontiguousarray(bf, "<u2").tobytes())
    add("ref/BF16/random", "FP32", convert.CONTIGUOUS, x.shape, convert.bf16_to_f32(bf).astype("<f4").tobytes())
    add("t/FP32/random", "FP32", convert.CONTIGUOUS, x.shape, x.astype("<f4").tobytes())
    add("ref/FP32/random", "FP32", convert.CONTIGUOUS, x.shape, x.astype("<f4").tobytes())
    ids = np.array([[0, -1, 2147483647], [-2147483648, 5, 6]], dtype="<i4")
    add("t/I32/random", "I32", convert.CONTIGUOUS, ids.shape, ids.tobytes())
    add("ref/I32/random", "FP32", convert.CONTIGUOUS, ids.shape, ids.astype("<f4").tobytes())

    off = 0
    for name, fmt, layout, shape, data in blobs:
        off = convert.align_up(off, 256)
        assert len(data) == convert.encoded_size(fmt, layout, shape), name
        objects.append({"name": name, "kind": "tensor", "shape": shape, "format": fmt, "layout": layout,
                        "offset": off, "bytes": len(data)})
        off += len(data)
    js = json.dumps({"identity": {"model_id": "format-vectors", "weights_id": "test"}, "objects": objects},
                    separators=(",", ":"), ensure_ascii=False).encode()
    head = b"NINFER\x00\x02" + struct.pack("<Q", len(js)) + js
    payload_offset = convert.align_up(len(head), 4096)
    with open(path, "wb") as f:
        f.write(head + bytes(payload_offset - len(head)))
        for (name, fmt, layout, shape, data), o in zip(blobs, objects):
            f.seek(payload_offset + o["offset"])
            f.write(data)


if __name__ == "__main__":
    main()
