"""crowd.py - solo versus crowd: a greedy request's text is the same whether it
runs alone or among 8 others (continuous batching puts their rows in the
same forwards), with DFlash on, off, and both in one crowd, over several
seeds. Each seed draws nine prompts; each runs alone first (one at a time),
then all nine at once, half of them streaming. /metrics must show that the
crowd's forwards were shared.
The prefix cache across slots: a prompt sharing a long prefix with a
finished request copies that prefix into another slot (so the finished
conversation's own cache stays whole), and its text equals a cold
`dflash generate` of the same prompt.

env: SERVER_URL, SEEDS (4), MAX_TOKENS (40); DFLASH_BIN, TARGET, DRAFT for
the cold runs."""
import asyncio
import math
import os
import random
import subprocess

from common import client, check, summary, create, collect, get, metric, wait_idle

seeds = int(os.environ.get("SEEDS") or 4)
max_tokens = int(os.environ.get("MAX_TOKENS") or 40)
WORDS = ("sea river stone light winter garden clock paper bird music north engine "
         "story letter mountain silver morning city road lamp").split()
N = 9


def prompts(seed):
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(2, 24))) for _ in range(N)]


def cold(prompt):
    """The text `dflash generate` makes of prompt, with no cache to reuse."""
    cmd = [os.environ["DFLASH_BIN"], "generate", "-q", "-m", os.environ["TARGET"], "--draft",
           os.environ["DRAFT"], "-c", "512", "-n", str(max_tokens), "--temp", "0",
           "--ignore-eos", "-p", prompt]
    out = subprocess.run(cmd, capture_output=True, timeout=300)
    check(out.returncode == 0, f"cold run: {out.stderr.decode(errors='replace')[-300:]}")
    return out.stdout.decode("utf-8")[:-1]


async def usage_of(prompt):
    body = {"model": "target", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    r = await create(client.completions, body)
    d = r.usage.prompt_tokens_details
    return r.choices[0].text, (d.cached_tokens if d else 0) or 0


async def prefix_across_slots():
    r = random.Random(99)
    shared = " ".join(r.choice(WORDS) for _ in range(60))
    a, c = shared + " alpha river", shared + " gamma stone"
    text_a, _ = await usage_of(a)
    text_c, cached_c = await usage_of(c)   # copies the shared rows from a's slot
    text_a2, cached_a2 = await usage_of(a)  # a's own slot kept all of a
    check(text_a == cold(a) and text_c == cold(c), "prefix copied across slots: the same text "
          "as cold runs", [text_a, text_c])
    check(cached_c >= 50, f"the second prompt reused the shared prefix ({cached_c} cached)")
    check(text_a2 == text_a and cached_a2 > cached_c,
          f"the first conversation's cache stayed whole ({cached_a2} cached)")


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
    await prefix_across_slots()
    after = await shared_forwards()
    check(after > before, "the crowds' forwards carried several requests' rows",
          {"before": before, "after": after})
    summary("crowd.py")


asyncio.run(main())
