"""common.py - what the server tests share: config from the environment, checks
(tests/testlib.py), raw HTTP helpers for what the openai client hides.

Raw requests run in a thread so that client requests in flight on the event
loop keep going meanwhile."""
import asyncio
import http.client
import inspect
import json
import math
import os
import sys
import time
import types
import urllib.parse

import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testlib  # noqa: E402

BASE = os.environ["SERVER_URL"]  # http://127.0.0.1:PORT
API_KEY = os.environ.get("SERVER_API_KEY") or "none"
client = openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key=API_KEY, max_retries=0, timeout=120)

_NO_DETAIL = object()


def _plain(o):
    return o.model_dump() if hasattr(o, "model_dump") else str(o)


def check(cond, what, detail=_NO_DETAIL):
    if detail is not _NO_DETAIL:
        what = f"{what}: {json.dumps(detail, default=_plain, ensure_ascii=False)}"
    return testlib.check(bool(cond), what)


def summary(name):
    print(f"{name}: ", end="")
    sys.exit(testlib.finish())


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


async def create(api, body, **opts):
    """api.create(**body), the fields the client has no parameter for
    (llama.cpp's and dflash's extensions: ignore_eos, top_k, ...) sent as
    extra_body, since create() takes no unknown keyword arguments."""
    known = inspect.signature(api.create).parameters
    extra = {k: v for k, v in body.items() if k not in known}
    return await api.create(**{k: v for k, v in body.items() if k in known},
                            extra_body=extra or None, **opts)


def chat_request(expect, model, /, **extra):
    """The greedy chat request expect.py's outputs answer (EXPECT's JSON), with extra fields."""
    return {"model": model, "max_tokens": expect["max_tokens"], "temperature": 0,
            "messages": [{"role": "user", "content": expect["chat_prompt"]}],
            "chat_template_kwargs": {"enable_thinking": False}, **extra}


def completion_request(expect, model, /, **extra):
    return {"model": model, "max_tokens": expect["max_tokens"], "temperature": 0,
            "prompt": expect["completion_prompt"], **extra}


def auth_headers(key=None):
    return {"content-type": "application/json", "authorization": f"Bearer {key or API_KEY}"}


def _request(method, path, body, headers):
    u = urllib.parse.urlsplit(BASE)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    try:
        if isinstance(body, str):
            body = body.encode()
        try:
            conn.request(method, path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (413) before taking the whole body
        r = conn.getresponse()
        text = r.read().decode("utf-8", errors="replace")
        status, hdrs = r.status, {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()
    try:
        js = json.loads(text)
    except ValueError:
        js = None  # not JSON
    return types.SimpleNamespace(status=status, json=js, text=text, headers=hdrs)


async def post(path, body, headers=None):
    """POSTs a raw body (str or bytes); returns .status, .json, .text, .headers."""
    return await asyncio.to_thread(_request, "POST", path, body,
                                   auth_headers() if headers is None else headers)


async def get(path, headers=None):
    return await asyncio.to_thread(_request, "GET", path, None,
                                   auth_headers() if headers is None else headers)


def metric(text, name, labels=""):
    """One Prometheus sample value by metric name and optional label text."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.split("\n"):
        if not line.startswith("#") and line.startswith(key + " "):
            return float(line[len(key) + 1:])
    return math.nan


def now_ms():
    return time.monotonic() * 1000


async def wait_idle(limit_ms=20000):
    """Waits (bounded) until no slot is busy and nothing is queued; returns the
    milliseconds waited, or -1."""
    t0 = now_ms()
    while now_ms() - t0 < limit_ms:
        m = await get("/metrics")
        if metric(m.text, "dflash_slots_busy") == 0 and metric(m.text, "dflash_queue_depth") == 0:
            return now_ms() - t0
        await asyncio.sleep(0.02)
    return -1


async def leave_stream(api, body, pieces):
    """Streams body, hangs up after `pieces` content chunks (leaving the `async
    with` closes the connection); returns wait_idle's result after it."""
    got = 0
    async with await create(api, {**body, "stream": True}) as st:
        async for ch in st:
            if ch.choices and ch.choices[0].delta and ch.choices[0].delta.content:
                got += 1
                if got >= pieces:
                    break
    return await wait_idle(10000)


async def collect(stream, kind="chat"):
    """Collects a streamed completion from the openai client."""
    r = types.SimpleNamespace(text="", finish=None, usage=None, chunks=0, role=None, extra=None, lps=[])
    async for ch in stream:
        r.chunks += 1
        if ch.usage:
            r.usage = ch.usage
        if getattr(ch, "timings", None):
            r.extra = {"timings": ch.timings, "dflash": getattr(ch, "dflash", None)}
        for c in ch.choices:
            if kind == "chat":
                if c.delta and c.delta.role:
                    r.role = c.delta.role
                if c.delta and c.delta.content:
                    r.text += c.delta.content
                if c.logprobs and c.logprobs.content:
                    r.lps += c.logprobs.content
            else:
                r.text += c.text or ""
                if c.logprobs and c.logprobs.tokens:
                    r.lps += c.logprobs.tokens
            if c.finish_reason:
                r.finish = c.finish_reason
    return r
