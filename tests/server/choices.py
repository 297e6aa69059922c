"""choices.py - `n > 1` through the official openai client: each choice is a
generation of its own, with its own seed (choice 0 is the n = 1 answer),
reproducible, streamed interleaved with its index, usage summed over choices;
greedy choices agree; a client that leaves cancels every choice; n out of
range is a 400 naming "n"; at SIGTERM a stream of choices ends with one error.

env: SERVER_URL, SERVER_PID (the last check sends it SIGTERM), EXPECT (expect.py's
JSON: `dflash generate` outputs)."""
import asyncio
import http.client
import json
import os
import signal
import time
import urllib.parse

from common import (client, check, summary, create, post, get, metric, wait_idle, is_num,
                    chat_request, completion_request, leave_stream)

with open(os.environ["EXPECT"], encoding="utf-8") as f:
    expect = json.load(f)
chat, compl = client.chat.completions, client.completions
model = None
N = 3
# The sampling fields expect.py gave `dflash generate` for sampled_text.
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "min_p": 0.01, "seed": 1234}


def chat_req(**extra):
    return chat_request(expect, model, **extra)


def compl_req(**extra):
    return completion_request(expect, model, **extra)


def texts(r, kind="chat"):
    return [c.message.content if kind == "chat" else c.text for c in r.choices]


async def stream_by_index(body, kind="chat"):
    """Streams body through the client; per choice index its text and finish
    reason; the usage chunks; whether any finish came after the usage."""
    got = {"text": {}, "finish": {}, "usage": [], "late": False, "order": []}
    async for ch in await create(chat if kind == "chat" else compl, body):
        if ch.usage:
            got["usage"].append(ch.usage)
        for c in ch.choices:
            got["late"] |= bool(got["usage"])
            piece = (c.delta.content if kind == "chat" and c.delta else c.text) or ""
            got["text"][c.index] = got["text"].get(c.index, "") + piece
            if piece:
                got["order"].append(c.index)
            if c.finish_reason:
                got["finish"][c.index] = c.finish_reason
    return got


def switches(order):
    return sum(1 for a, b in zip(order, order[1:]) if a != b)


async def main():
    global model
    model = (await client.models.list()).data[0].id

    # ---- sampled: n choices, choice 0 is the n = 1 answer (and `dflash generate`'s) ----
    one = await create(chat, chat_req(**SAMPLED, logprobs=True))
    r = await create(chat, chat_req(**SAMPLED, n=N, logprobs=True))
    check(len(r.choices) == N and [c.index for c in r.choices] == list(range(N)),
          "n=3: three choices, indices 0 1 2", [c.index for c in r.choices])
    t = texts(r)
    check(t[0] == one.choices[0].message.content == expect["sampled_text"],
          "choice 0 equals the n=1 answer with the same seed (= dflash generate --seed)",
          {"choice0": t[0], "n1": one.choices[0].message.content, "generate": expect["sampled_text"]})
    check(len(set(t)) > 1, "the choices sample independently (they differ)", t)
    check(all(c.finish_reason in ("stop", "length") for c in r.choices), "each choice has a finish_reason")
    ntok = [len(c.logprobs.content) if c.logprobs and c.logprobs.content else 0 for c in r.choices]
    check(all(ntok), "each choice has its logprobs", ntok)
    check([e.token for e in r.choices[0].logprobs.content] == [e.token for e in one.choices[0].logprobs.content],
          "choice 0's logprobs are the n=1 answer's")
    u = r.usage
    check(u.prompt_tokens == one.usage.prompt_tokens and u.completion_tokens == sum(ntok) and
          u.total_tokens == u.prompt_tokens + u.completion_tokens,
          "usage: the prompt once, completion tokens summed over choices", {"usage": u, "per_choice": ntok})
    timings = getattr(r, "timings", None) or {}
    check(timings.get("predicted_n") == sum(ntok), "timings.predicted_n sums the choices", timings)
    again = await create(chat, chat_req(**SAMPLED, n=N, logprobs=True))
    check(texts(again) == t, "the same request again gives the same choices", {"first": t, "again": texts(again)})
    other = await create(chat, chat_req(**{**SAMPLED, "seed": 1235}, n=N))
    check(not set(texts(other)) & set(t), "a neighbouring seed shares no choice", texts(other))

    # ---- streaming: chunks carry the index; per index the non-streamed text ----------
    s = await stream_by_index(chat_req(**SAMPLED, n=N, stream=True, stream_options={"include_usage": True}))
    check([s["text"].get(i) for i in range(N)] == t, "stream: each index's text equals the non-streamed choice",
          {"stream": s["text"], "whole": t})
    check(s["finish"] == {i: c.finish_reason for i, c in enumerate(r.choices)}, "stream: a finish per index",
          s["finish"])
    check(len(s["usage"]) == 1 and s["usage"][0].completion_tokens == u.completion_tokens and
          s["usage"][0].prompt_tokens == u.prompt_tokens and not s["late"],
          "stream: one usage chunk, after every choice, with the summed usage", s["usage"])
    # On two slots the first two choices generate at once: their chunks interleave.
    check(switches(s["order"]) >= N, "stream: choices interleave as they progress", s["order"])
    raw = await post("/v1/chat/completions", json.dumps(chat_req(**SAMPLED, n=N, stream=True)))
    events = [e[len("data: "):] for e in raw.text.split("\n\n") if e.startswith("data: ")]
    check(raw.status == 200 and events.count("[DONE]") == 1 and events[-1] == "[DONE]",
          "stream: [DONE] once, after all choices", events[-3:])
    roles = [json.loads(e)["choices"][0]["index"] for e in events[:-1]
             if json.loads(e)["choices"] and json.loads(e)["choices"][0].get("delta", {}).get("role")]
    check(sorted(roles) == list(range(N)), "stream: each choice's first chunk names the role", roles)

    # ---- completions ------------------------------------------------------------------
    c1 = await create(compl, compl_req(**SAMPLED))
    c3 = await create(compl, compl_req(**SAMPLED, n=2, logprobs=1))
    check(len(c3.choices) == 2 and texts(c3, "completion")[0] == c1.choices[0].text,
          "completions n=2: choice 0 equals the n=1 answer", texts(c3, "completion"))
    check(all(len(c.logprobs.tokens) > 0 for c in c3.choices), "completions: logprobs per choice")
    cs = await stream_by_index(compl_req(**SAMPLED, n=2, stream=True), "completion")
    check([cs["text"].get(i) for i in range(2)] == texts(c3, "completion"),
          "completions stream: per index the non-streamed text", cs["text"])

    # ---- greedy: every choice is the greedy answer ---------------------------------------
    g = await create(chat, chat_req(n=N))
    check(texts(g) == [expect["chat_text"]] * N, "n=3 greedy: three equal choices, the greedy answer",
          texts(g))
    gc = await create(compl, compl_req(n=2))
    check(texts(gc, "completion") == [expect["completion_text"]] * 2, "completions n=2 greedy: equal choices")

    # ---- out of range: 400 naming n ---------------------------------------------------------
    for bad in (0, 17, -1, 2.5, "3"):
        e = await post("/v1/chat/completions", json.dumps(chat_req(n=bad)))
        err = e.json.get("error") if isinstance(e.json, dict) else None
        check(e.status == 400 and isinstance(err, dict) and err.get("param") == "n" and
              err.get("type") == "invalid_request_error", f"n={bad!r} -> 400 param n", e.text[:200])
    e = await post("/v1/completions", json.dumps(compl_req(n=17)))
    check(e.status == 400 and (e.json or {}).get("error", {}).get("param") == "n", "completions n=17 -> 400", e.text)
    ok = await create(chat, chat_req(n=16, max_tokens=2))
    check(len(ok.choices) == 16, "n=16 (the limit) is served", len(ok.choices))

    # ---- a client that leaves cancels every choice (running and queued) --------------------
    await wait_idle()
    before = metric((await get("/metrics")).text, "dflash_requests_total", 'result="cancelled"')
    waited = await leave_stream(chat, chat_req(n=N, max_tokens=100000, ignore_eos=True), 3)
    check(waited >= 0, "a disconnected n=3 stream frees its slots", waited)
    after = metric((await get("/metrics")).text, "dflash_requests_total", 'result="cancelled"')
    check(is_num(after) and after - before == N, "every choice is cancelled", {"before": before, "after": after})
    await asyncio.to_thread(hang_up, chat_req(n=N, max_tokens=100000, ignore_eos=True))
    waited = await wait_idle(10000)
    check(waited >= 0, "a client that leaves before the whole answer frees the slots", waited)
    last = metric((await get("/metrics")).text, "dflash_requests_total", 'result="cancelled"')
    check(last - after == N, "non-stream: every choice is cancelled", {"before": after, "after": last})
    r = await create(chat, chat_req())
    check(r.choices[0].message.content == expect["chat_text"], "still serving correctly afterwards")

    # ---- SIGTERM: the queued choice is refused, the running ones cancelled: one error ----
    events = await asyncio.to_thread(stream_through_sigterm, chat_req(n=N, stream=True, max_tokens=100000,
                                                                      ignore_eos=True))
    errors = [e for e in events if e.startswith("{") and "error" in json.loads(e)]
    check(len(errors) == 1 and "shutting down" in errors[0] and events.count("[DONE]") == 1 and
          events[-1] == "[DONE]", "SIGTERM: one error event for the request, then [DONE] once", events[-3:])
    await client.close()


def hang_up(body):
    """Sends a non-streamed request and closes the connection once it is generating."""
    u = urllib.parse.urlsplit(os.environ["SERVER_URL"])
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"content-type": "application/json"})
    time.sleep(0.5)
    conn.close()


def stream_through_sigterm(body):
    """Streams body raw; once text arrives, SIGTERMs the server; the SSE events to the end."""
    u = urllib.parse.urlsplit(os.environ["SERVER_URL"])
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"content-type": "application/json"})
    r, events, sent = conn.getresponse(), [], False
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        events.append(line[len("data: "):])
        if not sent and '"content":"' in line and '"content":""' not in line:
            os.kill(int(os.environ["SERVER_PID"]), signal.SIGTERM)
            sent = True
    conn.close()
    return events


asyncio.run(main())
summary("choices")
