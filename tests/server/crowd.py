"""crowd.py - solo versus crowd: a greedy request's text is the same whether it
runs alone or among 8 others (continuous batching puts their rows in the
same forwards), with DFlash on, off, and both in one crowd, over several
seeds. Each seed draws nine prompts; each runs alone first (one at a time),
then all nine at once, half of them streaming. /metrics must show that the
crowd's forwards were shared.

env: SERVER_URL, SEEDS (4), MAX_TOKENS (40)."""
import asyncio
import math
import os
import random

from common import client, check, summary, create, collect, get, metric, wait_idle

seeds = int(os.environ.get("SEEDS") or 4)
max_tokens = int(os.environ.get("MAX_TOKENS") or 40)
WORDS = ("sea river stone light winter garden clock paper bird music north engine "
         "story letter mountain silver morning city road lamp").split()
N = 9


def prompts(seed):
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(2, 24))) for _ in range(N)]


async def complete(prompt, block, stream):
    body = {"model": "target", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    if block is not None:
        body["block_size"] = block
    if stream:
        return (await collect(await create(client.completions, {**body, "stream": True}),
                              kind="completion")).text
    return (await create(client.completions, body)).choices[0].text


async def shared_forwards():
    v = metric((await get("/metrics")).text, "dflash_batched_forwards_total")
    return -1 if math.isnan(v) else v


async def main():
    before = await shared_forwards()
    check(before >= 0, "/metrics has dflash_batched_forwards_total")
    modes = {"dflash on": lambda i: None, "dflash off": lambda i: 1,
             "mixed": lambda i: None if i % 2 else 1}
    for seed in range(seeds):
        ps = prompts(seed)
        solo = [await complete(p, None, False) for p in ps]
        off = [await complete(p, 1, False) for p in ps]
        check(solo == off, f"seed {seed}: alone, DFlash on and off give the same text")
        for name, block in modes.items():
            crowd = await asyncio.gather(*(complete(p, block(i), i % 2 == 0)
                                           for i, p in enumerate(ps)))
            diff = [i for i in range(N) if crowd[i] != solo[i]]
            check(not diff, f"seed {seed}, {name}: 9 at once equal each alone",
                  [(solo[i], crowd[i]) for i in diff])
    await wait_idle()
    after = await shared_forwards()
    check(after > before, "the crowds' forwards carried several requests' rows",
          {"before": before, "after": after})
    summary("crowd.py")


asyncio.run(main())
