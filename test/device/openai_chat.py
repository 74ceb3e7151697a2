"""one openai sdk chat against a running ninfer-serve (the card's serve command): prints the
reply's start, the finish reason and usage (with usage.speculative). usage: openai_chat.py PORT MODEL"""
import sys, time
import openai

port, model = sys.argv[1], sys.argv[2]
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
t = time.time()
r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
                              max_tokens=64, temperature=0)
print("openai chat: %.2f s, finish %s, content %r" % (time.time() - t, r.choices[0].finish_reason, (r.choices[0].message.content or "")[:80]))
u = r.usage.model_dump()
print("usage:", {k: u[k] for k in ("prompt_tokens", "completion_tokens")}, "speculative:", u.get("speculative"))
assert u.get("speculative", {}).get("backend") == "mtp", u
s = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to five."}], max_tokens=32, stream=True,
                              stream_options={"include_usage": True})
n = 0
for ch in s:
    n += 1
    if ch.usage: print("stream: %d chunks, usage.speculative %s" % (n, ch.usage.model_dump().get("speculative")))
