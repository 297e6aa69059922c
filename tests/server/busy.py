"""busy.py - a full server: one slot, one queue place. A running stream, a
queued request, then a third request gets 503 with Retry-After. SIGTERM
then answers the queued request with 503 and cancels the running stream
after the grace period with an error event.

env: SERVER_URL, SERVER_PID (this script sends the SIGTERM)."""
import asyncio
import json
import os
import signal

import openai

from common import client, check, summary, create, post, get, metric


async def outcome(coro):
    """'completed', or the exception the request ended with."""
    try:
        await coro
        return "completed"
    except Exception as e:  # noqa: BLE001 - the caller checks which
        return e


async def main():
    model = (await client.models.list()).data[0].id
    long = {"model": model, "messages": [{"role": "user", "content": "Go on and on."}], "temperature": 0,
            "max_tokens": 100000, "ignore_eos": True}
    chat = client.chat.completions

    # A: running, streaming until the context is full.
    a = await create(chat, {**long, "stream": True})
    it = aiter(a)
    a_text = ""
    while not a_text:
        try:
            value = await anext(it)
        except StopAsyncIteration:
            break
        if value.choices and value.choices[0].delta:
            a_text += value.choices[0].delta.content or ""
    check(len(a_text) > 0, "A is generating")

    # B: waits in the queue.
    b_done = asyncio.create_task(outcome(create(chat, long)))
    for _ in range(200):
        m = await get("/metrics")
        if metric(m.text, "dflash_queue_depth") == 1:
            break
        await asyncio.sleep(0.01)
    check(metric(m.text, "dflash_queue_depth") == 1 and metric(m.text, "dflash_slots_busy") == 1,
          "B is queued behind A")

    # C: no slot, no queue place.
    c = await post("/v1/chat/completions", json.dumps({**long, "max_tokens": 4}))
    check(c.status == 503 and c.headers.get("retry-after") == "1" and isinstance(c.json, dict) and
          (c.json.get("error") or {}).get("code") == "server_busy",
          "C: 503 server_busy with Retry-After", {"status": c.status, "body": c.text})
    m = await get("/metrics")
    check(metric(m.text, "dflash_requests_total", 'result="rejected"') == 1, "the rejection is counted")

    # SIGTERM: B is refused, A is cancelled after the grace period.
    os.kill(int(os.environ["SERVER_PID"]), signal.SIGTERM)
    b = await b_done
    check(isinstance(b, openai.APIStatusError) and b.status_code == 503, "B (queued) gets 503 at shutdown",
          repr(b))
    a_end = "completed"
    try:
        async for _ in it:
            pass
    except Exception as e:  # noqa: BLE001
        a_end = e
    check(isinstance(a_end, openai.APIError) and "shutting down" in a_end.message,
          "A (running) ends with an error event after the grace period", repr(a_end))
    await client.close()


asyncio.run(main())
summary("busy")
