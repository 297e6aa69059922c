#!/usr/bin/env python3
"""test_server_tools.py - tool calls through `dflash serve` and the official
openai client, on a real model (SmolLM2-135M-Instruct, build/smollm2) given
Qwen3's, Qwen3-Coder's and Llama 3.1's chat templates (--chat-template-file):

- POST /apply-template renders OpenAI-shaped conversations (tools, assistant
  tool_calls with arguments as JSON strings and content null, tool results)
  exactly as transformers' renderer renders the same conversations with the
  documented mapping (arguments parsed into objects, null content as "");
- a few-shot conversation makes the model call get_weather, in Qwen3's JSON
  and in Qwen3-Coder's XML. With tool_choice
  "none" the answer is the raw text (same prompt, greedy); with "auto" it is
  what a reference parser makes of that text: tool_calls with fresh ids,
  content null, finish_reason "tool_calls". The streamed deltas add up to the
  same message, in OpenAI's delta shape. The returned message and a tool
  result go back in a follow-up request;
- tool_choice "required" and a named function are accepted;
- bad tools, tool_choice, parallel_tool_calls and tool messages get a 400
  that names the field.
The model and the templates are assets: missing, they fail under CI=true and
skip elsewhere."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import check, finish, missing  # noqa: E402

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("DFLASH_BIN") or os.path.join(SRC, "build", "dflash")
SHARED = os.environ.get("DFLASH_SHARED") or os.path.join(SRC, "..", "shared")
MODEL = os.environ.get("DFLASH_SMOLLM2") or os.path.join(
    SRC, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEMPLATES = os.path.join(SHARED, "assets", "chat_templates", "real")
TEMPLATE = os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")
# Llama 3.1 writes arguments with tojson only, and refuses two calls in a message.
LLAMA = os.path.join(TEMPLATES, "meta-llama-Llama-3.1-8B-Instruct.jinja")
# Qwen3-Coder iterates over the arguments' items, and calls in XML (family qwen-xml).
CODER = os.path.join(TEMPLATES, "Qwen3-Coder.jinja")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.", "strict": True,
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
TOOLS = [WEATHER, ADD]


def call(cid, name, args):
    """Arguments as OpenAI sends them: compact JSON text (Qwen3's template writes a
    string as it is and an object through tojson, so the two differ)."""
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, separators=(",", ":"))}}


SYS = {"role": "system", "content": "You are a helpful assistant."}
UW = {"role": "user", "content": "What's the weather in Paris? And 2+3?"}
CALL1 = {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_weather", {"city": "Paris"})]}
CALL2 = {"role": "assistant", "content": "Checking both.", "tool_calls": [
    call("call_a", "get_weather", {"city": "Paris"}), call("call_b", "add", {"a": 2, "b": 3.5})]}
R1 = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5}"}
RA = {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "sunny"}
RB = {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "5.5"}]}
A_END = {"role": "assistant", "content": "It is 21.5 °C in Paris, and 2+3 is 5."}
U2 = {"role": "user", "content": "Thanks!"}

# name, messages, tools, chat_template_kwargs
RENDER_CASES = [
    ("tool round trip", [SYS, UW, CALL1, R1, A_END, U2], TOOLS, {}),
    ("two calls, two results", [UW, CALL2, RA, RB], TOOLS, {}),
    ("thinking off", [SYS, UW, CALL1, R1], TOOLS, {"enable_thinking": False}),
    ("history without tools", [UW, CALL1, R1, A_END, U2], None, {}),
]


def for_template(msgs):
    """The documented mapping: arguments as objects, null content as "", parts joined."""
    out = []
    for m in msgs:
        m = json.loads(json.dumps(m))
        c = m.get("content")
        m["content"] = "" if c is None else c if isinstance(c, str) else "\n".join(p["text"] for p in c)
        for tc in m.get("tool_calls", []):
            tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        out.append(m)
    return out


def special_tokens():
    """The model's BOS and EOS texts, as the server passes them to templates."""
    import gguf
    r = gguf.GGUFReader(MODEL)

    def scalar(key):
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])
    toks = r.fields["tokenizer.ggml.tokens"]
    text = lambda i: bytes(toks.parts[toks.data[i]]).decode()  # noqa: E731
    return text(scalar("tokenizer.ggml.bos_token_id")), text(scalar("tokenizer.ggml.eos_token_id"))


def reference(tmpl, msgs, tools, kwargs, bos, eos):
    """(text, None), or (None, the template's exception message)."""
    import jinja2
    from transformers.utils import chat_template_utils as ctu
    try:
        out, _ = ctu.render_jinja_template(conversations=[for_template(msgs)], tools=tools,
                                           chat_template=tmpl, add_generation_prompt=True,
                                           bos_token=bos, eos_token=eos, **kwargs)
    except jinja2.exceptions.TemplateError as e:
        return None, str(e)
    return out[0], None


class Server:
    def __init__(self, log, template):
        self.log = log
        self.p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", "0",
                                   "-t", "2", "-c", "2048", "--chat-template-file", template],
                                  stdout=log, stderr=subprocess.STDOUT)
        self.url = None
        for _ in range(1200):
            if not self.url:
                m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", open(log.name).read())
                self.url = m and m.group(1)
            if self.url and self.get("/health")[0] == 200:
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("the server did not start: " + open(log.name).read()[-2000:])

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def check_render(srv, tmpl):
    bos, eos = special_tokens()
    for name, msgs, tools, kwargs in RENDER_CASES:
        body = {"messages": msgs, "chat_template_kwargs": kwargs}
        if tools:
            body["tools"] = tools
        st, got = srv.post("/apply-template", body)
        want, raised = reference(tmpl, msgs, tools, kwargs, bos, eos)
        if raised:
            check(st == 400 and raised in got["error"]["message"] and got["error"]["param"] == "messages",
                  f"render [{name}]: transformers raised {raised!r}; we gave {st} {got}")
            continue
        ok = check(st == 200 and got.get("prompt") == want, f"render [{name}]: {st} {got}\nwant {want!r}")
        if not ok:
            continue
        # arguments given as objects render the same; tool_choice none still shows the tools
        objs = for_template(msgs)
        for m in objs:
            m["content"] = m["content"] if m["role"] != "assistant" or m["content"] else None
        st2, got2 = srv.post("/apply-template", dict(body, messages=objs))
        check(st2 == 200 and got2.get("prompt") == want, f"render [{name}] with object arguments: {got2}")
        if tools:
            st3, got3 = srv.post("/apply-template", dict(body, tool_choice="none"))
            check(st3 == 200 and got3.get("prompt") == want, f"render [{name}] tool_choice none: {got3}")


# Four questions answered by a call each: the model goes on in the same way.
FEW_SHOT = []
for i, city in enumerate(["Paris", "Rome", "Madrid", "Oslo"]):
    FEW_SHOT += [{"role": "user", "content": f"Weather in {city}?"},
                 {"role": "assistant", "content": None,
                  "tool_calls": [call(f"call_{i}", "get_weather", {"city": city})]}]
FEW_SHOT.append({"role": "user", "content": "Weather in Berlin?"})


def parse_hermes(raw, names):
    """Qwen3 / Hermes calls: <tool_call>{json}</tool_call> blocks naming a tool."""
    calls, content = [], raw
    for m in re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", raw, re.S):
        try:
            o = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(o, dict) and o.get("name") in names and isinstance(o.get("arguments"), dict):
            calls.append((o["name"], o["arguments"]))
            content = content.replace(m.group(0), "", 1)
    return content.strip() or None, calls


def parse_xml(raw, names):
    """Qwen3-Coder calls: <tool_call><function=N><parameter=K>\nV\n</parameter>...</function>,
    the close tag optional at the end; string parameters only here (get_weather's city)."""
    calls, content = [], raw
    for m in re.finditer(r"<tool_call>\s*<function=([^>]*)>(.*?)</function>\s*(?:</tool_call>|$)", raw, re.S):
        args = dict(re.findall(r"<parameter=([^>]*)>\n?(.*?)\n?</parameter>", m.group(2), re.S))
        if m.group(1) in names:
            calls.append((m.group(1), args))
            content = content.replace(m.group(0), "", 1)
    return content.strip() or None, calls


def check_calls(srv, reference_parse):
    import openai
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    common = dict(model=model, messages=FEW_SHOT, tools=TOOLS, temperature=0, max_tokens=48)
    raw = client.chat.completions.create(**common, tool_choice="none").choices[0]
    check(raw.message.tool_calls is None and raw.finish_reason in ("stop", "length"),
          f"tool_choice none: no calls ({raw})")
    want_content, want_calls = reference_parse(raw.message.content, {"get_weather", "add"})
    check(len(want_calls) >= 1, f"the few-shot prompt makes the model call a tool: {raw.message.content!r}")

    r = client.chat.completions.create(**common)
    ch = r.choices[0]
    got_calls = [(c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls or []]
    check(got_calls == want_calls, f"auto: calls {got_calls} want {want_calls}")
    check(ch.message.content == want_content, f"auto: content {ch.message.content!r} want {want_content!r}")
    check(ch.finish_reason == ("tool_calls" if want_calls else "stop"), f"finish_reason {ch.finish_reason}")
    ids = [c.id for c in ch.message.tool_calls or []]
    check(all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids) and len(set(ids)) == len(ids),
          f"call ids {ids}")
    check(all(c.type == "function" for c in ch.message.tool_calls or []), "type function")

    # streamed: the deltas add up to the same message
    text, calls, finish, first = "", {}, None, {}
    for chunk in client.chat.completions.create(**common, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                first[tc.index] = tc
                calls[tc.index] = {"name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    streamed = [(calls[k]["name"], json.loads(calls[k]["arguments"])) for k in sorted(calls)]
    check(streamed == got_calls, f"stream: calls {streamed} want {got_calls}")
    check((text or None) == ch.message.content, f"stream: content {text!r} want {ch.message.content!r}")
    check(finish == ch.finish_reason, f"stream: finish_reason {finish}")
    check(all(f.id and f.type == "function" and f.function.name and f.function.arguments == ""
              for f in first.values()), f"a call's first delta: id, type, name, empty arguments: {first}")

    # the returned message and a result go back
    follow = FEW_SHOT + [ch.message.model_dump(exclude_none=True)]
    follow += [{"role": "tool", "tool_call_id": i, "content": "18C"} for i in ids]
    r2 = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, temperature=0, max_tokens=4)
    check(r2.choices[0].message is not None, "a follow-up with the calls and their results")

    # required / named: the sampler makes the answer exactly one call (speculative or not)
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        for block in (None, 1):
            extra = {"extra_body": {"block_size": block}} if block else {}
            r3 = client.chat.completions.create(**dict(common, max_tokens=96), tool_choice=choice,
                                                parallel_tool_calls=False, **extra)
            c3 = r3.choices[0]
            tc = c3.message.tool_calls or []
            names = ("add",) if isinstance(choice, dict) else ("get_weather", "add")
            check(c3.finish_reason == "tool_calls" and len(tc) == 1 and tc[0].function.name in names
                  and isinstance(json.loads(tc[0].function.arguments), dict),
                  f"tool_choice {choice} block {block}: one call: {c3.finish_reason} {c3.message}")
            got3 = (c3.message.content, [(t.function.name, t.function.arguments) for t in tc])
            if block:
                check(got3 == spec3, f"tool_choice {choice}: classic {got3} equals speculative {spec3}")
            spec3 = got3


BAD = [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": []}, "tools"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools[0]"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]}, "tools[0].function"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": 1}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"messages": [UW, CALL1, {"role": "tool", "content": "x"}]}, "messages[2].tool_call_id"),
    ({"messages": [UW, {"role": "assistant", "tool_calls": [call("c", "f", {})] + ["x"]}]},
     "messages[1].tool_calls[1]"),
    ({"messages": [UW, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0]"),
    ({"messages": [UW, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[1].tool_calls[0]"),
    ({"messages": [dict(UW, tool_calls=[call("c", "f", {})])]}, "messages[0].tool_calls"),
    ({"messages": [UW, {"role": "assistant", "tool_calls": {"id": "c"}}]}, "messages[1].tool_calls"),
    ({"messages": [{"role": "tool", "tool_call_id": "c"}]}, "messages[0]"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0]"),
]


def check_errors(srv):
    for extra, param in BAD:
        body = dict({"messages": [UW], "max_tokens": 1}, **extra)
        st, got = srv.post("/v1/chat/completions", body)
        err = got.get("error", {}) if isinstance(got, dict) else {}
        check(st == 400 and err.get("param") == param and err.get("type") == "invalid_request_error"
              and err.get("message"), f"{json.dumps(extra)[:120]}: want 400 param {param}, got {st} {got}")


def main():
    try:
        import openai  # noqa: F401
        import gguf  # noqa: F401
        import transformers.utils.chat_template_utils  # noqa: F401
    except ImportError as e:
        missing(f"Python package {e.name} (the venv, scripts/deps.sh)")
        return finish()
    for path in (MODEL, TEMPLATE, LLAMA, CODER):
        if not os.path.exists(path):
            missing(path)
            return finish()
    parsers = {TEMPLATE: parse_hermes, CODER: parse_xml}
    for template in (TEMPLATE, CODER, LLAMA):
        with open(template, encoding="utf-8") as f:
            tmpl = f.read()
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
            srv = Server(log, template)
            try:
                check_render(srv, tmpl)
                if template in parsers:
                    check_calls(srv, parsers[template])
                if template == TEMPLATE:
                    check_errors(srv)
            finally:
                srv.stop()
            out = open(log.name).read()
            check(srv.p.returncode == 0 and "Sanitizer" not in out,
                  f"clean exit: {srv.p.returncode} {out[-1500:]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
