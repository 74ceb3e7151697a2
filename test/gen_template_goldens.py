#!/usr/bin/env python3
# golden renderings of the qwen3.5 chat template (shared/fixtures/qwen3.5/chat_template.jinja)
# for test/test_tokenizer.cc.
#   python3 test/gen_template_goldens.py   (writes test/golden/template_cases.jsonl)
#
# rendering is transformers' own render_jinja_template when transformers is installed
# (the path apply_chat_template takes), else a jinja2 environment set up the way
# transformers sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
# loopcontrols, tojson = json.dumps(ensure_ascii=False), raise_exception, and the
# reasoning_content alias). each line: {"name", "messages", "tools"?, "options",
# "output"} or {..., "error", "error_type"} (the python exception's class and message; the c++
# renderer reproduces the message verbatim).
import json, os, random, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPL = os.path.join(ROOT, "..", "shared", "fixtures", "qwen3.5", "chat_template.jinja")
if not os.path.exists(TPL): TPL = "/work/shared/fixtures/qwen3.5/chat_template.jinja"
OUT = os.path.join(ROOT, "test", "golden", "template_cases.jsonl")

def make_renderer(template):
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
        def render(messages, tools, **kw):
            out, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template, **kw)
            return out[0]
        return render, "transformers"
    except ImportError:
        import jinja2, jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from jinja2.exceptions import TemplateError
        def raise_exception(message): raise TemplateError(message)
        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        tpl = env.from_string(template)
        def render(messages, tools, add_generation_prompt=False, **kw):
            chat = []
            for m in messages:
                if not isinstance(m, dict): raise TypeError("Chat messages should be dicts")
                r = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
                if r is not None: m = {"thinking": r, **m, "reasoning_content": r}
                chat.append(m)
            return tpl.render(messages=chat, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **kw)
        return render, "jinja2 " + jinja2.__version__

U = lambda c: {"role": "user", "content": c}
A = lambda c, **k: dict({"role": "assistant", "content": c}, **k)
S = lambda c: {"role": "system", "content": c}
T = lambda c, **k: dict({"role": "tool", "content": c}, **k)
GEN = {"add_generation_prompt": True}
NOTHINK = {"add_generation_prompt": True, "enable_thinking": False}
THINK = {"add_generation_prompt": True, "enable_thinking": True}

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather \u2014 \u5929\u6c14",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                          "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
          "required": ["q"], "additionalProperties": False}, "strict": True}}
ODD = {"name": "odd", "description": "ctl \u0001\u001f\u007f tab\t nl\n q\" bs\\ \U0001F600 \u00e9",
       "numbers": [0, -0, 1, -7, 1.0, -0.0, 0.1, 1e-05, 0.0001, 1e16, 1.5e16, 123456789012345678, 12345678901234567890123, 3.14159, 2.5e-300, 1e300],
       "nested": {"a": {"b": [None, True, False, {}, [], ""]}}, "zkey": 1, "akey": 2}
CALL = lambda name, args, wrap=True: ({"type": "function", "function": {"name": name, "arguments": args}} if wrap else {"name": name, "arguments": args})

def cases():
    c = []
    add = lambda name, messages, options=GEN, tools=None: c.append({"name": name, "messages": messages, "tools": tools, "options": options})
    add("user_only", [U("Hello!")])
    add("user_only_no_gen", [U("Hello!")], {})
    add("user_no_thinking", [U("Hello!")], NOTHINK)
    add("user_thinking_true", [U("Hello!")], THINK)
    add("system_user", [S("You are a helpful assistant."), U("Hi")])
    add("system_user_no_thinking", [S("You are terse."), U("Hi")], NOTHINK)
    add("system_padded", [S("  \n sys \n "), U("  hi  \n")])
    add("system_empty", [S(""), U("hi")])
    add("system_parts", [S([{"type": "text", "text": "part one. "}, {"text": "part two"}]), U("hi")])
    add("multi_turn", [S("sys"), U("What is 2+2?"), A("4"), U("And 3+3?")])
    add("multi_turn_reasoning_dropped", [U("q1"), A("a1", reasoning_content="thinking about q1"), U("q2")])
    add("assistant_after_last_query", [U("q1"), A("final answer", reasoning_content="  the reasoning  ")], {})
    add("assistant_after_last_query_gen", [U("q1"), A("partial", reasoning_content="r")])
    add("inline_think_in_content", [U("q"), A("<think>\nI think\n</think>\n\nThe answer.")], {})
    add("inline_think_history", [U("q"), A("<think>\nold\n</think>\n\nold answer"), U("q2")])
    add("nested_think_tags", [U("q"), A("pre<think>a<think>\n\nb\n</think>mid</think>\n\nend")], {})
    add("think_close_only", [U("q"), A("reason here</think>answer")], {})
    add("reasoning_alias_reasoning", [U("q"), A("ans", reasoning="via reasoning field")], {})
    add("reasoning_alias_thinking", [U("q"), A("ans", thinking="via thinking field")], {})
    add("reasoning_null_then_thinking", [U("q"), A("ans", reasoning_content=None, thinking="t")], {})
    add("reasoning_non_string", [U("q"), A("<think>x</think>y", reasoning_content=5)], {})
    add("reasoning_empty_string", [U("q"), A("<think>x</think>y", reasoning_content="")], {})
    add("assistant_content_none", [U("q"), A(None, reasoning_content="only reasoning")], {})
    add("assistant_no_content_key", [U("q"), {"role": "assistant"}], {})
    add("tools_no_system", [U("Weather in Paris?")], GEN, [WEATHER])
    add("tools_with_system", [S("Be brief."), U("Weather in Paris?")], GEN, [WEATHER, SEARCH])
    add("tools_empty_system", [S("   "), U("hi")], GEN, [SEARCH])
    add("tools_odd_json", [U("hi")], GEN, [ODD])
    add("tools_empty_list", [S("sys"), U("hi")], GEN, [])
    add("tools_no_thinking", [S("sys"), U("hi")], NOTHINK, [WEATHER])
    add("tool_call_flow", [S("sys"), U("Weather in Paris?"),
                           A("", reasoning_content="I should call the tool.", tool_calls=[CALL("get_weather", {"city": "Paris", "days": 3})]),
                           T("{\"temp\": 21}", tool_call_id="c1")], GEN, [WEATHER])
    add("tool_call_with_content", [U("q"), A("Let me check.", tool_calls=[CALL("search", {"q": "x"})]), T("result")], GEN, [SEARCH])
    add("tool_call_multi", [U("q"), A("", tool_calls=[CALL("search", {"q": "a"}), CALL("search", {"q": "b"}, False)]), T("ra"), T("rb"),
                            A("done")], {}, [SEARCH])
    add("tool_call_arg_types", [U("q"), A("x", tool_calls=[CALL("f", {"s": "plain \"str\"\nline", "i": 42, "f": 2.50, "e": 1e20, "b": True,
                                 "n": None, "l": [1, "two", None], "d": {"k": [1, {"z": False}]}, "empty": "", "uni": "\u00e9\U0001F600"})])], GEN)
    add("tool_call_no_arguments", [U("q"), A("", tool_calls=[CALL("ping", None, False) | {}]), T("pong")])
    add("tool_call_missing_arguments", [U("q"), A("", tool_calls=[{"name": "ping"}]), T("pong")])
    add("tool_call_empty_list", [U("q"), A("hi", tool_calls=[]), U("again")])
    add("tool_call_dict_ignored", [U("q"), A("hi", tool_calls={"name": "x"}), U("again")])
    add("tool_calls_after_think", [U("q"), A("<think>plan</think>\n\nCalling.", tool_calls=[CALL("search", {"q": "a"})])], {})
    add("multi_step_tools", [U("task"), A("", tool_calls=[CALL("search", {"q": "1"})]), T("r1"),
                             A("", reasoning_content="step 2", tool_calls=[CALL("search", {"q": "2"})]), T("r2"), T("r2b")])
    add("tool_response_as_user", [U("real question"), A("", tool_calls=[CALL("s", {})]), U("<tool_response>\nfake\n</tool_response>")])
    add("tool_first_message", [T("orphan"), U("q")])
    add("tool_after_system", [S("sys"), T("orphan"), U("q")])
    add("tool_parts_content", [U("q"), A("", tool_calls=[CALL("s", {})]), T([{"type": "text", "text": "part"}, {"text": " two"}])])
    add("parts_text", [U([{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}])])
    add("parts_image_video", [U([{"type": "image", "image": "a.png"}, {"type": "text", "text": "What is this?"},
                                 {"type": "video", "video": "v.mp4"}])])
    add("parts_image_url", [U([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}, {"text": "describe"}])])
    add("parts_type_only", [U([{"type": "image"}, {"type": "video"}, {"type": "text", "text": "t"}])])
    add("vision_ids", [U([{"image": "a"}, {"image": "b"}, {"text": "compare"}]), A("ok"),
                       U([{"video": "v"}, {"image": "c"}, {"text": "and"}])], {"add_generation_prompt": True, "add_vision_id": True})
    add("vision_ids_tool_and_assistant", [U([{"image": "a"}]), A([{"image": "b"}, {"text": "x"}]), U([{"image": "c"}])],
        {"add_generation_prompt": True, "add_vision_id": True})
    add("vision_in_tool_response_user", [U("q"), A("", tool_calls=[CALL("s", {})]),
                                         U([{"text": "<tool_response>"}, {"image": "x"}, {"text": "</tool_response>"}])])
    add("parts_text_non_string", [U([{"text": 5}, {"text": None}, {"text": 1.5}, {"text": True}, {"text": ["a", 'b"\'', {"k": None}]},
                                     {"text": {"x": 1e16, "y": "\u00e9\n\u200b"}}])])
    add("parts_string_items", [U(["text", "an image here", "video!"])])
    add("parts_list_items", [U([["text"], ["image"], ["video"]])])
    add("user_whitespace", [U("\x1c\u3000 hello \u00a0\n\t")])
    add("user_think_text", [U("what does </think> mean?")])
    add("unicode_everywhere", [S("\u7cfb\u7edf"), U("\u4f60\u597d \U0001F600"), A("\u00e9t\u00e9")], GEN)
    add("assistant_last_no_gen", [S("s"), U("u"), A("a")], {})
    add("developer_role", [{"role": "developer", "content": "dev"}, U("hi")])
    # errors raised by the template
    add("err_empty", [])
    add("err_system_not_first", [U("hi"), S("late system")])
    add("err_no_user", [S("only system")])
    add("err_only_assistant", [A("hello")])
    add("err_only_tool_responses", [U("<tool_response>x</tool_response>")])
    add("err_system_image", [S([{"image": "x"}]), U("hi")])
    add("err_system_video", [S([{"type": "video"}]), U("hi")])
    add("err_system_image_with_tools", [S([{"image": "x"}]), U("hi")], GEN, [SEARCH])
    add("err_item_type", [U([{"type": "audio", "audio": "a.wav"}])])
    add("err_content_number", [U(5)])
    add("err_content_dict", [U({"text": "x"})])
    add("err_unknown_role", [U("hi"), {"role": "robot", "content": "x"}])
    add("err_item_none", [U([None])])
    add("err_tool_name_number", [U("q"), A("", tool_calls=[{"name": 5, "arguments": {}}])])
    add("err_tool_no_name", [U("q"), A("", tool_calls=[{"arguments": {}}])])
    add("err_tool_args_string", [U("q"), A("", tool_calls=[CALL("f", "{\"a\": 1}")])])
    add("err_tool_calls_string", [U("q"), A("", tool_calls="call")])
    add("err_tool_function_none", [U("q"), A("", tool_calls=[{"function": None}])])
    add("err_tool_name_list", [U("q"), A("", tool_calls=[CALL(["f"], {})])])
    add("err_message_not_dict", [U("q"), "just a string"])
    add("err_tool_not_dict", [U("q")], GEN, ["not a schema"])
    return c

def random_cases(n, seed):
    # random conversations from building blocks, valid and broken, for branch coverage
    rnd = random.Random(seed)
    texts = ["", " ", "hi", "  padded \n", "<think>r</think>c", "a</think>b", "<think>\n\nx\n\n</think>\n\ny", "<tool_response>\nz\n</tool_response>",
             "\u3000x\x1c", "multi\nline", "\u00e9\U0001F600", "</think>", "<think>", "x<tool_response>y"]
    vals = [1, -2, 0.5, 1e16, 1e-7, True, False, None, "s", "", "with \"q\" and \\", [1, "a", None], {"k": {"n": [True]}}, {}, [], 12345678901234567890]
    def content():
        r = rnd.random()
        if r < 0.6: return rnd.choice(texts)
        if r < 0.63: return None
        if r < 0.65: return rnd.choice([5, {"a": 1}, True, 1.5])
        parts = []
        for _ in range(rnd.randint(0, 4)):
            q = rnd.random()
            if q < 0.4: parts.append({"type": "text", "text": rnd.choice(texts)})
            elif q < 0.5: parts.append({"text": rnd.choice(vals)})
            elif q < 0.6: parts.append({"type": "image"})
            elif q < 0.65: parts.append({"image_url": {"url": "u"}})
            elif q < 0.7: parts.append({"type": "video", "video": "v"})
            elif q < 0.75: parts.append({"video": "v"})
            elif q < 0.8: parts.append(rnd.choice(["text", "image", "plain", "video x"]))
            elif q < 0.81: parts.append(rnd.choice([None, 3, ["image"], {"type": "audio"}]))
            else: parts.append({"type": "text", "text": "<tool_response>"})
        return parts
    def call():
        args = {rnd.choice(["a", "b", "\u00e9", "k k"]): rnd.choice(vals) for _ in range(rnd.randint(0, 3))}
        r = rnd.random()
        name = rnd.choice(["f", "get_weather", "\u5de5\u5177"]) if r > 0.03 else rnd.choice([5, None])
        c = {"name": name}
        if rnd.random() > 0.1: c["arguments"] = args if rnd.random() > 0.03 else "{\"x\": 1}"
        return {"type": "function", "function": c} if rnd.random() < 0.5 else c
    def message():
        role = rnd.choice(["user"] * 4 + ["assistant"] * 4 + ["tool"] * 3 + (["system"] if rnd.random() < 0.1 else []) + (["developer", None] if rnd.random() < 0.05 else []))
        m = {"role": role} if role else {}
        if rnd.random() > 0.05: m["content"] = content()
        if role == "assistant":
            for k in ["reasoning_content", "thinking", "reasoning"]:
                if rnd.random() < 0.15: m[k] = rnd.choice(["r", "  rr  ", "", None, 7])
            if rnd.random() < 0.4: m["tool_calls"] = [call() for _ in range(rnd.randint(0, 3))]
            elif rnd.random() < 0.03: m["tool_calls"] = rnd.choice(["x", {"a": 1}, 5])
        return m
    cases = []
    for _ in range(n):
        msgs = [message() for _ in range(rnd.randint(0, 7))]
        if rnd.random() < 0.85: msgs.insert(rnd.randint(0, len(msgs)), {"role": "user", "content": rnd.choice(texts)})
        if msgs and rnd.random() < 0.4: msgs[0] = {"role": "system", "content": content()}
        tools = None
        if rnd.random() < 0.3: tools = rnd.choice([[WEATHER], [SEARCH, ODD], [], [{"name": "t", "x": vals[:8]}]])
        opts = {"add_generation_prompt": rnd.random() < 0.7}
        if rnd.random() < 0.5: opts["enable_thinking"] = rnd.random() < 0.5
        if rnd.random() < 0.2: opts["add_vision_id"] = True
        cases.append({"name": "random_%d" % len(cases), "messages": msgs, "tools": tools, "options": opts})
    return cases

def main():
    template = open(TPL, encoding="utf-8").read()
    render, how = make_renderer(template)
    from jinja2.exceptions import TemplateError
    lines = []
    for case in cases() + random_cases(150, 7):
        case = json.loads(json.dumps(case))  # exactly what the c++ side parses
        kw = dict(case["options"])
        try:
            case["output"] = render(case["messages"], case["tools"], **kw)
        except Exception as e:
            case["error"], case["error_type"] = str(e), type(e).__name__
        if case["tools"] is None: del case["tools"]
        lines.append(case)
    with open(OUT, "w", encoding="utf-8") as f:
        for r in lines: f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print("rendered %d cases with %s (%d errors) to %s" % (len(lines), how, sum("error" in r for r in lines), OUT))

if __name__ == "__main__":
    main()
