"""ninfer-serve --vision against the REAL engine (the synthetic tiny model, which carries a vision
tower; the cpu path in ci, the gpu where there is one): openai image_url parts and anthropic base64 image blocks through the
sdks, a video_url data uri (through ffmpeg, when installed), usage and count_tokens counting the
vision tokens, http(s) urls and local paths refused, the request's media budget, and the
vision_disabled error without --vision. the cli (build/test/ninfer, test_tower's
CliImagePromptMatchesTheEngine checks it against the in-process engine) is the oracle for the
prompt and the greedy output."""
import base64
import os
import shutil
import subprocess

import anthropic
import openai
import pytest

from test_serve import ROOT, Server

BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
SERVE = os.path.join(os.path.dirname(BIN), "ninfer-serve")
MODEL = os.path.join(ROOT, "build/models/tiny.ninfer")
MEDIA = os.path.join(ROOT, "test/media")
IMAGE = os.path.join(MEDIA, "png_c2_d8.png")
JPEG = os.path.join(MEDIA, "jpg_444_53x37.jpg")
QUESTION = "What is in the picture?"
OFF = {"chat_template_kwargs": {"enable_thinking": False}}

if not (os.path.exists(SERVE) and os.path.exists(MODEL)):
    pytest.skip("build/test/ninfer-serve or build/models/tiny.ninfer missing (make build/test/ninfer-serve models)",
                allow_module_level=True)


def data_uri(path, mime):
    return f"data:{mime};base64," + base64.b64encode(open(path, "rb").read()).decode()


def cli(*args):
    """(stdout, the prompt ids) of the cli, greedy, thinking off, on the path the server takes (the
    gpu when there is one, else the cpu reference)"""
    r = subprocess.run([BIN, MODEL, "--greedy", "--no-thinking", "--print-token-ids", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.split("\n") if x.startswith("prompt ids:"))
    return r.stdout, line.split()[2:]


@pytest.fixture(scope="module")
def vis():
    s = Server("--vision", "--max-context", "4096", "--default-max-tokens", "8", cmd=[SERVE, MODEL])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def oai(vis):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{vis.port}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ant(vis):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{vis.port}", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def mid(oai):
    return oai.models.list().data[0].id


def image_msgs(url, text=QUESTION):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]


def test_openai_image_is_the_clis(oai, mid):
    want, prompt = cli("--max-new", "8", "--image", IMAGE, "--prompt", QUESTION)
    r = oai.chat.completions.create(model=mid, messages=image_msgs(data_uri(IMAGE, "image/png")), temperature=0,
                                    max_completion_tokens=8, extra_body=OFF)
    # the prompt: the template plus the image's expanded pads, as the cli (and the engine) count it
    assert r.usage.prompt_tokens == len(prompt)
    text_only, _ = cli("--max-new", "1", "--prompt", QUESTION)
    plain = oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": QUESTION}], max_completion_tokens=1,
                                        extra_body=OFF)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 8  # the vision tokens are counted
    # greedy output: the cli's (stdout ends with one newline the cli adds)
    assert (r.choices[0].message.content or "") == want[:-1]
    # the image matters: another one gives another prompt (grid) and is accepted as a string url too
    o = oai.chat.completions.create(model=mid, temperature=0, max_completion_tokens=8, extra_body=OFF,
                                    messages=[{"role": "user", "content": [
                                        {"type": "image_url", "image_url": data_uri(JPEG, "image/jpeg")},
                                        {"type": "text", "text": QUESTION}]}])
    assert o.usage.prompt_tokens == len(cli("--max-new", "1", "--image", JPEG, "--prompt", QUESTION)[1])


def test_openai_stream_with_an_image(oai, mid):
    want, _ = cli("--max-new", "6", "--image", IMAGE, "--prompt", QUESTION)
    st = oai.chat.completions.create(model=mid, messages=image_msgs(data_uri(IMAGE, "image/png")), temperature=0,
                                     max_completion_tokens=6, extra_body=OFF, stream=True)
    got = "".join((c.choices[0].delta.content or "") for c in st if c.choices)
    assert got == want[:-1]


def test_anthropic_image_block_and_count_tokens(ant, mid):
    _, prompt = cli("--max-new", "1", "--image", IMAGE, "--prompt", QUESTION)
    msgs = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(open(IMAGE, "rb").read()).decode()}},
        {"type": "text", "text": QUESTION}]}]
    n = ant.messages.count_tokens(model=mid, messages=msgs, thinking={"type": "disabled"}).input_tokens
    r = ant.messages.create(model=mid, max_tokens=4, messages=msgs, thinking={"type": "disabled"})
    assert r.usage.input_tokens == n == len(prompt)


@pytest.mark.skipif(not shutil.which("ffmpeg"), reason="no ffmpeg on PATH")
def test_openai_video_url_data_uri(oai, mid, tmp_path):
    # a 6-frame video made from corpus-sized frames; the cli reads the same file
    video = tmp_path / "v.mp4"
    r = subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=4:duration=1.5",
                        "-pix_fmt", "yuv420p", str(video)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want, prompt = cli("--max-new", "4", "--video", str(video), "--prompt", QUESTION)
    msgs = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_uri(video, "video/mp4")}},
                                         {"type": "text", "text": QUESTION}]}]
    r = oai.chat.completions.create(model=mid, messages=msgs, temperature=0, max_completion_tokens=4, extra_body=OFF)
    assert r.usage.prompt_tokens == len(prompt)
    assert (r.choices[0].message.content or "") == want[:-1]


def err_of(exc):
    body = exc.value.body
    return body.get("error", body) if isinstance(body, dict) else body


def test_urls_paths_and_budgets_are_refused(oai, mid):
    for url, words in [("https://example.com/cat.png", "not fetched"), ("http://x/y.jpg", "not fetched"),
                       (IMAGE, "no local files"), ("file://" + IMAGE, "no local files")]:
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=mid, messages=image_msgs(url), max_completion_tokens=1)
        assert words in err_of(e)["message"], err_of(e)
    with pytest.raises(openai.BadRequestError) as e:  # a corrupt image: one line naming what failed
        oai.chat.completions.create(model=mid, messages=image_msgs("data:image/png;base64,iVBORw0KGgo="), max_completion_tokens=1)
    assert "png" in err_of(e)["message"].lower(), err_of(e)
    uri = data_uri(IMAGE, "image/png")
    many = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}] * 17 + [{"type": "text", "text": "x"}]}]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=mid, messages=many, max_completion_tokens=1)
    assert err_of(e)["code"] == "media_budget_exceeded", err_of(e)
    # the server still answers
    r = oai.chat.completions.create(model=mid, messages=image_msgs(uri), max_completion_tokens=1)
    assert r.usage.completion_tokens == 1


def test_without_vision_media_is_vision_disabled():
    s = Server("--max-context", "1024", cmd=[SERVE, MODEL])
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="none", max_retries=0, timeout=60)
        mid = c.models.list().data[0].id
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=mid, messages=image_msgs(data_uri(IMAGE, "image/png")), max_completion_tokens=1)
        assert err_of(e)["code"] == "vision_disabled"
    finally:
        assert s.stop() == 0
