#!/usr/bin/env python3
"""serve_ab.py - DFlash against classic steps inside one server: a DFlash
replay server (bench_serve.py's) takes alternating waves of N streaming
clients, one wave with each request's "block_size": 1 (classic steps: no
capture, no drafter) and the next adaptive (DFlash on), PAIRS times, the order
flipped every pair.

Why: bench_serve.py compares servers started one after another, and on a
shared host their stages drift by 5-15% (classic alone measured 134.5 and
163.6 tok/s in two stages at eight clients). Waves of one process seconds
apart share the host's state, the warm caches and the prefix cache, so
their ratio shows what DFlash costs or gains a crowd.

  build/venv/bin/python bench/serve_ab.py --model M.gguf --draft D [--clients 4]
      [--tau 3] [--pairs 6] [--requests 2]

Prints each pair's aggregate tok/s and the median ratio adaptive / classic
with its range (bench_serve.py's requests: every one generates --max-tokens),
and the same for the server's CPU time per token (see wave)."""
import argparse
import asyncio
import os
import random
import statistics
import sys
import time

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serve as bs  # noqa: E402


def cpu_seconds(pid):
    """The CPU time a process has used, user and system (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wave(client, model, ps, n, reqs, max_tokens, block, pid):
    """n clients send reqs requests each; returns the aggregate tok/s and the
    server's CPU milliseconds per token. The CPU time is what the wave cost
    the machine: it leaves out the time a shared host's other guests took
    (steal), which moves wall-clock rates by 5-15% between waves."""
    async def worker(k):
        return sum([(await bs.one(client, model, ps[(k + i * n) % len(ps)], max_tokens,
                                  {"block_size": block}))["tokens"] for i in range(reqs)])
    t0, c0 = time.perf_counter(), cpu_seconds(pid)
    tokens = sum(await asyncio.gather(*(worker(k) for k in range(n))))
    return tokens / (time.perf_counter() - t0), 1e3 * (cpu_seconds(pid) - c0) / tokens


async def run(a, port, model, pid):
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                max_retries=2, timeout=3600)
    ps = bs.prompts(a.clients * a.requests)
    for p in ps:   # records each prompt's greedy answer for the replay
        await bs.one(client, model, p, a.max_tokens)
    tps, cpu = {1: [], 0: []}, {1: [], 0: []}
    for i in range(a.pairs):
        for block in ((1, 0) if i % 2 == 0 else (0, 1)):
            r, c = await wave(client, model, ps, a.clients, a.requests, a.max_tokens,
                              block or a.block, pid)
            tps[block].append(r)
            cpu[block].append(c)
        print(f"pair {i}: classic {tps[1][-1]:.1f} tok/s, DFlash {tps[0][-1]:.1f}, "
              f"x {tps[0][-1] / tps[1][-1]:.3f}; CPU ms/token classic {cpu[1][-1]:.1f}, "
              f"DFlash {cpu[0][-1]:.1f}", file=sys.stderr)
    await client.close()
    return tps, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--dflash", default=os.path.join(bs.HERE, "build", "dflash"))
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tau", type=float, default=3)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--block", type=int, default=0,
                    help="the DFlash waves' block_size (0: adaptive; N pins blocks of N)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client and wave")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    port = bs.free_port()
    cmd = [a.dflash, "serve", "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx),
           "--port", str(port), "-np", str(a.clients), "--draft", a.draft,
           "--replay-tau", str(a.tau)]
    srv = bs.Server(cmd, port, f"/tmp/serve-ab-{a.clients}.log")
    try:
        tps, cpu = asyncio.run(run(a, port, os.path.basename(a.model), srv.p.pid))
    finally:
        srv.stop()
    x = [d / c for d, c in zip(tps[0], tps[1])]
    lo, hi = median_interval(x)
    print(f"CPU {bs.cpu_name()}, {a.clients} clients, tau {a.tau:g}, {a.pairs} pairs: classic "
          f"{statistics.median(tps[1]):.1f} tok/s, DFlash {statistics.median(tps[0]):.1f}, "
          f"x {statistics.median(x):.3f} ({min(x):.3f}-{max(x):.3f}; 95% interval of the "
          f"median {lo:.3f}-{hi:.3f})")
    # CPU per token, classic over DFlash: above 1 where DFlash costs the machine less
    y = [c / d for d, c in zip(cpu[0], cpu[1])]
    lo, hi = median_interval(y)
    print(f"CPU ms per token: classic {statistics.median(cpu[1]):.1f}, DFlash "
          f"{statistics.median(cpu[0]):.1f}, classic / DFlash {statistics.median(y):.3f} "
          f"({min(y):.3f}-{max(y):.3f}; 95% interval of the median {lo:.3f}-{hi:.3f})")


def median_interval(x, n=2000):
    """A 95% bootstrap interval of the median of x (seeded: the same pairs give
    the same interval). With a few pairs it is as wide as their range: the
    host's drift between waves is what decides how many pairs a claim needs."""
    rnd = random.Random(0)
    ms = sorted(statistics.median(rnd.choices(x, k=len(x))) for _ in range(n))
    return ms[int(0.025 * n)], ms[int(0.975 * n) - 1]


if __name__ == "__main__":
    main()
