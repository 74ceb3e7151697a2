# makes the media corpus for vision.h (test/media/) and its goldens (test/media/golden/):
#
#   decode   every png color type and bit depth (1..16), palette with tRNS, adam7 interlace,
#            every row filter; baseline and progressive jpeg at 4:4:4 / 4:2:2 / 4:2:0 and
#            grayscale, with and without restart markers, odd sizes; each exif orientation
#            (jpeg app1 and png eXIf); ppm/pgm. golden = what PIL decodes, after
#            ImageOps.exif_transpose and convert("RGB") (hugging face's load_image), as a P6 ppm.
#   preprocess  hugging face's Qwen2VLImageProcessor (torchvision backend, the default) and
#            Qwen2VLImageProcessorPil (the PIL backend) on corpus images and odd sizes, and
#            Qwen3VLVideoProcessor on frame lists: grid_thw and the resized uint8 image
#            recovered exactly from pixel_values (checked here), plus one full float32
#            pixel_values file per backend for the exact values and the patch-row order.
#
# usage: python3 test/gen_media_corpus.py [--decode-only]
# needs pillow and numpy; the preprocess goldens also need transformers (5.17), torch and
# torchvision (not pinned in test/requirements.txt: they are big; the goldens are committed).
# deterministic: the same versions write the same bytes.

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image, ImageOps

HERE = os.path.dirname(os.path.abspath(__file__))
MEDIA = os.path.join(HERE, "media")
GOLD = os.path.join(MEDIA, "golden")


def rng(seed):
    return np.random.default_rng(seed)


def content(h, w, seed, c=3, noise=True):
    # smooth gradients + a checkerboard + noise: every frequency, so idct and resampling errors show
    y, x = np.mgrid[0:h, 0:w]
    r = rng(seed)
    chans = []
    for k in range(c):
        g = (x * (97 + 31 * k) / max(w, 1) + y * (59 + 17 * k) / max(h, 1)) % 256
        chk = ((x // (3 + k) + y // (2 + k)) % 2) * 60
        n = r.integers(0, 40, size=(h, w)) if noise else 0
        chans.append((g + chk + n) % 256)
    return np.stack(chans, -1).astype(np.uint8)


# ---- png writer: every color type / depth, chosen filters, adam7 (PIL writes only a few) ----

def png_chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)


def pack_rows(samples, depth):
    # samples: (h, w, ch) ints -> list of row byte strings
    h, w, ch = samples.shape
    rows = []
    for y in range(h):
        s = samples[y].reshape(-1)
        if depth == 16:
            rows.append(s.astype(">u2").tobytes())
        elif depth == 8:
            rows.append(s.astype(np.uint8).tobytes())
        else:
            per = 8 // depth
            out = bytearray((len(s) * depth + 7) // 8)
            for i, v in enumerate(s):
                out[i // per] |= int(v) << (8 - depth * (i % per + 1))
            rows.append(bytes(out))
    return rows


def filter_rows(rows, bpp, seed):
    r = rng(seed)
    prev = bytes(len(rows[0])) if rows else b""
    out = bytearray()
    for row in rows:
        f = int(r.integers(0, 5))
        a = np.frombuffer(row, np.uint8).astype(np.int32)
        b = np.frombuffer(prev, np.uint8).astype(np.int32)
        res = np.zeros_like(a)
        for i in range(len(a)):
            left = a[i - bpp] if i >= bpp else 0
            up = b[i]
            ul = b[i - bpp] if i >= bpp else 0
            if f == 0:
                p = 0
            elif f == 1:
                p = left
            elif f == 2:
                p = up
            elif f == 3:
                p = (left + up) >> 1
            else:
                pp = left + up - ul
                pa, pb, pc = abs(pp - left), abs(pp - up), abs(pp - ul)
                p = left if pa <= pb and pa <= pc else up if pb <= pc else ul
            res[i] = (a[i] - p) & 255
        out.append(f)
        out += res.astype(np.uint8).tobytes()
        prev = row
    return bytes(out)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def write_png(path, samples, depth, ctype, interlace=False, plte=None, trns=None, exif=None, level=9, seed=0,
              strategy=zlib.Z_DEFAULT_STRATEGY):
    h, w, ch = samples.shape
    bpp = max(1, ch * depth // 8)
    raw = b""
    if interlace:
        for p, (x0, y0, dx, dy) in enumerate(ADAM7):
            sub = samples[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += filter_rows(pack_rows(sub, depth), bpp, seed + p)
    else:
        raw = filter_rows(pack_rows(samples, depth), bpp, seed)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, int(interlace)))
    if exif is not None:
        data += png_chunk(b"eXIf", exif)
    if plte is not None:
        data += png_chunk(b"PLTE", plte)
    if trns is not None:
        data += png_chunk(b"tRNS", trns)
    co = zlib.compressobj(level, zlib.DEFLATED, 15, 9, strategy)
    z = co.compress(raw) + co.flush()
    for i in range(0, len(z), 997):  # several IDAT chunks
        data += png_chunk(b"IDAT", z[i:i + 997])
    data += png_chunk(b"IEND", b"")
    open(path, "wb").write(data)


def exif_bytes(orientation):
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def pil_golden(path):
    im = Image.open(path)
    im = ImageOps.exif_transpose(im)
    if im.mode == "I;16":
        # our one decision against PIL: a 16-bit gray sample is its high byte (PIL clamps to 255)
        a = (np.array(im).astype(np.uint32) >> 8).astype(np.uint8)
        return np.stack([a] * 3, -1)
    return np.array(im.convert("RGB"))


def write_ppm(path, a):
    h, w, _ = a.shape
    open(path, "wb").write(b"P6\n%d %d\n255\n" % (w, h) + a.astype(np.uint8).tobytes())


def gen_decode():
    os.makedirs(GOLD, exist_ok=True)
    cases = []
    # png: (ctype, depth) over every valid combination, plain and interlaced, at odd sizes
    combos = [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 2), (3, 4), (3, 8),
              (4, 8), (4, 16), (6, 8), (6, 16)]
    seed = 1
    for ctype, depth in combos:
        for inter in (False, True):
            h, w = (13, 21) if not inter else (19, 11)
            ch = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
            r = rng(seed)
            top = (1 << depth) - 1
            if ctype == 3:
                npal = min(1 << depth, 200 if depth == 8 else 1 << depth)
                samples = r.integers(0, npal, size=(h, w, 1))
                plte = r.integers(0, 256, size=npal * 3).astype(np.uint8).tobytes()
                trns = r.integers(0, 256, size=max(1, npal // 2)).astype(np.uint8).tobytes()
            else:
                samples = r.integers(0, top + 1, size=(h, w, ch))
                plte = trns = None
                if ctype == 0 and depth == 8:
                    trns = struct.pack(">H", 7)
                if ctype == 2 and depth == 16:
                    trns = struct.pack(">HHH", 1, 2, 3)
            name = f"png_c{ctype}_d{depth}{'_i' if inter else ''}.png"
            write_png(os.path.join(MEDIA, name), samples, depth, ctype, inter, plte, trns, seed=seed)
            cases.append(name)
            seed += 1
    # bigger pngs through PIL's own writer (its zlib settings, its filter choice)
    for name, mode in (("pil_rgb.png", "RGB"), ("pil_rgba.png", "RGBA"), ("pil_l.png", "L")):
        a = content(67, 45, seed)
        im = Image.fromarray(a).convert(mode)
        im.save(os.path.join(MEDIA, name), optimize=True)
        cases.append(name)
        seed += 1
    # stored (uncompressed) deflate blocks
    write_png(os.path.join(MEDIA, "png_stored.png"), rng(99).integers(0, 256, size=(9, 17, 3)), 8, 2, level=0, seed=99)
    cases.append("png_stored.png")
    # fixed-huffman and huffman-only / rle deflate streams (zlib's strategies)
    for strat, sname in ((zlib.Z_FIXED, "fixed"), (zlib.Z_HUFFMAN_ONLY, "huffonly"), (zlib.Z_RLE, "rle")):
        name = f"png_{sname}.png"
        write_png(os.path.join(MEDIA, name), content(23, 31, 120 + strat), 8, 2, seed=strat, strategy=strat)
        cases.append(name)
    # png exif orientation
    for o in (3, 6):
        name = f"png_exif{o}.png"
        ex = exif_bytes(o) if o == 3 else exif_bytes(o)[6:]  # with PIL's "Exif\0\0" prefix, and the bare tiff
        write_png(os.path.join(MEDIA, name), content(10, 16, 50 + o), 8, 2, exif=ex, seed=o)
        cases.append(name)
    # jpeg
    for sub, sname in ((0, "444"), (1, "422"), (2, "420")):
        for prog in (False, True):
            for rst in (False, True):
                for (h, w) in ((37, 53), (16, 16)):
                    a = content(h, w, seed)
                    kw = dict(quality=90, subsampling=sub, progressive=prog)
                    if rst:
                        kw["restart_marker_blocks"] = 3
                    name = f"jpg_{sname}{'_prog' if prog else ''}{'_rst' if rst else ''}_{w}x{h}.jpg"
                    Image.fromarray(a).save(os.path.join(MEDIA, name), **kw)
                    cases.append(name)
                    seed += 1
    for prog in (False, True):
        name = f"jpg_gray{'_prog' if prog else ''}.jpg"
        Image.fromarray(content(29, 41, seed)[:, :, 0]).save(os.path.join(MEDIA, name), quality=85, progressive=prog)
        cases.append(name)
        seed += 1
    # tiny and thin jpegs: chroma 1-2 samples wide takes libjpeg's replication path
    for (h, w) in ((1, 1), (2, 2), (3, 2), (1, 17), (17, 3), (5, 4)):
        name = f"jpg_420_{w}x{h}.jpg"
        Image.fromarray(content(h, w, seed)).save(os.path.join(MEDIA, name), quality=95, subsampling=2)
        cases.append(name)
        seed += 1
    # low quality (large coefficients, clamping) and a restart interval in mcu rows
    Image.fromarray(content(48, 64, seed)).save(os.path.join(MEDIA, "jpg_q10.jpg"), quality=10)
    cases.append("jpg_q10.jpg")
    Image.fromarray(content(48, 64, seed + 1)).save(os.path.join(MEDIA, "jpg_rst_rows_prog.jpg"), quality=75,
                                                    progressive=True, restart_marker_rows=1, subsampling=2)
    cases.append("jpg_rst_rows_prog.jpg")
    seed += 2
    # every exif orientation
    for o in range(1, 9):
        name = f"jpg_exif{o}.jpg"
        Image.fromarray(content(12, 20, 70 + o)).save(os.path.join(MEDIA, name), quality=90, exif=exif_bytes(o))
        cases.append(name)
    # samplings PIL cannot write (4:4:0, 4:1:1, mixed), through libjpeg-turbo's cjpeg when it is
    # installed (libjpeg-turbo-progs); without it the committed files are kept
    cj = shutil.which("cjpeg")
    for samp, sname, extra in (("1x2", "440", []), ("4x1", "411", []), ("2x2,1x1,2x2", "mixed", []),
                               ("2x1", "422_prog_rst", ["-progressive", "-restart", "1"])):
        name = f"jpg_cjpeg_{sname}.jpg"
        path = os.path.join(MEDIA, name)
        if cj:
            src = os.path.join(MEDIA, "_src.ppm")
            write_ppm(src, content(35, 47, seed))
            subprocess.run([cj, "-quality", "88", "-sample", samp, *extra, "-outfile", path, src], check=True)
            os.remove(src)
        seed += 1
        if os.path.exists(path):
            cases.append(name)
    # refused with a named reason (test_vision.cc): arithmetic coding, cmyk, 12-bit is not made
    if cj:
        src = os.path.join(MEDIA, "_src.ppm")
        write_ppm(src, content(16, 16, seed))
        subprocess.run([cj, "-arithmetic", "-outfile", os.path.join(MEDIA, "bad_arith.jpg"), src], check=True)
        os.remove(src)
    Image.fromarray(content(16, 16, seed)).convert("CMYK").save(os.path.join(MEDIA, "bad_cmyk.jpg"))
    Image.fromarray(content(16, 16, seed)).save(os.path.join(MEDIA, "bad.gif"))
    # a palette shorter than the indices: PIL shows black for the missing entries
    write_png(os.path.join(MEDIA, "png_pal_short.png"), rng(7).integers(0, 8, size=(5, 9, 1)), 8, 3,
              plte=bytes(range(30, 39)), seed=7)
    cases.append("png_pal_short.png")
    # ppm / pgm
    a = content(7, 9, seed)
    open(os.path.join(MEDIA, "p6.ppm"), "wb").write(b"P6\n# a comment\n9 7\n255\n" + a.tobytes())
    open(os.path.join(MEDIA, "p5.pgm"), "wb").write(b"P5 9 7 255\n" + a[:, :, 0].tobytes())
    txt = " ".join(str(int(v)) for v in (a[:, :, 1].reshape(-1) % 16))
    open(os.path.join(MEDIA, "p2_max15.pgm"), "wb").write(b"P2\n9 7\n15\n" + txt.encode() + b"\n")
    cases += ["p6.ppm", "p5.pgm", "p2_max15.pgm"]
    for name in cases:
        write_ppm(os.path.join(GOLD, name + ".ppm"), pil_golden(os.path.join(MEDIA, name)))
    with open(os.path.join(GOLD, "decode_cases.txt"), "w") as f:
        f.write("\n".join(cases) + "\n")
    print(f"decode: {len(cases)} cases")


if __name__ == "__main__":
    gen_decode()
    if "--decode-only" not in sys.argv:
        import gen_media_preprocess  # noqa: the hf part, in its own file (needs transformers + torch)
        gen_media_preprocess.main()
