# the hugging face preprocessing goldens for vision.h (see test/gen_media_corpus.py, which runs
# this after the decode corpus). needs transformers 5.17, torch and torchvision, pillow 13.
#
# for each case, each backend (tv = Qwen2VLImageProcessor, transformers' default, torchvision;
# pil = Qwen2VLImageProcessorPil) gives grid_thw and pixel_values. pixel_values is (x - m) / s of
# a resized uint8 image, so the uint8 image is recovered exactly (the recovery is checked here
# by normalising it again and comparing every float) and stored, patch rows undone, as a P6
# ppm; a large one is stored as its crc-32 instead. the video processor (torchvision only) the
# same, frames stacked vertically. one small image per backend also keeps its whole float32
# pixel_values (the exact values and the patch-row order). an input the processor refuses
# records its error message.

import json
import os
import zlib

import numpy as np
import torch
from PIL import Image

from gen_media_corpus import GOLD, MEDIA, content
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.image_utils import load_image

# the artifact's configs (convert.py PREPROCESSOR / VIDEO_PREPROCESSOR, model.md 6.1-6.2)
IMG = dict(size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16, merge_size=2, temporal_patch_size=2,
           image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=3, rescale_factor=0.00392156862745098)
VID = dict(size={"shortest_edge": 4096, "longest_edge": 25165824}, patch_size=16, merge_size=2, temporal_patch_size=2,
           image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=3, rescale_factor=0.00392156862745098, fps=2,
           min_frames=4, max_frames=768)
BIG = 60000  # resized images over this many pixels are stored as a crc-32 (keeps the corpus small)


def unpatch(pv, t, gh, gw, P=16, M=2, T=2):
    # (t*gh*gw, 3*T*P*P) -> (t*T, H, W, 3) float
    a = pv.reshape(t, gh // M, gw // M, M, M, 3, T, P, P)
    a = a.transpose(0, 6, 1, 3, 7, 2, 4, 8, 5)  # t, tp, bh, ih, ph, bw, iw, pw, c
    return a.reshape(t * T, gh * P, gw * P, 3)


def recover(pv, grid, backend):
    t, gh, gw = grid
    f = unpatch(np.asarray(pv, np.float32), t, gh, gw)
    u = np.rint(f * np.float32(127.5) + np.float32(127.5)).clip(0, 255).astype(np.uint8)
    # renormalise as the backend does and demand equality: then u is the exact resized image
    if backend == "pil":
        x = (u.astype(np.float64) * 0.00392156862745098).astype(np.float32)
        again = (x - np.float32(0.5)) / np.float32(0.5)
    else:
        m = np.float32(np.float32(0.5) * np.float32(1 / 0.00392156862745098))
        again = (u.astype(np.float32) - m) / m
    assert np.array_equal(again, f), "pixel_values are not a normalised uint8 image"
    return u


def store(name, u, image=True):
    if image:  # an image's two temporal frames are one picture: keep one
        assert np.array_equal(u[0], u[1])
        u = u[:1]
    if u.shape[1] * u.shape[2] > BIG:
        return {"crc32": zlib.crc32(np.ascontiguousarray(u).tobytes()) & 0xFFFFFFFF}
    # a png (PIL's writer, lossless; vision.h's png decoder is checked against PIL on its own)
    name = name.replace(".ppm", ".png")
    Image.fromarray(u.reshape(-1, u.shape[2], 3)).save(os.path.join(GOLD, name), optimize=True)
    return {"png": name}


def run_image(proc, path, overrides):
    im = load_image(path)  # exif_transpose, as for a path in a chat message
    kw = dict(IMG)
    kw.update(overrides)
    try:
        out = proc(**kw)(images=[im], return_tensors="np")
    except ValueError as e:
        return None, str(e)
    return out, None


def main():
    cases = []
    # images: corpus files and made ones at odd sizes
    made = {
        "pp_1x1.png": (1, 1), "pp_1x100.png": (1, 100), "pp_100x1.png": (100, 1), "pp_3x5.png": (3, 5),
        "pp_31x33.png": (31, 33), "pp_1x200.png": (1, 200), "pp_1x201.png": (1, 201), "pp_250x1.png": (250, 1),
        "pp_2x500.png": (2, 500), "pp_640x480.png": (480, 640), "pp_300x1000.png": (1000, 300),
    }
    for i, (name, (h, w)) in enumerate(made.items()):
        Image.fromarray(content(h, w, 500 + i, noise=h * w < 10000)).save(os.path.join(MEDIA, name), optimize=True)
    # very large: over max_pixels at the artifact's defaults (a smooth jpeg keeps the file small)
    y, x = np.mgrid[0:3600, 0:4800]
    big = np.stack([(x // 19) % 256, (y // 14) % 256, ((x + y) // 33) % 256], -1).astype(np.uint8)
    Image.fromarray(big).save(os.path.join(MEDIA, "pp_4800x3600.jpg"), quality=40)
    images = [
        ("jpg_420_53x37.jpg", {}), ("pil_rgb.png", {}), ("png_c6_d16_i.png", {}), ("jpg_exif6.jpg", {}),
        ("jpg_420_1x1.jpg", {}), ("png_c3_d4.png", {}),
    ] + [(n, {}) for n in made] + [
        ("pp_4800x3600.jpg", {}),
        # the max_pixels branch at a cheap size, and a small min_pixels so 1:1 sizes resample down
        ("pp_640x480.png", {"size": {"shortest_edge": 4096, "longest_edge": 100000}}),
        ("pil_rgb.png", {"size": {"shortest_edge": 1024, "longest_edge": 4096}}),
        ("jpg_444_prog_rst_53x37.jpg", {"size": {"shortest_edge": 1024, "longest_edge": 2048}}),
    ]
    diffs = []
    for k, (name, ov) in enumerate(images):
        case = {"kind": "image", "input": [name], "size": ov.get("size", IMG["size"])}
        res = {}
        u_by = {}
        for backend, proc in (("tv", Qwen2VLImageProcessor), ("pil", Qwen2VLImageProcessorPil)):
            out, err = run_image(proc, os.path.join(MEDIA, name), ov)
            if err:
                res[backend] = {"error": err}
                continue
            grid = [int(v) for v in out["image_grid_thw"][0]]
            u = recover(out["pixel_values"], grid, backend)
            u_by[backend] = u
            r = {"grid": grid}
            r.update(store(f"pp{k:02d}_{backend}.ppm", u))
            res[backend] = r
        if len(u_by) == 2 and u_by["tv"].shape == u_by["pil"].shape:
            d = int(np.abs(u_by["tv"].astype(int) - u_by["pil"].astype(int)).max())
            res["tv_vs_pil_max_u8"] = d
            diffs.append(d)
        case.update(res)
        cases.append(case)
    # the exact float32 values and the row order of one image, both backends
    for backend, proc in (("tv", Qwen2VLImageProcessor), ("pil", Qwen2VLImageProcessorPil)):
        out, _ = run_image(proc, os.path.join(MEDIA, "jpg_420_53x37.jpg"), {"size": {"shortest_edge": 1024, "longest_edge": 4096}})
        pv = np.asarray(out["pixel_values"], np.float32)
        pv.tofile(os.path.join(GOLD, f"pp_full_{backend}.f32"))
        cases.append({"kind": "full", "input": ["jpg_420_53x37.jpg"], "size": {"shortest_edge": 1024, "longest_edge": 4096},
                      "backend": backend, "grid": [int(v) for v in out["image_grid_thw"][0]], "f32": f"pp_full_{backend}.f32",
                      "shape": list(pv.shape)})
    # videos: lists of frames (no frame rate: transformers assumes 24, as ninfer does)
    vids = {
        "v30": (30, 40, 56), "v9": (9, 24, 70), "v100": (100, 16, 20), "v1": (1, 40, 40), "v3": (3, 20, 300),
        "v7": (7, 64, 64),
    }
    vp = Qwen3VLVideoProcessor(**VID)
    for name, (n, h, w) in vids.items():
        files = []
        for i in range(n):
            fn = f"{name}_{i:03d}.png"
            Image.fromarray(content(h, w, 1000 + 7 * i + h)).save(os.path.join(MEDIA, fn))
            files.append(fn)
        frames = [np.array(Image.open(os.path.join(MEDIA, f)).convert("RGB")) for f in files]
        case = {"kind": "video", "input": files, "video_fps": 24}
        try:
            out = vp(videos=[frames], return_metadata=True, cap_pixels_per_frame=False, return_tensors="np")
        except ValueError as e:
            case["tv"] = {"error": str(e)}
            cases.append(case)
            continue
        grid = [int(v) for v in out["video_grid_thw"][0]]
        md = out["video_metadata"][0]
        u = recover(out["pixel_values_videos"], grid, "tv")
        r = {"grid": grid, "indices": [int(i) for i in md.frames_indices]}
        # the processor's timestamps (Qwen3VLProcessor._calculate_timestamps)
        idx = list(md.frames_indices)
        while len(idx) % 2:
            idx.append(idx[-1])
        ts = [i / md.fps for i in idx]
        r["timestamps"] = [(ts[i] + ts[i + 1]) / 2 for i in range(0, len(ts), 2)]
        r.update(store(f"pp_{name}_tv.ppm", u, image=False))
        case["tv"] = r
        cases.append(case)
    # the processor's prompt expansion (the qwen3 fixture tokenizer has the same vision tokens)
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    fixture = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "fixtures",
                           "qwen3-tokenizer", "tokenizer.json")
    tok = PreTrainedTokenizerFast(tokenizer_file=fixture)
    proc = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**IMG), tokenizer=tok, video_processor=vp)
    text = ("a<|vision_start|><|image_pad|><|vision_end|>b<|vision_start|><|video_pad|><|vision_end|>c"
            "<|vision_start|><|image_pad|><|vision_end|>")
    imgs = ["pp_31x33.png", "jpg_420_1x1.jpg"]
    vfiles = sorted(f for f in os.listdir(MEDIA) if f.startswith("v9_"))
    vframes = [np.array(Image.open(os.path.join(MEDIA, f)).convert("RGB")) for f in vfiles]
    out = proc(text=[text], images=[load_image(os.path.join(MEDIA, n)) for n in imgs], videos=[vframes],
               cap_pixels_per_frame=False)
    cases.append({"kind": "prompt", "text": text, "images": imgs, "video": vfiles, "video_fps": 24,
                  "expanded": tok.decode(out["input_ids"][0])})
    with open(os.path.join(GOLD, "preprocess.json"), "w") as f:
        json.dump({"transformers": __import__("transformers").__version__, "torch": torch.__version__,
                   "torchvision": __import__("torchvision").__version__, "pillow": Image.__version__,
                   "tv_vs_pil_max_u8": max(diffs), "cases": cases}, f, indent=1)
    print(f"preprocess: {len(cases)} cases, torchvision vs pil backends differ by at most {max(diffs)} (uint8)")


if __name__ == "__main__":
    main()
