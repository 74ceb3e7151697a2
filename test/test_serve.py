# ninfer-serve end to end over loopback: the official openai and anthropic sdks, and a
# malformed-input battery over raw sockets. every socket and client has a timeout; the
# servers listen on 127.0.0.1 with an ephemeral port (--port 0, read from the listening line).
#
# the server under test is build/test/serve_fake (serve.h + a deterministic fake engine,
# see test/serve_fake.cc) unless NINFER_SERVE_CMD names another command, e.g.
#     NINFER_SERVE_CMD="build/test/ninfer-serve build/models/tiny.ninfer" pytest test/test_serve.py
# tests that rely on the fake's scripted output are skipped then; the rest check the
# contract (shapes, usage consistency, errors, robustness) against whatever model runs.
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time

import anthropic
import openai
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_BIN = os.environ.get("SERVE_FAKE_BIN") or os.path.join(ROOT, "build", "test", "serve_fake")  # e.g. an asan build
SERVE_CMD = os.environ.get("NINFER_SERVE_CMD")
FAKE = SERVE_CMD is None
fake_only = pytest.mark.skipif(not FAKE, reason="relies on the fake engine's scripted output")

API_KEY = "sk-test-123"


def mt(n):
    """an output limit: as asked with the fake, small with a real model (its output is noise anyway)"""
    return n if FAKE else min(n, 8)
FAKE_REASONING = "Let me think."
FAKE_CONTENT = "Hello, wörld! 你好 🙂 done."


def server_cmd():
    if SERVE_CMD:
        cmd = shlex.split(SERVE_CMD)
        # absolute paths: some tests run the server from another directory
        return [os.path.join(ROOT, a) if not os.path.isabs(a) and os.path.exists(os.path.join(ROOT, a)) else a
                for a in cmd]
    if not os.path.exists(FAKE_BIN):
        pytest.skip("build/test/serve_fake is not built (make build/test/serve_fake)")
    return [FAKE_BIN, "fake"]


class Server:
    """one ninfer-serve process; stderr is collected in .log (a list of lines)"""

    def __init__(self, *args, env=None, cmd=None, wait=True, cwd=ROOT):
        self.log = []
        self.cmd = (cmd or server_cmd()) + ["--port", "0", "--log-stats-interval-ms", "0"] + list(args)
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, cwd=cwd)
        self.port = None
        self.listening = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if wait:
            if not self.listening.wait(60):
                self.stop()
                raise RuntimeError("server did not start: " + "".join(self.log))

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.log.append(line)
            m = re.search(r"listening on http://[^ ]*:(\d+) ", line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self.listening.set()

    def text(self):
        return "".join(self.log)

    def wait_log(self, pattern, timeout=5.0, since=0):
        """the first stderr line from index `since` on matching pattern (waits for it)"""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.log)[since:]:
                if re.search(pattern, line):
                    return line
            time.sleep(0.02)
        raise AssertionError(f"no log line matching {pattern!r} in:\n{self.text()}")

    def request_lines(self, since=0, n=None, timeout=10.0, pattern=" POST /v1/"):
        """the request log lines (pattern) from index `since` on. a line is written just after its
        response, so this waits: for n lines, or (n None) until none has come for 0.3 s"""
        get = lambda: [l for l in list(self.log)[since:] if pattern in l]
        deadline, last, t_last = time.time() + timeout, -1, time.time()
        while time.time() < deadline:
            k = len(get())
            if n is not None and k >= n:
                break
            if k != last:
                last, t_last = k, time.time()
            elif n is None and time.time() - t_last > 0.3:
                break
            time.sleep(0.05)
        return get()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.reader.join(5)
        # a sanitizer build (SERVE_FAKE_BIN) reports on stderr: any report fails the test
        assert not re.search(r"Sanitizer|runtime error:", self.text()), self.text()
        return self.proc.returncode


@pytest.fixture(scope="module")
def srv():
    s = Server("--api-key", API_KEY, "--max-context", "4096", "--default-max-tokens", "64" if FAKE else "8")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def lim():
    # small limits and short timeouts for the raw-socket battery; no api key; cors on
    s = Server("--max-request-mib", "1", "--read-timeout-ms", "1000", "--idle-timeout-ms", "1500",
               "--write-timeout-ms", "1000", "--max-pending-requests", "1", "--pending-timeout-ms", "600",
               "--max-context", "400000" if FAKE else "4096", "--default-max-tokens", "64", "--cors")
    yield s
    assert s.stop() == 0


def model_id(port, key=None):
    st, _, body = request(port, "GET", "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
    assert st == 200
    return json.loads(body)["data"][0]["id"]


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def ant(srv):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def mid(srv):
    return model_id(srv.port, API_KEY)


def fake_prompt_tokens(messages, thinking=True):
    """the fake engine's token count: utf-8 bytes of its chatml rendering (serve_fake.cc)"""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    s += "<|im_start|>assistant\n<think>\n" if thinking else "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    return len(s.encode())


# ---------------------------------------------------------------------------------------
# raw http helpers

class Conn:
    """a raw loopback connection with a response reader that handles pipelining"""

    def __init__(self, port, timeout=5.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def _fill(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def read_until(self, sep):
        while sep not in self.buf:
            self._fill()
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_n(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head_only=False):
        """(status, headers, body); the body is de-chunked"""
        head = self.read_until(b"\r\n\r\n").decode("latin-1")
        lines = head.split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for l in lines[1:]:
            if l:
                k, v = l.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if head_only or status in (100, 204):
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self.read_until(b"\r\n")[:-2].split(b";")[0], 16)
                if size == 0:
                    self.read_until(b"\r\n")
                    return status, headers, body
                body += self.read_n(size)
                assert self.read_n(2) == b"\r\n"
        if "content-length" in headers:
            return status, headers, self.read_n(int(headers["content-length"]))
        body = self.buf
        self.buf = b""
        while True:
            d = self.s.recv(65536)
            if not d:
                return status, headers, body
            body += d

    def closed(self, timeout=3.0):
        """true if the server closes the connection within timeout (nothing more to read)"""
        self.s.settimeout(timeout)
        try:
            while True:
                d = self.s.recv(65536)
                if not d:
                    return True
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True

    def close(self):
        self.s.close()


STREAM_END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked response (data never holds a bare crlf)


def http(method, path, body=b"", headers=None, version="1.1"):
    h = {"Host": "127.0.0.1"}
    if body or method == "POST":
        h["Content-Length"] = str(len(body))
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    head = f"{method} {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode() + body


def request(port, method, path, body=b"", headers=None):
    c = Conn(port)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        c.send(http(method, path, body, headers))
        return c.response(head_only=method == "HEAD")
    finally:
        c.close()


def chat_body(mid, text="hi", **kw):
    b = {"model": mid, "messages": [{"role": "user", "content": text}]}
    b.update(kw)
    return json.dumps(b).encode()


def assert_healthy(port, mid):
    """after any abuse: /health answers and a normal request completes"""
    st, _, body = request(port, "GET", "/health")
    assert st == 200 and json.loads(body) == {"status": "ok"}
    st, _, body = request(port, "POST", "/v1/chat/completions", chat_body(mid, max_tokens=8))
    assert st == 200, body
    assert json.loads(body)["object"] == "chat.completion"


def sse_events(body):
    """parse an sse body into [(event or None, data str)]"""
    out = []
    for block in body.decode("utf-8").split("\n\n"):
        if not block.strip():
            continue
        ev, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((ev, "\n".join(data)))
    return out


# ---------------------------------------------------------------------------------------
# endpoints and the openai sdk

def test_health_needs_no_key(srv):
    assert "listening on http://127.0.0.1:" in srv.text()  # loopback unless --host says otherwise
    st, h, body = request(srv.port, "GET", "/health")
    assert st == 200 and json.loads(body) == {"status": "ok"}
    assert h["content-type"] == "application/json"
    st, _, body = request(srv.port, "HEAD", "/health")
    assert st == 200 and body == b""


def test_auth(srv):
    st, _, body = request(srv.port, "GET", "/v1/models")
    assert st == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    st, _, _ = request(srv.port, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert st == 401
    st, _, _ = request(srv.port, "GET", "/v1/models", headers={"x-api-key": API_KEY})
    assert st == 200
    st, _, body = request(srv.port, "POST", "/v1/messages", b"{}", headers={"x-api-key": "nope"})
    assert st == 401 and json.loads(body)["type"] == "error"
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="wrong", max_retries=0, timeout=10)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    bad_a = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key="wrong", max_retries=0, timeout=10)
    with pytest.raises(anthropic.AuthenticationError):
        bad_a.messages.create(model="x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert API_KEY not in srv.text()


def test_models(oai, mid):
    models = oai.models.list()
    assert [m.id for m in models.data] == [mid]
    assert models.data[0].owned_by == "ninfer"
    assert oai.models.retrieve(mid).id == mid
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")
    if FAKE:
        assert mid == "fake-model"  # the artifact's id is the default --model-id


def test_anthropic_models_list(ant, mid):
    page = ant.models.list()
    assert [m.id for m in page.data] == [mid]


def test_openai_chat(oai, mid):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    r = oai.chat.completions.create(model=mid, messages=msgs)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == mid
    ch = r.choices[0]
    assert ch.message.role == "assistant" and ch.finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if FAKE:
        assert ch.message.content == FAKE_CONTENT
        assert ch.message.reasoning_content == FAKE_REASONING
        assert r.usage.prompt_tokens == fake_prompt_tokens(msgs)
        assert r.usage.completion_tokens == 4 + 1 + 15 + 1
        assert ch.finish_reason == "stop"


@pytest.mark.parametrize("how", ["enable_thinking", "chat_template_kwargs", "reasoning_effort"])
def test_openai_thinking_off(oai, mid, how):
    extra = {"enable_thinking": {"enable_thinking": False},
             "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False}},
             "reasoning_effort": {"reasoning_effort": "none"}}[how]
    msgs = [{"role": "user", "content": "hi"}]
    r = oai.chat.completions.create(model=mid, messages=msgs, extra_body=extra, max_completion_tokens=mt(32))
    on = oai.chat.completions.create(model=mid, messages=msgs, max_completion_tokens=mt(32))
    assert r.usage.prompt_tokens != on.usage.prompt_tokens  # the non-thinking prompt differs
    if FAKE:
        assert getattr(r.choices[0].message, "reasoning_content", None) is None
        assert r.choices[0].message.content == FAKE_CONTENT
        assert r.usage.prompt_tokens == fake_prompt_tokens(msgs, thinking=False)
        assert r.usage.completion_tokens == 16


def test_openai_thinking_conflict(oai, mid):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": "hi"}],
                                    extra_body={"enable_thinking": True, "reasoning_effort": "none"})
    assert e.value.body["code"] == "conflicting_template_option"


def test_openai_stream(oai, mid):
    msgs = [{"role": "user", "content": "stream please"}]
    kw = dict(model=mid, messages=msgs, max_completion_tokens=mt(64), seed=7)
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0] is chunks[-2]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    u = chunks[-1].usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    # no character split across chunks: the stream's text is the whole response's (the same
    # seed); a random model's output may hold bytes that are not utf-8 at all, and those are
    # replacement characters in both (a seed of its own per request made this flaky)
    whole = oai.chat.completions.create(**kw).choices[0].message
    assert content == (whole.content or "") and reasoning == (getattr(whole, "reasoning_content", None) or "")
    if FAKE:
        assert content == FAKE_CONTENT and reasoning == FAKE_REASONING
        assert u.prompt_tokens == fake_prompt_tokens(msgs) and u.completion_tokens == 21
    # without include_usage there is no usage chunk
    chunks = list(oai.chat.completions.create(model=mid, messages=msgs, stream=True, max_completion_tokens=mt(8)))
    assert chunks[-1].choices[0].finish_reason is not None


def test_usage_matches_count_tokens(oai, ant, mid):
    # the same conversation through both apis: openai usage == anthropic usage == count_tokens
    r = oai.chat.completions.create(model=mid, messages=[{"role": "system", "content": "sys"},
                                                         {"role": "user", "content": "count me"}], max_completion_tokens=4)
    m = ant.messages.create(model=mid, system="sys", max_tokens=mt(4), messages=[{"role": "user", "content": "count me"}])
    n = ant.messages.count_tokens(model=mid, system="sys", messages=[{"role": "user", "content": "count me"}])
    assert r.usage.prompt_tokens == m.usage.input_tokens == n.input_tokens
    assert r.usage.completion_tokens <= 4 and m.usage.output_tokens <= 4
    if FAKE:
        assert r.usage.completion_tokens == m.usage.output_tokens == 4
    if FAKE:
        assert n.input_tokens == fake_prompt_tokens([{"role": "system", "content": "sys"}, {"role": "user", "content": "count me"}])


def hf_dir():
    """the hugging face directory the served .ninfer was made from (build/models/X-hf), if any"""
    for a in server_cmd():
        if a.endswith(".ninfer"):
            d = a[:-len(".ninfer")]
            d = d[:-len("-bf16")] if d.endswith("-bf16") else d
            if os.path.exists(os.path.join(d + "-hf", "tokenizer.json")):
                return d + "-hf"
    return None


@pytest.mark.skipif(FAKE, reason="the fake engine does not sample")
def test_logit_bias_steers_the_real_engine(oai, mid):
    # +100 on one token makes it the argmax at every step (9707 is "Hello" in the qwen3
    # tokenizer that the synthetic models carry)
    r = oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                    temperature=0, logit_bias={"9707": 100}, extra_body={"enable_thinking": False})
    assert r.choices[0].message.content == "HelloHelloHello", r.choices[0].message
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


@pytest.mark.skipif(FAKE, reason="the fake's counts are checked against its own rule above")
def test_usage_equals_tokenizer_counts(oai, ant, mid):
    # the real engine: prompt tokens = hf tokenizers over the chat template rendered the way
    # transformers renders it (test/gen_template_goldens.py); completion tokens = max_tokens
    # when the output is cut there
    d = hf_dir()
    if d is None:
        pytest.skip("no tokenizer.json beside the served model")
    import sys
    sys.path.insert(0, os.path.join(ROOT, "test"))
    from gen_template_goldens import make_renderer
    from tokenizers import Tokenizer
    render, _ = make_renderer(open(os.path.join(d, "chat_template.jinja")).read())
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    for msgs, think in (([{"role": "user", "content": "Hello, wörld! 你好 🙂"}], True),
                        ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}], False)):
        kw = {} if think else {"enable_thinking": False}
        want = len(tok.encode(render(msgs, None, add_generation_prompt=True, **kw), add_special_tokens=False).ids)
        r = oai.chat.completions.create(model=mid, messages=msgs, max_completion_tokens=mt(5), extra_body=kw,
                                        temperature=0, extra_headers={})
        assert r.usage.prompt_tokens == want
        if r.choices[0].finish_reason == "length":
            assert r.usage.completion_tokens == 5
        n = ant.messages.count_tokens(model=mid, messages=[m for m in msgs if m["role"] != "system"],
                                      system=msgs[0]["content"] if msgs[0]["role"] == "system" else anthropic.NOT_GIVEN,
                                      thinking={"type": "enabled", "budget_tokens": 1024} if think else {"type": "disabled"})
        assert n.input_tokens == want


@fake_only
def test_multibyte_split_across_tokens_streams_intact(lim):
    # the fake splits ö, 你, 好 and 🙂 across tokens; every sse frame must hold whole code points
    mid = model_id(lim.port)
    c = Conn(lim.port)
    c.send(http("POST", "/v1/chat/completions", chat_body(mid, stream=True, enable_thinking=False)))
    st, h, body = c.response()
    c.close()
    assert st == 200 and h["content-type"] == "text/event-stream"
    deltas = []
    for ev, data in sse_events(body):  # .decode above is strict utf-8: a broken byte would raise
        if data == "[DONE]":
            continue
        d = json.loads(data)["choices"][0]["delta"]
        if d.get("content"):
            deltas.append(d["content"])
    assert "".join(deltas) == FAKE_CONTENT
    assert "你" in deltas and "🙂" in deltas and "好" in deltas
    # echo, one token per byte: 4-byte emoji and cjk arrive whole
    text = "日本語 😀🎉 ok"
    c = Conn(lim.port)
    c.send(http("POST", "/v1/chat/completions", chat_body(mid, "[[echo]]" + text, stream=True, enable_thinking=False)))
    st, _, body = c.response()
    c.close()
    got = [json.loads(d)["choices"][0]["delta"].get("content", "") for _, d in sse_events(body) if d != "[DONE]"]
    assert "".join(got) == text and "😀" in got and "日" in got


@fake_only
def test_openai_tool_call_round_trip(oai, mid):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather for a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "weather in Paris?"}]
    r = oai.chat.completions.create(model=mid, messages=msgs, tools=tools)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # streaming: one delta.tool_calls chunk with an index
    chunks = list(oai.chat.completions.create(model=mid, messages=msgs, tools=tools, stream=True))
    tc = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(tc) == 1 and tc[0][0].index == 0 and tc[0][0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the result goes back; the model answers with it
    msgs += [ch.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"}]
    r2 = oai.chat.completions.create(model=mid, messages=msgs, tools=tools)
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "Result: 18C and sunny"
    # tool_choice none hides the tools
    r3 = oai.chat.completions.create(model=mid, messages=msgs[:1], tools=tools, tool_choice="none")
    assert r3.choices[0].message.tool_calls is None


def test_openai_tool_declared(oai, mid):
    # any model: a request with tools is accepted and answers in the right shape
    tools = [{"type": "function", "function": {"name": "noop"}}]  # parameters default to an empty object
    r = oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": "hi"}], tools=tools,
                                    max_completion_tokens=mt(16))
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@fake_only
def test_openai_stop_strings(oai, mid):
    msgs = [{"role": "user", "content": "hi"}]
    # "wö" spans three tokens (" w", "\xc3", "\xb6rld"): held back, then cut
    r = oai.chat.completions.create(model=mid, messages=msgs, stop=["wö", "zzz"], extra_body={"enable_thinking": False})
    assert r.choices[0].message.content == "Hello, "
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 5  # the tokens up to the one completing the match
    chunks = list(oai.chat.completions.create(model=mid, messages=msgs, stop="你好", stream=True,
                                              extra_body={"enable_thinking": False}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello, wörld! "
    # a prefix of a stop string that never completes is released at the end
    r = oai.chat.completions.create(model=mid, messages=msgs, stop="done!", extra_body={"enable_thinking": False})
    assert r.choices[0].message.content == FAKE_CONTENT


def test_openai_max_tokens(oai, mid):
    for kw in ({"max_completion_tokens": 3}, {"max_tokens": 3}):
        r = oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": "[[tokens=50]] go"}],
                                        extra_body={"enable_thinking": False}, **kw)
        assert r.usage.completion_tokens <= 3
        if FAKE:
            assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
            assert r.choices[0].message.content == "w0 w1 w2"


@fake_only
def test_sampling_precedence(lim):
    mid = model_id(lim.port)
    body = chat_body(mid, "[[params]]", enable_thinking=False, temperature=0.25, top_p=0.5, top_k=7, seed=42,
                     stop=["@@"], max_tokens=9, logit_bias={"17": -5})
    st, _, b = request(lim.port, "POST", "/v1/chat/completions", body)
    assert st == 200
    p = json.loads(json.loads(b)["choices"][0]["message"]["content"])
    assert p["temperature"] == 0.25 and p["top_p"] == 0.5 and p["top_k"] == 7 and p["seed"] == "42"
    assert p["stop"] == ["@@"] and p["max_tokens"] == 9 and p["logit_bias"] == [[17, -5]]
    # defaults when the request gives none: the engine preset and --default-max-tokens
    st, _, b = request(lim.port, "POST", "/v1/chat/completions", chat_body(mid, "[[params]]", enable_thinking=False))
    p = json.loads(json.loads(b)["choices"][0]["message"]["content"])
    assert p["temperature"] == 0.6 and p["top_k"] == 20 and p["max_tokens"] == 64


@fake_only
def test_greedy_and_flag_defaults():
    s = Server("--temperature", "1.5", "--top-k", "5", "--seed", "7")
    g = Server("--greedy", "--temperature", "1.5")
    try:
        st, _, b = request(s.port, "POST", "/v1/chat/completions",
                           chat_body("fake-model", "[[params]]", enable_thinking=False, top_k=3))
        p = json.loads(json.loads(b)["choices"][0]["message"]["content"])
        assert p["temperature"] == 1.5 and p["top_k"] == 3 and p["seed"] == "7"  # flag < request
        st, _, b = request(g.port, "POST", "/v1/chat/completions",
                           chat_body("fake-model", "[[params]]", enable_thinking=False, temperature=0.9))
        p = json.loads(json.loads(b)["choices"][0]["message"]["content"])
        assert p["temperature"] == 0  # --greedy beats the request
    finally:
        assert s.stop() == 0 and g.stop() == 0


def test_openai_errors(oai, mid):
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-4o", messages=msgs)
    assert e.value.body["code"] == "model_not_found"
    cases = [
        ({"temperature": 5}, "invalid_request_error", "temperature"),
        ({"top_p": -1}, "invalid_request_error", "top_p"),
        ({"n": 2}, "n_not_supported", "n"),
        ({"max_completion_tokens": 0}, "invalid_request_error", "max_completion_tokens"),
        ({"extra_body": {"bogus_field": 1}}, "unknown_parameter", "bogus_field"),
        ({"response_format": {"type": "xml"}}, "response_format_not_supported", "response_format.type"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 1}}}},
         "schema_not_supported", "response_format.json_schema.schema"),
        ({"tools": [{"type": "web_search"}]}, "tool_type_not_supported", "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "invalid_request_error", "tools[0].function.name"),
        ({"tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [{"type": "function", "function": {"name": "f"}}]},
         "invalid_request_error", "tool_choice"),
        ({"extra_body": {"reasoning_effort": "bogus"}}, "invalid_request_error", "reasoning_effort"),
        ({"stop": [""]}, "invalid_request_error", "stop"),
        ({"extra_body": {"preserve_thinking": "yes"}}, "invalid_request_error", "preserve_thinking"),
    ]
    for kw, code, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=mid, messages=msgs, **kw)
        assert e.value.body["code"] == code, kw
        assert e.value.body["param"] == param, kw
    for bad in ([], [{"role": "function", "content": "x"}], [{"role": "user"}], [{"content": "x"}],
                [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]):
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=mid, messages=bad)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=mid, messages=[{"role": "function", "name": "f", "content": "x"}])
    assert e.value.body["code"] == "unsupported_role"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert e.value.body["code"] == "vision_disabled"
    with pytest.raises(openai.BadRequestError) as e:  # prompt longer than --max-context 4096
        oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": " ".join(map(str, range(5000)))}])
    assert e.value.body["code"] == "context_length_exceeded"


# ---------------------------------------------------------------------------------------
# the anthropic sdk

def test_anthropic_message(ant, mid):
    msgs = [{"role": "user", "content": "hello"}]
    m = ant.messages.create(model="any-label", system="be kind", max_tokens=mt(256), messages=msgs)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == "any-label"  # a label only
    assert m.stop_reason in ("end_turn", "max_tokens")
    n = ant.messages.count_tokens(model="any-label", system="be kind", messages=msgs)
    assert m.usage.input_tokens == n.input_tokens
    if FAKE:
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == FAKE_REASONING and m.content[0].signature == ""
        assert m.content[1].text == FAKE_CONTENT
        assert m.stop_reason == "end_turn" and m.stop_sequence is None
        assert m.usage.input_tokens == fake_prompt_tokens([{"role": "system", "content": "be kind"}] + msgs)
        assert m.usage.output_tokens == 21


def test_anthropic_thinking_disabled(ant, mid):
    m = ant.messages.create(model=mid, max_tokens=mt(64), thinking={"type": "disabled"},
                            messages=[{"role": "user", "content": "hello"}])
    assert all(b.type != "thinking" for b in m.content)
    if FAKE:
        assert m.content[0].text == FAKE_CONTENT and m.usage.output_tokens == 16
        e = ant.messages.create(model=mid, max_tokens=mt(64), thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "hello"}])
        assert e.content[0].type == "thinking"


def test_anthropic_stream_event_sequence(ant, mid):
    msgs = [{"role": "user", "content": "stream it"}]
    with ant.messages.stream(model=mid, max_tokens=mt(64), messages=msgs) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and events[-2] == "message_delta"
    # blocks open, take deltas, close, in order
    depth = 0
    for t in events:
        if t == "content_block_start":
            assert depth == 0
            depth = 1
        elif t == "content_block_stop":
            assert depth == 1
            depth = 0
        elif t in ("content_block_delta", "text", "thinking", "signature", "input_json"):
            assert depth == 1
    assert depth == 0
    n = ant.messages.count_tokens(model=mid, messages=msgs)
    assert final.usage.input_tokens == n.input_tokens
    if FAKE:
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[1].text == FAKE_CONTENT and final.content[0].thinking == FAKE_REASONING
        assert final.stop_reason == "end_turn" and final.usage.output_tokens == 21


def test_anthropic_raw_sse(srv, mid):
    c = Conn(srv.port)
    c.send(http("POST", "/v1/messages", json.dumps({"model": mid, "max_tokens": mt(32), "stream": True,
                                                    "messages": [{"role": "user", "content": "x"}]}).encode(),
                {"x-api-key": API_KEY}))
    st, h, body = c.response()
    c.close()
    assert st == 200 and h["content-type"] == "text/event-stream" and h["cache-control"] == "no-cache"
    assert h["x-accel-buffering"] == "no" and h["transfer-encoding"] == "chunked"
    evs = sse_events(body)
    names = [e for e, _ in evs]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    for e, d in evs:
        assert json.loads(d)["type"] == e  # every data carries its event type


@fake_only
def test_anthropic_tool_round_trip(ant, mid):
    tools = [{"name": "get_weather", "description": "weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    msgs = [{"role": "user", "content": "weather in Paris?"}]
    m = ant.messages.create(model=mid, max_tokens=mt(256), tools=tools, messages=msgs)
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    with ant.messages.stream(model=mid, max_tokens=mt(256), tools=tools, messages=msgs) as s:
        final = s.get_final_message()
    assert [b for b in final.content if b.type == "tool_use"][0].input == {"city": "Paris"}
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C"}]}]
    m2 = ant.messages.create(model=mid, max_tokens=256, tools=tools, messages=msgs)
    assert m2.stop_reason == "end_turn"
    assert [b for b in m2.content if b.type == "text"][0].text == "Result: 18C"


@fake_only
def test_anthropic_stop_sequences(ant, mid):
    m = ant.messages.create(model=mid, max_tokens=mt(64), stop_sequences=["🙂"], thinking={"type": "disabled"},
                            messages=[{"role": "user", "content": "hi"}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "🙂"
    assert m.content[0].text == "Hello, wörld! 你好 "
    m = ant.messages.create(model=mid, max_tokens=mt(3), thinking={"type": "disabled"},
                            messages=[{"role": "user", "content": "hi"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_anthropic_errors(ant, mid):
    msgs = [{"role": "user", "content": "hi"}]
    for kw in ({"max_tokens": 0}, {"max_tokens": 8, "extra_body": {"temperature": 5}}, {"max_tokens": 8, "extra_body": {"nope": 1}},
               {"max_tokens": 8, "tool_choice": {"type": "tool", "name": "g"}, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}):
        with pytest.raises(anthropic.BadRequestError) as e:
            ant.messages.create(model=mid, messages=msgs, **kw)
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model=mid, max_tokens=8, messages=[{"role": "system", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.count_tokens(model=mid, messages=[])


# ---------------------------------------------------------------------------------------
# the raw-socket battery: after each, /health and a normal request still work

def test_bad_json(lim):
    mid = model_id(lim.port)
    for body in (b"{", b"not json", b'{"model": }', b"[1,]", b'{"a":1} x', b"", b'"\\x"', b"\x00"):
        st, _, b = request(lim.port, "POST", "/v1/chat/completions", body)
        assert st == 400, body
        err = json.loads(b)["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
    st, _, b = request(lim.port, "POST", "/v1/messages", b"{oops")
    assert st == 400 and json.loads(b)["type"] == "error"
    assert_healthy(lim.port, mid)


def test_deep_nesting(lim):
    mid = model_id(lim.port)
    for body in (b"[" * 200000, b'{"a":' * 100000, b"[" * 65 + b"]" * 65):
        st, _, b = request(lim.port, "POST", "/v1/chat/completions", body)
        assert st == 400 and "deep" in json.loads(b)["error"]["message"]
    assert_healthy(lim.port, mid)


def test_invalid_utf8(lim):
    mid = model_id(lim.port)
    for bad in (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe4\xbd", b"\x80"):
        body = b'{"model":"' + mid.encode() + b'","messages":[{"role":"user","content":"a' + bad + b'"}]}'
        st, _, b = request(lim.port, "POST", "/v1/chat/completions", body)
        assert st == 400, bad
        json.loads(b)  # the error body itself is valid json (no echo of the bytes)
    for esc in (b"\\ud800", b"\\udc00x", b"\\ud800\\u0041"):  # lone surrogates
        body = b'{"model":"' + mid.encode() + b'","messages":[{"role":"user","content":"' + esc + b'"}]}'
        st, _, _ = request(lim.port, "POST", "/v1/chat/completions", body)
        assert st == 400, esc
    assert_healthy(lim.port, mid)


@fake_only
def test_surrogate_pair_round_trip(lim):
    mid = model_id(lim.port)
    body = (b'{"model":"' + mid.encode() + b'","enable_thinking":false,'
            b'"messages":[{"role":"user","content":"[[echo]]\\ud83d\\ude00\\u00e9"}]}')
    st, _, b = request(lim.port, "POST", "/v1/chat/completions", body)
    assert st == 200 and json.loads(b)["choices"][0]["message"]["content"] == "😀é"


def test_oversize_body(lim):
    mid = model_id(lim.port)
    c = Conn(lim.port)
    c.send(http("POST", "/v1/chat/completions", b"", {"Content-Length": str(2 << 20)}))
    c.send(b"x" * 1000)
    st, h, b = c.response()
    assert st == 413 and json.loads(b)["error"]["code"] == "request_too_large"
    assert h["connection"] == "close" and c.closed()
    c.close()
    # chunked: the limit applies as the chunks arrive
    c = Conn(lim.port)
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % (256 << 10) + b"a" * (256 << 10) + b"\r\n"
    try:
        for _ in range(6):
            c.send(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    st, _, _ = c.response()
    assert st == 413 and c.closed()
    c.close()
    # a body of exactly the limit is read (and then rejected as bad json, not as too large)
    st, _, _ = request(lim.port, "POST", "/v1/chat/completions", b" " * (1 << 20))
    assert st == 400
    assert_healthy(lim.port, mid)


def test_body_memory_budget(lim):
    # one request may carry --max-request-mib (1 here); all connections together buffer at
    # most 4x that: four nearly complete 1 MiB bodies fill the budget, a fifth body gets 503
    mid = model_id(lim.port)
    big = b" " * ((1 << 20) - 1)
    held = []
    for _ in range(4):
        c = Conn(lim.port)
        c.send(http("POST", "/v1/chat/completions", b"", {"Content-Length": str(1 << 20)}) + big)
        held.append(c)
    time.sleep(0.5)  # the server reads them in (no way to observe it from here)
    c = Conn(lim.port)
    c.send(http("POST", "/v1/chat/completions", b"x" * (200 << 10)))
    st, _, body = c.response()
    assert st == 503 and json.loads(body)["error"]["code"] == "server_overloaded"
    c.close()
    for c in held:  # the last byte: complete, then rejected as json, and the budget comes back
        c.send(b" ")
        assert c.response()[0] == 400
        c.close()
    assert_healthy(lim.port, mid)
    st, _, body = request(lim.port, "POST", "/v1/chat/completions", chat_body(mid, "y" * (300 << 10), max_tokens=2))
    assert st == 200 if FAKE else json.loads(body)["error"]["code"] == "context_length_exceeded"  # not 503


def test_header_limits(lim):
    mid = model_id(lim.port)
    c = Conn(lim.port)
    c.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n")
    st, _, _ = c.response()
    assert st == 413 and c.closed()
    c.close()
    c = Conn(lim.port)
    c.send(b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n")
    st, _, _ = c.response()
    assert st == 413 and c.closed()
    c.close()
    assert_healthy(lim.port, mid)


@pytest.mark.parametrize("head", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: +5\r\n\r\nhello",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 0x5\r\n\r\nhello",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length : 5\r\n\r\nhello",
    b"GET /health HTTP/1.1\r\nHost: localhost\r\n folded: line\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\rX: y\r\n\r\n",
    b"GET /health\r\n\r\n",
    b"GET  /health HTTP/1.1\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # tls to a plain port
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
])
def test_bad_framing_400_and_close(lim, head):
    mid = model_id(lim.port)
    c = Conn(lim.port)
    c.send(head)
    st, h, b = c.response()
    assert st == 400, head
    assert h["connection"] == "close" and c.closed()
    json.loads(b)
    c.close()
    assert_healthy(lim.port, mid)


def test_random_garbage(lim):
    # mutated requests on fresh connections (the client half-closes, so nothing waits for a
    # deadline): every answer is a well-formed http response or a plain close
    import random
    mid = model_id(lim.port)
    rnd = random.Random(1234)
    seeds = [http("POST", "/v1/chat/completions", chat_body(mid, max_tokens=2)),
             http("POST", "/v1/messages", json.dumps({"model": "m", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "x"}]}).encode()),
             b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{}\n\r\n0\r\n\r\n"]
    for it in range(60):
        b = bytearray(seeds[it % 3])
        for _ in range(rnd.randint(1, 6)):
            i = rnd.randrange(len(b))
            op = rnd.randrange(3)
            if op == 0:
                b[i] = rnd.randrange(256)
            elif op == 1:
                b.insert(i, rnd.choice(b"\r\n:{}[]\"\x00\xff "))
            else:
                del b[i]
        c = Conn(lim.port)
        try:
            c.send(bytes(b))
            c.s.shutdown(socket.SHUT_WR)
            data = b""
            while True:
                d = c.s.recv(65536)
                if not d:
                    break
                data += d
        except ConnectionResetError:
            data = b""
        finally:
            c.close()
        assert data == b"" or re.match(rb"HTTP/1\.1 (200|400|401|403|404|405|408|413|415|417|501|505) ", data), data[:200]
    assert_healthy(lim.port, mid)


def test_other_statuses(lim):
    c = Conn(lim.port)
    c.send(b"GET /health HTTP/2.0\r\n\r\n")
    assert c.response()[0] == 505
    c.close()
    c = Conn(lim.port)
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n")
    assert c.response()[0] == 501
    c.close()
    c = Conn(lim.port)
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}")
    assert c.response()[0] == 417
    c.close()
    st, _, b = request(lim.port, "GET", "/nope")
    assert st == 404 and json.loads(b)["error"]["code"] == "not_found"
    st, h, _ = request(lim.port, "GET", "/v1/chat/completions")
    assert st == 405 and "POST" in h["allow"]
    st, h, _ = request(lim.port, "DELETE", "/health")
    assert st == 405
    # an error answered from the head skips a body already received and keeps the connection
    c = Conn(lim.port)
    c.send(http("POST", "/nope", b'{"x":1}') + http("GET", "/health"))
    assert [c.response()[0] for _ in range(2)] == [404, 200]
    c.close()
    st, h, _ = request(lim.port, "OPTIONS", "/v1/chat/completions")  # cors preflight (--cors)
    assert st == 204 and h["access-control-allow-origin"] == "*" and "POST" in h["access-control-allow-methods"]
    st, h, _ = request(lim.port, "GET", "/health")
    assert h["access-control-allow-origin"] == "*"


def test_headers_byte_by_byte(lim):
    mid = model_id(lim.port)
    # a whole request dribbled one byte at a time, inside the read deadline, is served
    c = Conn(lim.port)
    c.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for b in http("POST", "/v1/chat/completions", chat_body(mid, max_tokens=4)):
        c.send(bytes([b]))
    assert c.response()[0] == 200
    c.close()
    # a slowloris that never finishes its head: 408 at the read deadline (1 s), then closed
    c = Conn(lim.port)
    t0 = time.time()
    try:
        for b in b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100:
            c.send(bytes([b]))
            time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        pass
    st, _, _ = c.response()
    assert st == 408 and c.closed() and time.time() - t0 < 4
    c.close()
    assert_healthy(lim.port, mid)


def test_idle_keepalive_timeout(lim):
    c = Conn(lim.port)
    c.send(http("GET", "/health"))
    assert c.response()[0] == 200
    t0 = time.time()
    assert c.closed(timeout=4)  # --idle-timeout-ms 1500
    assert 1.0 < time.time() - t0 < 3.5
    c.close()


def test_expect_100_continue(lim):
    mid = model_id(lim.port)
    body = chat_body(mid, max_tokens=4)
    c = Conn(lim.port)
    t0 = time.time()
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body))
    st, _, _ = c.response(head_only=True)
    assert st == 100 and time.time() - t0 < 0.1
    c.send(body)
    assert c.response()[0] == 200
    c.close()
    # an oversize body is refused before it is sent
    c = Conn(lim.port)
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\n\r\n")
    assert c.response()[0] == 413
    c.close()


def test_chunked_request_body(lim):
    mid = model_id(lim.port)
    body = chat_body(mid, max_tokens=4)
    c = Conn(lim.port)
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    c.send(b"%x;ext=1\r\n" % 10 + body[:10] + b"\r\n" + b"%X\r\n" % (len(body) - 10) + body[10:] + b"\r\n")
    c.send(b"0\r\nX-Trailer: t\r\n\r\n")
    st, _, b = c.response()
    assert st == 200 and json.loads(b)["object"] == "chat.completion"
    c.send(http("GET", "/health"))  # the connection is still in sync
    assert c.response()[0] == 200
    c.close()


def test_pipelined_requests(lim):
    mid = model_id(lim.port)
    c = Conn(lim.port)
    c.send(http("GET", "/health") + http("POST", "/v1/chat/completions", chat_body(mid, max_tokens=2)) +
           http("GET", "/v1/models") + http("POST", "/v1/chat/completions", b"{bad") +
           http("GET", "/health", headers={"Connection": "close"}))
    r = [c.response() for _ in range(5)]
    assert [x[0] for x in r] == [200, 200, 200, 400, 200]
    assert json.loads(r[1][2])["object"] == "chat.completion"
    assert json.loads(r[2][2])["object"] == "list"
    assert r[4][1]["connection"] == "close" and c.closed()
    c.close()
    # a body on a GET is consumed exactly, so the next request parses (cpp-httplib#2028)
    c = Conn(lim.port)
    c.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: 20\r\n\r\nGET /nope HTTP/1.1\r\n\r\n" + http("GET", "/v1/models"))
    assert [c.response()[0] for _ in range(2)] == [200, 200]
    c.close()


def test_keepalive_and_http10(lim):
    c = Conn(lim.port)
    for _ in range(3):
        c.send(http("GET", "/health"))
        st, h, _ = c.response()
        assert st == 200 and h["connection"] == "keep-alive"
    c.close()
    c = Conn(lim.port)
    c.send(b"GET /health HTTP/1.0\r\n\r\n")
    st, h, _ = c.response()
    assert st == 200 and h["connection"] == "close" and c.closed()
    c.close()
    c = Conn(lim.port)
    c.send(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert c.response()[1]["connection"] == "keep-alive"
    c.close()


def test_http10_stream(lim):
    mid = model_id(lim.port)
    body = chat_body(mid, stream=True, max_tokens=4)
    c = Conn(lim.port)
    c.send(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    st, h, b = c.response()  # no chunking: the body ends with the connection
    assert st == 200 and "transfer-encoding" not in h and b.endswith(b"data: [DONE]\n\n")
    c.close()


@fake_only
def test_client_closes_mid_stream(lim):
    mid = model_id(lim.port)
    mark = len(lim.log)
    c = Conn(lim.port)
    c.send(http("POST", "/v1/chat/completions",
                chat_body(mid, "[[tokens=300]][[delay=20]] long", stream=True, max_tokens=300, enable_thinking=False)))
    c.read_until(b"w2")  # a few tokens in
    c.close()
    t0 = time.time()
    assert_healthy(lim.port, mid)  # would wait ~6 s behind the stream if it were not cancelled
    assert time.time() - t0 < 2
    line = lim.wait_log(r" 499 POST /v1/chat/completions .*completion=(\d+)", since=mark)
    assert int(re.search(r"completion=(\d+)", line).group(1)) < 100


@fake_only
def test_client_closes_while_queued(lim):
    mid = model_id(lim.port)
    a = Conn(lim.port)
    a.send(http("POST", "/v1/chat/completions",
                chat_body(mid, "[[tokens=20]][[delay=20]]", stream=True, enable_thinking=False)))
    a.read_until(b"w0")
    b = Conn(lim.port)  # queued behind a; leaves before its turn
    b.send(http("POST", "/v1/chat/completions", chat_body(mid, max_tokens=4)))
    time.sleep(0.1)
    b.close()
    assert a.read_until(STREAM_END).endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    a.close()
    assert_healthy(lim.port, mid)


@fake_only
def test_slow_reader_dropped(lim):
    # a client that never reads: the write timeout (1 s) drops it and cancels its generation
    mid = model_id(lim.port)
    mark = len(lim.log)
    c = Conn(lim.port)
    c.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.send(http("POST", "/v1/chat/completions",
                chat_body(mid, "[[tokens=100000]][[pad=4000]]", stream=True, max_tokens=100000, enable_thinking=False)))
    lim.wait_log(r" 499 POST /v1/chat/completions .*completion=", timeout=15, since=mark)
    c.close()
    assert_healthy(lim.port, mid)


@fake_only
def test_queue_full_429_and_timeout_503_health_answers(lim):
    mid = model_id(lim.port)
    a = Conn(lim.port)  # running: ~1.6 s of tokens
    a.send(http("POST", "/v1/chat/completions",
                chat_body(mid, "[[tokens=80]][[delay=20]]", stream=True, max_tokens=80, enable_thinking=False)))
    a.read_until(b"w0")
    b = Conn(lim.port)  # the one pending slot (--max-pending-requests 1)
    b.send(http("POST", "/v1/chat/completions", chat_body(mid, max_tokens=4)))
    time.sleep(0.15)
    t0 = time.time()
    st, _, body = request(lim.port, "POST", "/v1/chat/completions", chat_body(mid, max_tokens=4))
    assert st == 429 and json.loads(body)["error"]["code"] == "server_overloaded" and time.time() - t0 < 0.5
    assert request(lim.port, "POST", "/v1/chat/completions", chat_body(mid, max_tokens=4))[1]["retry-after"] == "1"
    st, _, body = request(lim.port, "POST", "/v1/messages",
                          json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}).encode())
    assert st == 429 and json.loads(body)["error"]["type"] == "rate_limit_error"
    # /health and /v1/models answer at once while a stream runs and one waits
    t0 = time.time()
    assert request(lim.port, "GET", "/health")[0] == 200
    assert request(lim.port, "GET", "/v1/models")[0] == 200
    assert time.time() - t0 < 0.3
    # the pending one gives up after --pending-timeout-ms 600
    st, h, body = b.response()
    assert st == 503 and json.loads(body)["error"]["code"] == "request_queue_timeout" and h["retry-after"] == "1"
    b.close()
    assert a.read_until(STREAM_END).endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    a.close()
    assert_healthy(lim.port, mid)


@fake_only
def test_engine_error_mid_stream(lim, srv, oai, mid):
    m = model_id(lim.port)
    st, _, body = request(lim.port, "POST", "/v1/chat/completions",
                          chat_body(m, "[[fail]]", stream=True, enable_thinking=False))
    evs = sse_events(body)
    assert st == 200 and json.loads(evs[-1][1])["error"]["code"] == "internal_error"
    st, _, body = request(lim.port, "POST", "/v1/chat/completions", chat_body(m, "[[fail]]"))
    assert st == 500 and json.loads(body)["error"]["code"] == "internal_error"
    st, _, body = request(lim.port, "POST", "/v1/messages", json.dumps(
        {"model": "m", "max_tokens": 9, "stream": True, "messages": [{"role": "user", "content": "[[fail]]"}]}).encode())
    assert sse_events(body)[-1][0] == "error"
    with pytest.raises(openai.APIError):  # the sdk raises on the error frame
        list(oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": "[[fail]]"}], stream=True))
    assert_healthy(lim.port, m)


def test_request_log(srv, oai, mid):
    secret = "SECRET-PROMPT-TEXT-4242"
    r = oai.chat.completions.create(model=mid, messages=[{"role": "user", "content": secret}], max_completion_tokens=mt(5))
    line = srv.wait_log(re.escape(r.id))
    assert re.search(r"^ninfer-serve: 200 POST /v1/chat/completions id=chatcmpl-\w+ stream=0 prompt=\d+ completion=\d+ "
                     r"cached=\d+ (cache=\w+ )?finish=\w+ queue_ms=[\d.]+ .*total_ms=[\d.]+$", line.strip()), line
    assert f"prompt={r.usage.prompt_tokens} completion={r.usage.completion_tokens} cached=" in line
    assert f" finish={r.choices[0].finish_reason} " in line
    assert secret not in srv.text()
    if r.choices[0].message.content:
        assert r.choices[0].message.content not in srv.text()


def test_request_log_jsonl(tmp_path):
    path = tmp_path / "req.jsonl"
    s = Server("--request-log-jsonl", str(path), "--api-key", "k")
    try:
        mid = model_id(s.port, "k")
        st, _, _ = request(s.port, "POST", "/v1/chat/completions", chat_body(mid, "hidden words", max_tokens=3),
                           headers={"Authorization": "Bearer k"})
        assert st == 200
        request(s.port, "POST", "/v1/chat/completions", b"{", headers={"Authorization": "Bearer k"})
    finally:
        assert s.stop() == 0
    evs = [json.loads(l) for l in path.read_text().splitlines()]
    # the log line follows the response, so the two requests' lines may come in either order
    assert [e["event"] for e in evs[:2]] == ["server_start", "request_start"]
    assert sorted(e["event"] for e in evs[2:]) == ["request_done", "request_error"]
    assert all(e["schema"] == "ninfer_serve_request_log" for e in evs)
    done = [e for e in evs if e["event"] == "request_done"][0]
    assert done["finish_reason"] in ("stop", "length") and done["completion_tokens"] <= 3
    assert set(done["timings_seconds"]) >= {"queue", "total"}
    assert "hidden words" not in path.read_text() and '"k"' not in path.read_text()


def test_connection_cap():
    s = Server("--max-connections", "2")
    try:
        a, b = Conn(s.port), Conn(s.port)
        for c in (a, b):
            c.send(http("GET", "/health"))
            assert c.response()[0] == 200
        c = Conn(s.port)  # a third: told so and closed, the main thread never blocks on it
        st, h, body = c.response()
        assert st == 503 and json.loads(body)["error"]["code"] == "server_overloaded" and h["retry-after"] == "1"
        c.close()
        a.close()
        b.close()
        deadline = time.time() + 10  # a loaded machine may take seconds to end the two threads
        while time.time() < deadline:  # the two threads end, the slots come back
            if request(s.port, "GET", "/health")[0] == 200:
                break
            time.sleep(0.05)
        assert request(s.port, "GET", "/health")[0] == 200
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------------------------------
# issue 11: http framing and browser attacks

def test_unknown_path_404_names_it(lim):
    st, _, body = request(lim.port, "POST", "/v1/chat/completion", b"{}")
    e = json.loads(body)["error"]
    assert st == 404 and e["code"] == "not_found" and "/v1/chat/completion" in e["message"]


def test_head_errors_have_no_body(lim):
    c = Conn(lim.port)
    c.send(http("HEAD", "/nope") + http("HEAD", "/v1/models/other") + http("GET", "/health"))
    for want in (404, 404):
        st, h, _ = c.response(head_only=True)
        assert st == want and int(h["content-length"]) > 0 and h["connection"] == "keep-alive"
    st, _, body = c.response()  # nothing of the error bodies was sent: the framing holds
    assert st == 200 and json.loads(body) == {"status": "ok"}
    c.close()


def test_reset_mid_body_is_499(lim):
    since = len(lim.log)
    c = Conn(lim.port)
    c.send(http("POST", "/v1/chat/completions", b"", {"Content-Length": "1000"}) + b'{"model":')
    time.sleep(0.2)
    c.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close -> rst
    c.close()
    line = lim.wait_log(r"ninfer-serve: \d+ POST /v1/chat/completions", since=since)
    assert line.startswith("ninfer-serve: 499 ") and "code=client_closed" in line, line


@pytest.mark.parametrize("first", [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"\x00\x00\x00\x00",
                                   b"GET /health HTTQ", b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_binary_first_bytes_400_at_once(lim, first):
    c = Conn(lim.port)
    t0 = time.time()
    c.send(first)  # no newline, no eof: only the bytes themselves say it is not http
    st, h, _ = c.response()
    assert st == 400 and time.time() - t0 < 0.5 and h["connection"] == "close"
    c.close()


def test_http11_needs_one_host(lim):
    for head in (b"GET /health HTTP/1.1\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n",
                 b"GET /health HTTP/1.1\r\nHost:\r\n\r\n"):
        c = Conn(lim.port)
        c.send(head)
        st, _, body = c.response()
        assert st == 400 and "Host" in json.loads(body)["error"]["message"], head
        c.close()
    c = Conn(lim.port)
    c.send(b"GET /health HTTP/1.0\r\n\r\n")  # http/1.0 has no Host requirement
    assert c.response()[0] == 200
    c.close()


def test_dns_rebinding_host_refused():
    # keyless on loopback (the default): only loopback names, and --allowed-hosts
    s = Server("--allowed-hosts", "my.box,Other.Box")
    try:
        for host, want in (("evil.example", 403), ("evil.example:%d" % s.port, 403), ("127.0.0.1.evil.example", 403),
                           ("localhost", 200), ("localhost:%d" % s.port, 200), ("127.0.0.1:%d" % s.port, 200),
                           ("[::1]:%d" % s.port, 200), ("MY.BOX", 200), ("other.box:1", 200)):
            st, _, body = request(s.port, "GET", "/v1/models", headers={"Host": host})
            assert st == want, (host, body)
            if st == 403:
                assert json.loads(body)["error"]["code"] == "host_not_allowed"
        st, _, _ = request(s.port, "POST", "/v1/chat/completions", b"{}", headers={"Host": "evil.example"})
        assert st == 403
    finally:
        assert s.stop() == 0
    # an api key protects the server: any Host may ask (and must authenticate)
    s = Server("--api-key", "k")
    try:
        assert request(s.port, "GET", "/health", headers={"Host": "my.server.example"})[0] == 200
    finally:
        assert s.stop() == 0


def test_cross_origin_needs_cors(srv, lim):
    # srv: no --cors. a page on another origin cannot make the server generate
    body = chat_body(model_id(srv.port, API_KEY), max_tokens=2)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    for origin in ("http://evil.example", "null", "http://localhost:1"):
        st, _, b = request(srv.port, "POST", "/v1/chat/completions", body, headers={**auth, "Origin": origin})
        assert st == 403 and json.loads(b)["error"]["code"] == "cross_origin_refused", origin
    st, _, _ = request(srv.port, "OPTIONS", "/v1/chat/completions", headers={"Origin": "http://evil.example"})
    assert st == 403
    # its own origin is no cross-origin request
    st, _, _ = request(srv.port, "POST", "/v1/chat/completions", body,
                       headers={**auth, "Host": f"127.0.0.1:{srv.port}", "Origin": f"http://127.0.0.1:{srv.port}"})
    assert st == 200
    # lim runs with --cors
    st, h, _ = request(lim.port, "POST", "/v1/chat/completions", chat_body(model_id(lim.port), max_tokens=2),
                       headers={"Origin": "http://evil.example"})
    assert st == 200 and h["access-control-allow-origin"] == "*"


def test_fields_refused_by_name(lim):
    # issue 11: nonsense that used to pass, over http on either engine; anthropic's message
    # names the field the way openai's param does
    mid = model_id(lim.port)
    u = [{"role": "user", "content": "x"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    for extra, param in (({"user": {"id": 1}}, "user"), ({"metadata": "x"}, "metadata"),
                         ({"stream_options": {"include_usage": True}}, "stream_options"), ({"tool_choice": "auto"}, "tool_choice"),
                         ({"messages": u + [{"role": "tool", "content": "r"}]}, "messages[1].tool_call_id"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]},
                          "tools[0].function.parameters.type"),
                         ({"tools": tools + tools}, "tools[1].function.name")):
        st, _, body = request(lim.port, "POST", "/v1/chat/completions", dict({"model": mid, "messages": u}, **extra))
        assert st == 400 and json.loads(body)["error"]["param"] == param, (extra, body)
    a = {"model": "m", "max_tokens": 4, "messages": u}
    for body_, param in (({"model": "m", "messages": u}, "max_tokens"),
                         (dict(a, output_config={"format": {"type": "text"}}), "output_config.format.type"),
                         (dict(a, metadata="x"), "metadata"), (dict(a, tool_choice={"type": "auto"}), "tool_choice"),
                         (dict(a, tools=[{"name": "f", "input_schema": {"type": 12}}]), "tools[0].input_schema.type")):
        st, _, body = request(lim.port, "POST", "/v1/messages", body_)
        e = json.loads(body)["error"]
        assert st == 400 and e["type"] == "invalid_request_error" and e["message"].startswith(param + ": "), (param, body)
    assert_healthy(lim.port, mid)


def test_post_needs_json_content_type(lim):
    mid = model_id(lim.port)
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        c = Conn(lim.port)
        raw = http("POST", "/v1/chat/completions", chat_body(mid, max_tokens=2))
        raw = raw.replace(b"Content-Type: application/json\r\n", b"" if ct is None else b"Content-Type: " + ct.encode() + b"\r\n")
        c.send(raw)
        st, _, body = c.response()
        assert st == 415 and json.loads(body)["error"]["code"] == "unsupported_media_type", ct
        c.close()
    st, _, _ = request(lim.port, "POST", "/v1/chat/completions", chat_body(mid, max_tokens=2),
                       headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert st == 200


# ---------------------------------------------------------------------------------------
# process: signals, flags, the model cards' commands

@fake_only
def test_sigterm_drains_then_exits():
    s = Server("--drain-timeout-ms", "5000")
    mid = model_id(s.port)
    idle = Conn(s.port)  # an idle keep-alive connection is closed at once
    idle.send(http("GET", "/health"))
    idle.response()
    c = Conn(s.port)
    c.send(http("POST", "/v1/chat/completions",
                chat_body(mid, "[[tokens=25]][[delay=20]]", stream=True, enable_thinking=False)))
    c.read_until(b"w0")
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert idle.closed(timeout=2)
    body = c.read_until(STREAM_END)  # the running stream finishes
    assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and b"w24" in body
    assert s.proc.wait(10) == 0 and time.time() - t0 < 5
    with pytest.raises(OSError):
        Conn(s.port)
    s.stop()
    # the server closed those connections first (time_wait on its side): SO_REUSEADDR lets a
    # restart bind the same port at once
    r = Server("--port", str(s.port))  # later flags win
    assert r.port == s.port
    assert r.stop() == 0


@fake_only
def test_second_signal_cancels():
    s = Server("--drain-timeout-ms", "20000")
    mid = model_id(s.port)
    c = Conn(s.port)
    c.send(http("POST", "/v1/chat/completions",
                chat_body(mid, "[[tokens=500]][[delay=20]]", stream=True, max_tokens=500, enable_thinking=False)))
    c.read_until(b"w0")
    t0 = time.time()
    s.proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    s.proc.send_signal(signal.SIGINT)
    body = c.read_until(STREAM_END)
    assert b"server_shutting_down" in body  # the stream ends with an error frame
    assert s.proc.wait(10) == 0 and time.time() - t0 < 5
    s.stop()


def run_cli(args, env=None, cwd=ROOT, timeout=20):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(server_cmd()[:1] + args, capture_output=True, text=True, env=e, cwd=cwd, timeout=timeout)


def test_flags_errors():
    model = server_cmd()[1:]
    for args, msg in [
        (["--bogus"], "unknown option '--bogus'"),
        (["--port", "70000"], "missing or bad value for --port"),
        (["--port"], "missing or bad value for --port"),
        (["--prefill-chunk", "100"], "--prefill-chunk"),
        (["--temperature", "3"], "--temperature"),
        (["--kv-dtype", "fp4"], "--kv-dtype"),
        (["--spec", "mtp"], "--spec mtp needs --draft-tokens"),
        (["--draft-tokens", "3"], "--draft-tokens needs --spec"),
        (["--spec", "mtp", "--draft-tokens", "9"], "1..5"),
        (["--cors=yes"], "--cors takes no value"),
        (["--api-key", ""], "--api-key: the key is empty"),
        (["--allowed-hosts", ","], "missing or bad value for --allowed-hosts"),
        (["--no-prefix-reuse", "--host-kv-mib", "1"], "--no-prefix-reuse cannot be combined with --host-kv-mib"),
        (["--max-concurrency", "4"], "--max-concurrency is not supported yet" if FAKE else None),
        (["--max-concurrency", "65"], "missing or bad value for --max-concurrency (1..64)"),
        (["--response-store-max-records", "-1"], "--response-store-max-records"),
        (["--vision"], "--vision is not supported yet" if FAKE else None),
        (["--kv-dtype", "fp8"], "--kv-dtype fp8 is not supported yet" if FAKE else None),
        (["--host-kv-mib", "64"], "--host-kv-mib is not supported yet" if FAKE else None),
    ]:
        if msg is None:  # the real engine may support it: the server would start and serve
            continue
        r = run_cli(model + args)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith("ninfer-serve: error: ") and msg in r.stderr, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stdout == ""
    r = run_cli([])
    assert r.returncode == 1 and "no model given" in r.stderr
    r = run_cli(["--help"])
    assert r.returncode == 0 and "--max-pending-requests" in r.stdout and "--spec mtp|dflash" in r.stdout
    if FAKE:
        r = run_cli(["/no/such/model.ninfer"])
        assert r.returncode == 1 and r.stderr == "ninfer-serve: error: cannot open /no/such/model.ninfer\n"


CARD_9B = ("models/qwen3_5_9b.ninfer --model-id qwen3.5-9b --max-context 16384 --spec mtp --draft-tokens 3")
CARD_4B = ("models/qwen3_5_4b.ninfer --host 0.0.0.0 --port 8000 --vision --max-context 262144 --kv-capacity 262144 "
           "--default-max-tokens 16384 --max-concurrency 1 --device-state-slots 4 --host-state-slots 4 "
           "--host-kv-mib 8192 --prefill-chunk 4096 --kv-dtype fp8 --spec mtp --lm-head-draft --draft-tokens 3 "
           "--top-k 20 --top-p 0.95 --temperature 0.01 --preserve-thinking --model-id Qwen3.5-4B")


@pytest.mark.parametrize("card", [CARD_9B, CARD_4B])
def test_model_card_commands_parse(tmp_path, card):
    # verbatim: every flag parses; what is not built yet is named in one line, exit 1
    (tmp_path / "models").mkdir()
    for f in ("qwen3_5_9b.ninfer", "qwen3_5_4b.ninfer"):
        (tmp_path / "models" / f).write_bytes(b"")
    r = run_cli(card.split(), cwd=tmp_path)
    if r.returncode != 0:
        assert re.fullmatch(r"ninfer-serve: error: (--[a-z-]+( \S+)? is not supported yet|.*\.ninfer.*)\n", r.stderr), r.stderr
    if FAKE:
        assert r.returncode == 1 and r.stderr == "ninfer-serve: error: --spec mtp is not supported yet\n"
        # with every feature built, the same command starts (on loopback and a free port here)
        args = card.replace("--host 0.0.0.0 --port 8000", "").split()
        s = Server(*args, cmd=[FAKE_BIN], env={"SERVE_FAKE_FEATURES": "all"}, cwd=tmp_path)
        try:
            name = re.search(r"--model-id (\S+)", card).group(1)
            assert model_id(s.port) == name
            assert "max context %s" % re.search(r"--max-context (\d+)", card).group(1) in s.text()
        finally:
            assert s.stop() == 0
