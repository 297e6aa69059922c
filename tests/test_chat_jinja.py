#!/usr/bin/env python3
"""Chat renders in C against Python's jinja2, rendering the real templates
the way transformers' apply_chat_template does (sandboxed environment,
trim_blocks, lstrip_blocks, loopcontrols, tojson with ensure_ascii=False).

Templates: Qwen3-0.6B, Qwen2.5-7B-Instruct and Llama-3.1-8B-Instruct from
../shared/assets/chat_templates, and a plain ChatML template written here.
Conversations cover system prompts (first, later, absent), multi-turn
reasoning (<think> kept or dropped), tool results, whitespace that templates
trim, non-ASCII text, generation prompt on/off and enable_thinking. The
renders go to a JSON file that test_tokenizer_chat --cases compares byte for
byte with dfl_chat_render_text.
"""
import json
import os
import subprocess
import sys
import tempfile

shared = os.environ.get("DFLASH_SHARED", "../shared")
build = os.environ.get("DFLASH_BUILD", "build")
ci = os.environ.get("CI") == "true"


def skip(why):
    if ci:
        print(f"FAIL: {why} (required under CI)")
        print("0 passed, 1 failed")
        sys.exit(1)
    print(f"skip: {why}")
    print("0 passed, 0 failed")
    sys.exit(0)


try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    skip("python3-jinja2 is not installed")


def compile_template(text):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(text)


def M(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "user": [M("user", "Hello!")],
    "system+user": [M("system", "You are terse."), M("user", "Hi")],
    "multi-think": [M("system", "You are a helpful assistant."), M("user", "What is 2+2?"),
                    M("assistant", "<think>\nTwo and two.\n</think>\n\n4"), M("user", "And 3+3?")],
    "last-assistant-think": [M("user", "Q1"), M("assistant", "A1"), M("user", "Q2"),
                             M("assistant", "<think>\nr2\n</think>\n\nA2")],
    "think-whitespace": [M("user", "x"), M("assistant", "\n<think>\n\n a \n\n</think>\n\n\nb\n"),
                         M("user", "y"), M("assistant", "pre<think>r</think>post</think>z")],
    "tools": [M("user", "Weather in Paris?"), M("assistant", "Let me check."),
              M("tool", '{"temp": 20, "note": "sunny\nwarm"}'), M("tool", '{"hum": 5}'),
              M("assistant", "It is 20 degrees.")],
    "tool-response-user": [M("user", "q"), M("assistant", "<think>t</think>a"),
                           M("user", "<tool_response>x</tool_response>")],
    "late-system": [M("user", "a"), M("system", "be nice"), M("user", "b")],
    "whitespace": [M("system", "  sys  \n"), M("user", "\n hi \t"), M("assistant", " ok "),
                   M("user", "\u3000wide\u00a0")],
    "unicode": [M("user", "你好 😀 naïve"), M("assistant", "Привет"), M("user", "مرحبا")],
    "empty": [M("user", "")],
}

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def main():
    tdir = os.path.join(shared, "assets", "chat_templates")
    templates = {}
    for name, file in [("qwen3", "Qwen-Qwen3-0.6B.jinja"), ("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"),
                       ("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja")]:
        p = os.path.join(tdir, file)
        if not os.path.exists(p):
            skip(f"{p} missing")
        templates[name] = open(p, encoding="utf-8").read()
    templates["chatml"] = CHATML
    bos = {"llama3.1": "<|begin_of_text|>"}
    cases = []
    for name, text in templates.items():
        tmpl = compile_template(text)
        for label, msgs in CONVERSATIONS.items():
            for gen in (True, False):
                for think in ((None, False, True) if name == "qwen3" else (None,)):
                    kw = {} if think is None else {"enable_thinking": think}
                    out = tmpl.render(messages=msgs, add_generation_prompt=gen,
                                      bos_token=bos.get(name, ""), eos_token="", tools=None,
                                      documents=None, **kw)
                    cases.append({"label": f"{name} {label} gen={gen} think={think}",
                                  "template": text, "name": None, "bos": bos.get(name, ""),
                                  "messages": msgs, "add_generation_prompt": gen,
                                  "enable_thinking": think, "expected": out})
    prog = os.path.join(build, "test_tokenizer_chat")
    if not os.path.exists(prog):
        print(f"FAIL: {prog} not built")
        print("0 passed, 1 failed")
        sys.exit(1)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
        path = f.name
    try:
        r = subprocess.run([prog, "--cases", path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
