"""load.py - a bounded load test on loopback: CLIENTS concurrent streaming
clients, REQUESTS each, a share of them hanging up at a random moment.
Every request must either complete (finish_reason, usage, [DONE]) or be the
one we cancelled; greedy answers to the same prompt must agree whatever ran
beside them. Prints the figures as one JSON line (prefixed "LOAD ").

env: SERVER_URL, SERVER_API_KEY, CLIENTS (8), REQUESTS (50), ABORT (0.2),
SEED (1), MAX_TOKENS (24)."""
import asyncio
import json
import os
import types

from common import client, check, summary, create, wait_idle, now_ms

clients = int(os.environ.get("CLIENTS") or 8)
per_client = int(os.environ.get("REQUESTS") or 50)
abort_p = float(os.environ.get("ABORT") or 0.2)
max_tokens = int(os.environ.get("MAX_TOKENS") or 24)
seed = (int(os.environ.get("SEED") or 1) & 0xFFFFFFFF) or 1  # xorshift stays at 0 from 0


def rand():
    """xorshift32: the same run every time."""
    global seed
    seed ^= (seed << 13) & 0xFFFFFFFF
    seed ^= seed >> 17
    seed ^= (seed << 5) & 0xFFFFFFFF
    return seed / 4294967296


prompts = ["Tell me about the sea.", "Write a poem about cats.", "What is 2 + 2?", "List three colours."]
results = []
answers = {}  # prompt/kind -> set of greedy answers
model = None


async def one():
    p, chat = int(rand() * len(prompts)), rand() < 0.5
    abort_mode = ("early" if rand() < 0.3 else "mid") if rand() < abort_p else None
    abort_after, abort_ms = 1 + int(rand() * 4), int(rand() * 30)
    if chat:
        req = {"model": model, "messages": [{"role": "user", "content": prompts[p]}], "max_tokens": max_tokens,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
               "chat_template_kwargs": {"enable_thinking": False}}
    else:
        req = {"model": model, "prompt": prompts[p], "max_tokens": max_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}}
    # A quarter pin a block: their rounds run under load whatever the adaptive
    # policy makes of the random drafter (it may take only classic steps), and
    # their greedy answers must equal the others'.
    if rand() < 0.25:
        req["block_size"] = 4
    r = types.SimpleNamespace(chat=chat, t0=now_ms(), ttft=None, t1=None, tokens=0, outcome=None, error=None)
    aborted = False
    s = types.SimpleNamespace(text="", finish=None, usage=None)

    async def run():
        nonlocal aborted
        chunks = 0
        # Leaving the `async with` early closes the connection: a client hanging up.
        async with await create(client.chat.completions if chat else client.completions, req) as stream:
            async for ch in stream:
                if ch.usage:
                    s.usage = ch.usage
                for x in ch.choices:
                    piece = (x.delta.content if x.delta else None) if chat else x.text
                    if piece:
                        if r.ttft is None:
                            r.ttft = now_ms() - r.t0
                        s.text += piece
                        if abort_mode == "mid":
                            chunks += 1
                            if chunks >= abort_after:
                                aborted = True
                                return
                    if x.finish_reason:
                        s.finish = x.finish_reason

    task = asyncio.create_task(run())
    timer = None
    if abort_mode == "early":
        def abort():
            nonlocal aborted
            aborted = True
            task.cancel()
        timer = asyncio.get_running_loop().call_later(abort_ms / 1000, abort)
    try:
        await task
        r.t1 = now_ms()
        if s.finish and s.usage:
            r.outcome = "done"
            r.tokens = s.usage.completion_tokens
            answers.setdefault(f"{str(chat).lower()}/{p}", set()).add(s.text)
        else:
            r.outcome = "aborted" if aborted else "error"
            r.error = f"stream ended without finish/usage ({s.finish}, {s.usage})"
    except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - counted as an error unless ours
        if isinstance(e, asyncio.CancelledError) and not aborted:
            raise  # not our abort: the whole run is being cancelled
        r.t1 = now_ms()
        r.outcome = "aborted" if aborted else "error"
        if not aborted:
            r.error = repr(e)
    finally:
        if timer:
            timer.cancel()
    results.append(r)


async def main():
    global model
    model = (await client.models.list()).data[0].id

    async def a_client():
        for _ in range(per_client):
            await one()
    t0 = now_ms()
    await asyncio.gather(*(a_client() for _ in range(clients)))
    wall = (now_ms() - t0) / 1000
    idle = await wait_idle(30000)

    done = [r for r in results if r.outcome == "done"]
    errors = [r for r in results if r.outcome == "error"]
    lat = sorted(r.t1 - r.t0 for r in done)
    ttft = sorted(r.ttft for r in done if r.ttft is not None)

    def pct(a, q):
        return round(a[min(len(a) - 1, int(q * len(a)))]) if a else None
    tokens = sum(r.tokens for r in done)
    fig = {
        "requests": len(results), "concurrency": clients, "completed": len(done),
        "cancelled_by_client": len(results) - len(done) - len(errors), "errors": len(errors),
        "latency_ms_p50": pct(lat, 0.5), "latency_ms_p99": pct(lat, 0.99),
        "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99),
        "completion_tokens": tokens, "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1), "idle_after_ms": round(idle),
    }
    print("LOAD " + json.dumps(fig), flush=True)
    check(len(results) == clients * per_client, "every request finished one way or another")
    check(len(errors) == 0, "no request failed", [r.error for r in errors[:5]])
    check(len(done) > 0, "some requests completed")
    check(idle >= 0, "all slots idle and the queue empty after the load", idle)
    for key, texts in answers.items():
        check(len(texts) == 1, f"greedy answers to one prompt agree under load ({key})", sorted(texts)[:3])
    await client.close()


asyncio.run(main())
summary("load")
