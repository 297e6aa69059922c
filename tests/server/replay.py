"""replay.py - `dflash serve --replay-tau` (benchmarks): the first request with a
prompt records its greedy answer, running the drafter as any request does; the
same prompt again replays that answer as the drafter's proposals. The replay's
text equals the recording's, it runs speculative rounds, and it reuses the
recording's cache: the recording kept its drafter's side store in step, and
cached_tokens counts the prompt rows the request really reused.

env: SERVER_URL, MAX_TOKENS (40)."""
import asyncio
import json
import os

from common import check, summary, post

max_tokens = int(os.environ.get("MAX_TOKENS") or 40)
PROMPT = ("the river and the stone went north past the garden clock, and the silver "
          "lamp lit the morning road to the city of paper birds")


async def complete():
    body = {"model": "target", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    r = await post("/v1/completions", json.dumps(body))
    check(r.status == 200 and r.json, f"completion: {r.status} {r.text[:200]}")
    js = r.json or {}
    cached = ((js.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return js["choices"][0]["text"], js["usage"]["prompt_tokens"], cached, js.get("dflash") or {}


async def main():
    text, n_prompt, cached, _ = await complete()       # records the answer
    check(cached == 0, f"the recording started cold ({cached} cached)")
    text2, _, cached2, d = await complete()              # replays it
    check(text2 == text, "the replay's text equals the recording's", [text, text2])
    check(d.get("rounds", 0) > 0, "the replay ran speculative rounds", d)
    check(cached2 == n_prompt - 1,
          f"the replay reused the recording's prompt rows ({cached2} of {n_prompt - 1})")
    summary("replay")


asyncio.run(main())
