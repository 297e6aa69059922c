"""test_structured.py - structured output through the server, as a user asks
for it with the official openai client, on the real SmolLM2 model and its
drafter:

- response_format json_object and json_schema: every answer that ends parses
  and validates (a validator of the supported subset below, written from the
  JSON Schema text, not from the engine), over several schemas and seeds;
- the speculative answer equals the classic one (block_size 1), greedy and
  sampled with a seed, and the streamed answer equals the non-streamed one;
- chat.completions.parse with a pydantic model gives the parsed object;
- unsupported schema keywords are a 400 naming the keyword, never ignored.
The model file is an asset: missing, it fails under CI=true and skips
elsewhere.
"""
import json
import os
import subprocess
import sys
import tempfile

from testlib import check, finish, missing
from test_smollm2 import DRAFT, MODEL, start_server

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "null"}]},
    },
    "required": ["name", "age", "pets", "nickname"],
    "additionalProperties": False,
}
WEATHER = {
    "$defs": {"day": {"type": "object", "properties": {
        "day": {"enum": ["mon", "tue", "wed"]}, "sunny": {"type": "boolean"},
        "temp": {"type": "number"}}, "required": ["day", "sunny", "temp"],
        "additionalProperties": False}},
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16},
                   "days": {"type": "array", "items": {"$ref": "#/$defs/day"},
                            "minItems": 1, "maxItems": 2}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
SCHEMAS = [("person", PERSON, "Describe a person called Ann as JSON."),
           ("weather", WEATHER, "Give the weather forecast for Paris as JSON.")]


def valid(v, s, root):
    """The subset the server supports, from the JSON Schema definitions."""
    if "$ref" in s:
        return valid(v, root["$defs"][s["$ref"].split("/")[-1]], root)
    if "anyOf" in s:
        return any(valid(v, b, root) for b in s["anyOf"])
    if "enum" in s:
        return any(v == e and type(v) is type(e) for e in s["enum"])
    t = s.get("type")
    if t == "object":
        if not isinstance(v, dict) or any(k not in v for k in s.get("required", [])):
            return False
        props = s.get("properties", {})
        if s.get("additionalProperties") is False and any(k not in props for k in v):
            return False
        return all(valid(v[k], props[k], root) for k in v if k in props)
    if t == "array":
        return isinstance(v, list) and s.get("minItems", 0) <= len(v) <= s.get("maxItems", 1 << 30) \
            and all(valid(x, s.get("items", {}), root) for x in v)
    if t == "string":
        return isinstance(v, str) and s.get("minLength", 0) <= len(v) <= s.get("maxLength", 1 << 30)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "null":
        return v is None
    return True


def ask(c, model, prompt, fmt, **kw):
    return c.chat.completions.create(model=model, max_tokens=120, response_format=fmt,
                                     messages=[{"role": "user", "content": prompt}], **kw)


def schema_checks(c, model):
    ended = 0
    for name, schema, prompt in SCHEMAS:
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                      "strict": True}}
        for seed in (None, 1, 2, 3):
            kw = {"temperature": 0} if seed is None else {"temperature": 0.8, "seed": seed}
            r = ask(c, model, prompt, fmt, **kw)
            text, fin = r.choices[0].message.content, r.choices[0].finish_reason
            if fin == "stop":
                ended += 1
                try:
                    v = json.loads(text)
                except ValueError:
                    v = None
                check(v is not None and valid(v, schema, schema),
                      f"{name} seed {seed}: the answer validates: {text!r}")
            classic = ask(c, model, prompt, fmt, extra_body={"block_size": 1}, **kw)
            check(classic.choices[0].message.content == text,
                  f"{name} seed {seed}: speculative equals classic: {text!r} vs "
                  f"{classic.choices[0].message.content!r}")
        parts = []
        for ch in c.chat.completions.create(model=model, max_tokens=120, response_format=fmt,
                                            temperature=0, stream=True,
                                            messages=[{"role": "user", "content": prompt}]):
            if ch.choices and ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
        r = ask(c, model, prompt, fmt, temperature=0)
        check("".join(parts) == r.choices[0].message.content, f"{name}: stream equals whole")
    check(ended >= 6, f"{ended} of 8 schema answers ended within 120 tokens")
    for seed in (4, 5):
        r = ask(c, model, "List three fruits as JSON.", {"type": "json_object"},
                temperature=0.8, seed=seed)
        if r.choices[0].finish_reason == "stop":
            try:
                v = json.loads(r.choices[0].message.content)
            except ValueError:
                v = None
            check(isinstance(v, dict), f"json_object seed {seed}: an object: "
                  f"{r.choices[0].message.content!r}")
    r = c.completions.create(model=model, prompt="A JSON list of colors:", max_tokens=64,
                             temperature=0, extra_body={"response_format": {
                                 "type": "json_schema", "json_schema": {"name": "c", "schema": {
                                     "type": "array", "items": {"type": "string",
                                                                "maxLength": 10},
                                     "maxItems": 4}}}})
    if r.choices[0].finish_reason == "stop":
        v = json.loads(r.choices[0].text)
        check(isinstance(v, list) and len(v) <= 4, f"completions: a list: {r.choices[0].text!r}")


def parse_checks(c, model):
    from pydantic import BaseModel

    class Pet(BaseModel):
        name: str
        kind: str
        legs: int

    r = c.chat.completions.parse(model=model, max_tokens=160, temperature=0, response_format=Pet,
                                 messages=[{"role": "user", "content": "Describe a pet dog."}])
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "stop" and isinstance(m.parsed, Pet),
          f"parse: a Pet comes back: {m.content!r}")


def refusal_checks(c, model, url):
    import openai
    for schema, word in (({"type": "string", "pattern": "^a+$"}, "pattern"),
                         ({"type": "number", "minimum": 0}, "minimum"),
                         ({"oneOf": [{"type": "string"}]}, "oneOf")):
        try:
            ask(c, model, "hi", {"type": "json_schema", "json_schema": {"name": "x",
                                                                         "schema": schema}})
            check(False, f"{word}: refused")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            check(word in str(e) and body.get("param") == "response_format",
                  f"{word}: 400 names it and param response_format: {e}")
    for fmt in ({"type": "xml"}, {"type": "json_schema"}, "json"):
        try:
            ask(c, model, "hi", fmt)
            check(False, f"response_format {fmt!r}: refused")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            check(body.get("param") == "response_format", f"response_format {fmt!r}: 400: {e}")


def main():
    if not os.path.exists(MODEL):
        missing(f"{MODEL} (make model)")
        return finish()
    import openai
    with tempfile.TemporaryDirectory(prefix="dflash-struct-") as tmp, \
            open(os.path.join(tmp, "serve.log"), "w") as log:
        p, url = start_server(log)
        try:
            check(url, "serve reports its address")
            if not url:
                return finish()
            c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
            model = c.models.list().data[0].id
            refusal_checks(c, model, url)
            schema_checks(c, model)
            parse_checks(c, model)
        finally:
            p.terminate()
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
