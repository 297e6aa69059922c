#!/usr/bin/env python3
"""Chat templates against transformers: every template in
../shared/assets/chat_templates/real/ renders several conversations (system
and user, multi-turn with reasoning, tools with a tool call and its result,
content as a list of parts, enable_thinking on and off, the generation
prompt on and off) with transformers' own renderer (render_jinja_template,
jinja2's sandbox with transformers' settings) and with `dflash template`;
the texts must be equal byte for byte. Where transformers raises, dflash must
fail too, and with the template's message for raise_exception.

strftime_now reads one fixed clock on both sides (SOURCE_DATE_EPOCH).
Prints each template's pass count; DFLASH_TEMPLATE=NAME runs one template."""
import datetime
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import check, finish, missing  # noqa: E402

shared = os.environ.get("DFLASH_SHARED", "../shared")
dflash = os.environ.get("DFLASH_BIN", "build/dflash")
NOW = 1752000000  # 2025-07-08, a fixed clock for strftime_now
BOS, EOS = "<|bos|>", "<|eos|>"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]
SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "What is 2+2? Answer with \"four\" — d'accord?"}
A1 = {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."}
A1_THINK = {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"}
U2 = {"role": "user", "content": "  And 3+3?\n"}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
          "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}
UW = {"role": "user", "content": "What's the weather in Paris?"}
A_END = {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."}
PARTS = {"role": "user", "content": [{"type": "text", "text": "Describe this:"},
                                     {"type": "text", "text": "a cat."}]}

# name, messages, tools, add_generation_prompt, kwargs
CASES = [
    ("system+user", [SYS, U1], None, True, {}),
    ("system+user no-gen", [SYS, U1], None, False, {}),
    ("user only", [U1], None, True, {}),
    ("multi-turn reasoning", [SYS, U1, A1, U2], None, True, {}),
    ("multi-turn think tags", [U1, A1_THINK, U2], None, True, {}),
    ("closed conversation", [SYS, U1, A1], None, False, {}),
    ("thinking off", [SYS, U1], None, True, {"enable_thinking": False}),
    ("thinking on", [U1, A1, U2], None, True, {"enable_thinking": True}),
    ("tools", [SYS, UW], TOOLS, True, {}),
    ("tool call and result", [UW, CALL, RESULT], TOOLS, True, {}),
    ("tool round trip", [SYS, UW, CALL, RESULT, A_END, U2], TOOLS, True, {"enable_thinking": False}),
    ("content parts", [PARTS], None, True, {}),
]


class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.fromtimestamp(NOW, tz)


def reference(tmpl, msgs, tools, gen, kwargs):
    """(text, None) or (None, (raise_exception message or None))."""
    import jinja2
    from transformers.utils import chat_template_utils as ctu
    ctu.datetime = FixedClock
    try:
        out, _ = ctu.render_jinja_template(conversations=[msgs], tools=tools, chat_template=tmpl,
                                           add_generation_prompt=gen, bos_token=BOS,
                                           eos_token=EOS, **kwargs)
        return out[0], None
    except Exception as e:  # noqa: BLE001 - any failure of the oracle is an expected failure
        raised = type(e) is jinja2.exceptions.TemplateError
        return None, (str(e) if raised else None, f"{type(e).__name__}: {e}")


def ours(path, msgs, tools, gen, kwargs, tmp):
    mf, tf = os.path.join(tmp, "m.json"), os.path.join(tmp, "t.json")
    with open(mf, "w") as f:
        json.dump(msgs, f)
    cmd = [dflash, "template", "--template", path, "--messages", mf, "--bos", BOS, "--eos", EOS,
           "--kwargs", json.dumps(kwargs)]
    if tools is not None:
        with open(tf, "w") as f:
            json.dump(tools, f)
        cmd += ["--tools", tf]
    if gen:
        cmd.append("--add-generation-prompt")
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(NOW))
    r = subprocess.run(cmd, capture_output=True, env=env, timeout=60)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", "replace")


def main():
    try:
        import transformers.utils.chat_template_utils  # noqa: F401
    except ImportError:
        missing("transformers (the venv, scripts/deps.sh)")
        return finish()
    folder = os.path.join(shared, "assets", "chat_templates", "real")
    if not os.path.isdir(folder):
        missing(folder)
        return finish()
    if not os.access(dflash, os.X_OK):
        missing(dflash)
        return finish()
    only = os.environ.get("DFLASH_TEMPLATE")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".jinja"))
    names = [n for n in names if not only or only in n]
    check(len(names) >= (1 if only else 50), f"{len(names)} templates in {folder}")
    all_ok = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tmpl = f.read()
            ok = 0
            for case, msgs, tools, gen, kwargs in CASES:
                want, err = reference(tmpl, msgs, tools, gen, kwargs)
                rc, got, stderr = ours(path, msgs, tools, gen, kwargs, tmp)
                what = f"{name} [{case}]"
                if want is not None:
                    good = rc == 0 and got == want.encode()
                    if not good:
                        g = got.decode("utf-8", "replace")
                        i = next((k for k in range(min(len(g), len(want))) if g[k] != want[k]),
                                 min(len(g), len(want)))
                        detail = (stderr.strip() if rc else
                                  f"differs at char {i}: got {g[max(0, i - 60):i + 60]!r} "
                                  f"want {want[max(0, i - 60):i + 60]!r}")
                        what += f": {detail}"
                else:
                    msg, desc = err
                    good = rc != 0 and (msg is None or f"error: {msg}" in stderr)
                    if not good:
                        what += f": transformers raised {desc[:200]!r}; we gave rc={rc} {stderr.strip()[:200]!r}"
                ok += check(good, what)
            all_ok += ok == len(CASES)
            print(f"{name}: {ok}/{len(CASES)}", flush=True)
    print(f"templates passing every case: {all_ok}/{len(names)}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
