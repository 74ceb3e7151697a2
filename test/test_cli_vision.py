"""the ninfer cli's media diagnostics (vision.h through main): --decode-out against PIL's pixels,
--pixels-out against hugging face's processor (the goldens of test/gen_media_preprocess.py),
videos from a directory, a list and (when ffmpeg is installed) a video file, and every bad
input ending in one stderr line and exit 1."""
import base64
import json
import os
import shutil
import subprocess
import zlib

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
MODEL = os.path.join(ROOT, "build/models/tiny-gqa3.ninfer")  # a synthetic model with a vision tower
TEXT_ONLY = os.path.join(ROOT, "models/kjv/kjv.ninfer")
MEDIA = os.path.join(ROOT, "test/media")
GOLD = os.path.join(MEDIA, "golden")
PRE = json.load(open(os.path.join(GOLD, "preprocess.json")))


def ninfer(*args, env=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, env=env)


def ppm(path):
    d = open(path, "rb").read()
    t = d.split(maxsplit=4)
    w, h = int(t[1]), int(t[2])
    return np.frombuffer(d[-w * h * 3:], np.uint8).reshape(h, w, 3)


def fail_line(r):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("ninfer: error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("name", ["jpg_420_prog_rst_53x37.jpg", "png_c6_d16_i.png", "jpg_exif6.jpg", "p2_max15.pgm"])
def test_decode_out_is_pils_pixels(tmp_path, name):
    out = tmp_path / "rgb"
    r = ninfer(MODEL, "--image", os.path.join(MEDIA, name), "--decode-out", str(out))
    assert r.returncode == 0, r.stderr
    want = ppm(os.path.join(GOLD, name + ".ppm"))
    assert r.stdout == f"image {want.shape[1]} {want.shape[0]}\n"
    assert open(out, "rb").read() == want.tobytes()


def unpatch(pv, t, gh, gw):
    a = pv.reshape(t, gh // 2, gw // 2, 2, 2, 3, 2, 16, 16).transpose(0, 6, 1, 3, 7, 2, 4, 8, 5)
    return a.reshape(t * 2, gh * 16, gw * 16, 3)


def golden(kind, name, size=None):
    for c in PRE["cases"]:
        if c["kind"] == kind and c["input"][0] == name and (size is None or c.get("size") == size):
            return c
    raise KeyError(name)


def test_pixels_out_matches_hf(tmp_path):
    # two images at the artifact's sizes: grid_thw and the resized image (crc) of transformers'
    # default processor, and the float layout: values (p - 127.5) / 127.5, both frames equal
    names = ["jpg_420_53x37.jpg", "pp_1x100.png"]
    out = tmp_path / "px"
    r = ninfer(MODEL, *sum((["--image", os.path.join(MEDIA, n)] for n in names), []), "--pixels-out", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    pv = np.fromfile(out, np.float32)
    at = 0
    for n, line in zip(names, lines):
        g = golden("image", n, {"shortest_edge": 65536, "longest_edge": 16777216})["tv"]
        t, gh, gw = g["grid"]
        assert line == f"image {t} {gh} {gw}"
        rows = pv[at:at + t * gh * gw * 1536]
        at += rows.size
        f = unpatch(rows, t, gh, gw)
        u = np.rint(f * 127.5 + 127.5).astype(np.uint8)
        assert np.array_equal((u.astype(np.float32) - 127.5) / 127.5, f)
        assert np.array_equal(u[0], u[1])
        want = g["crc32"] if "crc32" in g else None
        if want is not None:
            assert zlib.crc32(u[0].tobytes()) == want, n
    assert at == pv.size and len(lines) == len(names)


def test_pixels_out_keeps_command_line_order(tmp_path):
    d = tmp_path / "frames"
    d.mkdir()
    for f in sorted(f for f in os.listdir(MEDIA) if f.startswith("v9_")):
        shutil.copy(os.path.join(MEDIA, f), d / f)
    img = os.path.join(MEDIA, "pp_31x33.png")
    out = tmp_path / "px"
    r = ninfer(MODEL, "--video", str(d), "--image", img, "--pixels-out", str(out))
    assert r.returncode == 0, r.stderr
    gv, gi = golden("video", "v9_000.png")["tv"]["grid"], golden("image", "pp_31x33.png")["tv"]["grid"]
    assert r.stdout == "video %d %d %d\nimage %d %d %d\n" % (*gv, *gi)
    # an image as a base64 data uri gives the bytes of the file's
    uri = "data:image/png;base64," + base64.b64encode(open(img, "rb").read()).decode()
    r2 = ninfer(MODEL, "--image", uri, "--pixels-out", str(tmp_path / "px2"))
    assert r2.returncode == 0, r2.stderr
    assert open(tmp_path / "px2", "rb").read() == open(out, "rb").read()[-(gi[1] * gi[2] * 1536 * 4):]


def test_video_directory_list_and_errors(tmp_path):
    d = tmp_path / "frames"
    d.mkdir()
    files = sorted(f for f in os.listdir(MEDIA) if f.startswith("v30_"))
    for f in files:
        shutil.copy(os.path.join(MEDIA, f), d / f)
    g = golden("video", files[0])["tv"]
    out = tmp_path / "px"
    r = ninfer(MODEL, "--video", str(d), "--pixels-out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "video %d %d %d\n" % tuple(g["grid"])
    stamps = " ".join(f"<{x:.1f} seconds>" for x in g["timestamps"])
    assert stamps in r.stderr
    dir_px = open(out, "rb").read()
    # the same frames as a comma-separated list give the same rows
    r = ninfer(MODEL, "--video", ",".join(str(d / f) for f in files), "--pixels-out", str(out))
    assert r.returncode == 0, r.stderr
    assert open(out, "rb").read() == dir_px
    # a missing frame in a list, and one frame (too few for the processor: its own message)
    r = ninfer(MODEL, "--video", str(d / files[0]) + "," + str(d / files[0]) + "x", "--pixels-out", str(out))
    assert "cannot open" in fail_line(r)
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(d / files[0], one / files[0])
    assert "t:1 must be larger than temporal_factor:2" in fail_line(ninfer(MODEL, "--video", str(one), "--pixels-out", str(out)))


def test_video_file_through_ffmpeg(tmp_path):
    files = sorted(f for f in os.listdir(MEDIA) if f.startswith("v30_"))
    out = tmp_path / "px"
    ffmpeg = shutil.which("ffmpeg")
    vid = tmp_path / "v.mkv"
    if not ffmpeg:
        vid.write_bytes(b"\x1a\x45\xdf\xa3" + bytes(60))
        env = dict(os.environ, PATH="/nonexistent")
        assert "needs an ffmpeg on PATH" in fail_line(ninfer(MODEL, "--video", str(vid), "--pixels-out", str(out), env=env))
        pytest.skip("no ffmpeg on PATH: the video-file path is checked for its error only")
    # a lossless (png-coded) 24 fps video of the v30 frames decodes to the same rows as the frames
    subprocess.run([ffmpeg, "-nostdin", "-v", "error", "-framerate", "24", "-i", os.path.join(MEDIA, "v30_%03d.png"),
                    "-c:v", "png", str(vid)], check=True)
    r = ninfer(MODEL, "--video", str(vid), "--pixels-out", str(out))
    assert r.returncode == 0, r.stderr
    g = golden("video", files[0])["tv"]
    assert r.stdout == "video %d %d %d\n" % tuple(g["grid"])
    by_file = open(out, "rb").read()
    d = tmp_path / "frames"
    d.mkdir()
    for f in files:
        shutil.copy(os.path.join(MEDIA, f), d / f)
    r = ninfer(MODEL, "--video", str(d), "--pixels-out", str(out))
    assert r.returncode == 0 and open(out, "rb").read() == by_file
    env = dict(os.environ, PATH="/nonexistent")
    assert "needs an ffmpeg on PATH" in fail_line(ninfer(MODEL, "--video", str(vid), "--pixels-out", str(out), env=env))
    # a short video as a base64 data uri (through a temporary file; a command-line argument is
    # at most 128 KiB) gives the rows of its frames as a list
    short = tmp_path / "s.mkv"
    subprocess.run([ffmpeg, "-nostdin", "-v", "error", "-framerate", "24", "-i", os.path.join(MEDIA, "v30_%03d.png"),
                    "-frames:v", "6", "-c:v", "png", str(short)], check=True)
    uri = "data:video/x-matroska;base64," + base64.b64encode(short.read_bytes()).decode()
    assert len(uri) < 120000
    r = ninfer(MODEL, "--video", uri, "--pixels-out", str(out))
    assert r.returncode == 0, r.stderr
    by_uri = open(out, "rb").read()
    r = ninfer(MODEL, "--video", ",".join(os.path.join(MEDIA, f) for f in files[:6]), "--pixels-out", str(out))
    assert r.returncode == 0 and open(out, "rb").read() == by_uri
    assert "http(s) urls are not fetched" in fail_line(ninfer(MODEL, "--video", "https://x/v.mp4", "--pixels-out", str(out)))


def test_bad_media_is_one_line(tmp_path):
    out = str(tmp_path / "o")
    gif = tmp_path / "a.gif"
    gif.write_bytes(b"GIF89a" + bytes(40))
    assert "unsupported image format GIF" in fail_line(ninfer(MODEL, "--image", str(gif), "--pixels-out", out))
    bad = tmp_path / "cut.png"
    bad.write_bytes(open(os.path.join(MEDIA, "pil_rgb.png"), "rb").read()[:300])
    assert "cut.png: png:" in fail_line(ninfer(MODEL, "--image", str(bad), "--decode-out", out))
    line = fail_line(ninfer(MODEL, "--image", os.path.join(MEDIA, "pp_1x201.png"), "--pixels-out", out))
    assert "absolute aspect ratio must be smaller than 200, got 201.0" in line
    line = fail_line(ninfer(MODEL, "--image", os.path.join(MEDIA, "pil_rgb.png"), "--max-image-pixels", "1000", "--decode-out", out))
    assert "over the limit of 1000 pixels" in line
    two = ["--image", os.path.join(MEDIA, "p6.ppm")] * 2
    assert "exactly one --image" in fail_line(ninfer(MODEL, *two, "--decode-out", out))
    assert "needs an --image or a --video" in fail_line(ninfer(MODEL, "--pixels-out", out))
    assert "no vision tower" in fail_line(ninfer(TEXT_ONLY, "--image", os.path.join(MEDIA, "p6.ppm"), "--pixels-out", out))
    assert "no vision tower" in fail_line(ninfer(TEXT_ONLY, "--image", os.path.join(MEDIA, "p6.ppm"), "--prompt", "hi"))


def test_image_prompt_runs_and_messages_parts_agree(tmp_path):
    # --image + --prompt on the cpu path; the same conversation as --messages with an image_url data
    # uri part and with an image path part gives the same prompt and the same greedy text
    img = os.path.join(MEDIA, "jpg_444_53x37.jpg")
    common = ["--cpu", "--greedy", "--no-thinking", "--max-new", "6", "--print-token-ids"]
    a = ninfer(MODEL, *common, "--image", img, "--prompt", "What is this?")
    assert a.returncode == 0, a.stderr
    uri = "data:image/jpeg;base64," + base64.b64encode(open(img, "rb").read()).decode()
    for part in [{"type": "image_url", "image_url": {"url": uri}}, {"type": "image_url", "image_url": "file://" + img},
                 {"type": "image", "image": img}]:
        msgs = tmp_path / "m.json"
        msgs.write_text(json.dumps([{"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}]))
        b = ninfer(MODEL, *common, "--messages", str(msgs))
        assert b.returncode == 0, b.stderr
        assert b.stdout == a.stdout
        assert b.stderr.split("\n")[0] == a.stderr.split("\n")[0]  # the prompt ids
    assert a.stderr.split("\n")[0].count(" 151655") > 4  # image pads
    # a video (a directory of frames) through --messages: video_url parts work the same as --video
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(4):
        shutil.copy(os.path.join(MEDIA, "jpg_444_53x37.jpg"), frames / f"{i:03d}.jpg")
    v = ninfer(MODEL, *common, "--video", str(frames), "--prompt", "And this?")
    assert v.returncode == 0, v.stderr
    msgs.write_text(json.dumps([{"role": "user", "content": [{"type": "video_url", "video_url": {"url": str(frames)}},
                                                             {"type": "text", "text": "And this?"}]}]))
    w = ninfer(MODEL, *common, "--messages", str(msgs))
    assert w.returncode == 0, w.stderr
    assert (w.stdout, w.stderr.split("\n")[0]) == (v.stdout, v.stderr.split("\n")[0])


def test_media_prompt_errors_are_one_line(tmp_path):
    img = os.path.join(MEDIA, "p6.ppm")
    assert "not fetched" in fail_line(ninfer(MODEL, "--cpu", "--image", "https://example.com/a.png", "--prompt", "x"))
    assert "go with --prompt" in fail_line(ninfer(MODEL, "--cpu", "--image", img, "--raw-prompt", "x"))
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": "x"}]}]))
    assert "part 0: the image_url part needs" in fail_line(ninfer(MODEL, "--cpu", "--messages", str(msgs)))
    msgs.write_text(json.dumps([{"role": "user", "content": [{"type": "image", "image": str(tmp_path / "none.png")}]}]))
    assert "none.png" in fail_line(ninfer(MODEL, "--cpu", "--messages", str(msgs)))
    assert "--max-context" in fail_line(ninfer(MODEL, "--cpu", "--image", os.path.join(MEDIA, "jpg_444_53x37.jpg"),
                                               "--prompt", "x", "--max-context", "32"))
