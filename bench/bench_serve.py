#!/usr/bin/env python3
"""bench_serve.py - concurrent streaming clients against OpenAI-compatible
servers: dflash serve (classic, and DFlash with a replayed drafter at chosen
acceptance lengths) and llama-server, on the same GGUF, with the same client
(the official openai package), one server at a time, in one run.

For every server and concurrency N (1 2 4 8): a fresh server with N slots;
a warm-up pass (every prompt once, one at a time: for the replay servers
this records each prompt's greedy answer, which later requests replay);
with --warm-crowd K, N clients each send K requests, unmeasured; then N
clients each send REQS streaming requests back to back. Reported:
aggregate tok/s (all completion tokens / wall time), the same while all
N clients are busy (tokens streamed until the first client's last token,
counted by each request's share of streamed chunks, over that time: the
tail in which fewer than N clients remain is left out), per-request decode
tok/s (tokens after the first / time after the first; median and range),
time to first token p50 / p99, the server's peak RSS (VmHWM).

  build/venv/bin/python bench/bench_serve.py --model M.gguf [--draft D [--draft-dtype T]]
      [--llama-server PATH] [--clients 1,2,4,8] [--taus 3,6.5] [--reps R]
      [--warm-crowd K] [--out results.json]

With --reps R every client count runs every server R times, the servers
alternated within each rep (in reverse order on odd reps); the table gives
medians, the aggregate's range, and each server's aggregate over dflash
classic's of the same rep.

llama-server runs without its host-memory prompt cache (--cache-ram 0): the
warm-up sends every measured prompt once, and from that cache llama-server
then skipped the prefill of 50-72% of the measured requests (its log: prompt
eval of 1 token), which no server gets from distinct prompts; dflash serve
keeps each slot's last sequence only, as llama-server's slots do.
--llama-prompt-cache leaves that cache on.

The llama.cpp build is one made by hand from its public source; nothing of it
is fetched, built or committed here. Prints a markdown table; --out keeps
every number with the command that made it (bench/plot_serve.py draws it)."""
import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the sea river stone light winter garden clock paper bird music north engine story "
         "letter mountain silver morning city road lamp").split()


def prompts(n):
    """n distinct prompts of 30-60 words (deterministic)."""
    out, x = [], 12345
    for i in range(n):
        ws = []
        for _ in range(30 + (i * 7) % 31):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            ws.append(WORDS[x % len(WORDS)])
        out.append(f"Story {i}: " + " ".join(ws))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_kb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Server:
    def __init__(self, cmd, port, log):
        self.cmd, self.port = cmd, port
        self.log = open(log, "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise SystemExit(f"server exited at start: {' '.join(cmd)} (see {log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"server not ready after 600 s: {' '.join(cmd)}")

    def stop(self):
        rss = peak_rss_kb(self.p.pid)
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()
        return rss


async def one(client, model, prompt, max_tokens, extra=None):
    """One streaming request; extra: more request fields (serve_ab.py's block_size)."""
    t0 = time.perf_counter()
    first, n = None, 0
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, **(extra or {})})
    usage, stamps = None, []
    async for ch in stream:
        if ch.usage:
            usage = ch.usage.completion_tokens
        for c in ch.choices:
            if c.text:
                n += 1
                stamps.append(time.perf_counter())
                if first is None:
                    first = stamps[-1]
    t1 = time.perf_counter()
    tokens = usage or n
    first = first or t1
    return {"ttft": first - t0, "tokens": tokens, "end": t1, "stamps": stamps,
            "decode_tps": (tokens - 1) / (t1 - first) if tokens > 1 and t1 > first else 0.0}


def busy_tokens(rs, end):
    """Tokens streamed by `end`: each request's tokens by the share of its
    streamed chunks that came by then."""
    return sum(r["tokens"] * sum(t <= end for t in r["stamps"]) / len(r["stamps"])
               for r in rs if r["stamps"])


async def stage(port, model, ps, n_clients, reqs, max_tokens, warm_crowd=0):
    # retries: a server may close an idle keep-alive connection the client then reuses
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                max_retries=2, timeout=3600)
    ps = ps[:n_clients * reqs]
    # warm-up, the same for every server: a replay server keeps each prompt's greedy
    # answer to replay it later. (Only the replay servers ran it, and their measured
    # part then began after a minute of load that the others' did not have.)
    for p in ps:
        await one(client, model, p, max_tokens)

    async def worker(k, n=reqs):
        return [await one(client, model, ps[(k + i * n_clients) % len(ps)], max_tokens)
                for i in range(n)]
    # --warm-crowd: the same clients' requests, unmeasured, so a server's policies and
    # crowd gate have learnt this crowd, as on a server that has been up a while (one
    # client too: the warm-up's requests, which record the replays, run the drafter's
    # own proposals, whose evidence the replays do not share)
    if warm_crowd:
        await asyncio.gather(*(worker(k, warm_crowd) for k in range(n_clients)))
    t0 = time.perf_counter()
    per_client = await asyncio.gather(*(worker(k) for k in range(n_clients)))
    wall = time.perf_counter() - t0
    await client.close()
    rs = [r for rows in per_client for r in rows]
    # While every client is busy: up to the first client's last token. A
    # server whose requests run at uneven speeds ends its stage with fewer
    # clients than N, and the aggregate to the last token counts that tail.
    busy_end = min(rows[-1]["end"] for rows in per_client)
    busy = busy_tokens(rs, busy_end) / (busy_end - t0)
    for r in rs:
        del r["stamps"], r["end"]
    ttft = sorted(r["ttft"] for r in rs)
    tps = [r["decode_tps"] for r in rs]
    return {"aggregate_tps": sum(r["tokens"] for r in rs) / wall, "busy_tps": busy,
            "request_tps_median": statistics.median(tps), "request_tps_min": min(tps),
            "request_tps_max": max(tps),
            "ttft_p50_ms": 1e3 * ttft[len(ttft) // 2],
            "ttft_p99_ms": 1e3 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
            "requests": len(rs), "wall_s": wall}


def configs(a):
    base = [a.dflash, "serve", "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx)]
    base += ["--mmap"] if a.mmap else []
    out = [("dflash classic", lambda n, port: base + ["--port", str(port), "-np", str(n)])]
    dd = ["--draft-dtype", a.draft_dtype] if a.draft_dtype else []
    for tau in a.taus:
        out.append((f"dflash DFlash tau {tau:g}",
                    lambda n, port, tau=tau: base + ["--port", str(port), "-np", str(n), "--draft",
                                                     a.draft, "--replay-tau", str(tau)] + dd))
    if a.llama_server:
        out.append(("llama-server", lambda n, port: [
            a.llama_server, "-m", a.model, "-t", str(a.threads), "-np", str(n),
            "-c", str(a.ctx * n), "--port", str(port), "--host", "127.0.0.1", "-cb"]
            + ([] if a.llama_prompt_cache else ["--cache-ram", "0"])))
    return out


def utc_now():
    """The time of day in UTC, to match a stage with the host's load."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="target GGUF (both servers load it)")
    ap.add_argument("--draft", help="DFlash drafter for the replay servers")
    ap.add_argument("--draft-dtype", help="the replay servers' --draft-dtype (e.g. q8_0)")
    ap.add_argument("--dflash", default=os.path.join(HERE, "build", "dflash"))
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (optional)")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--taus", default="3,6.5")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("--mmap", action="store_true",
                    help="dflash serve reads the weights in place (its default copies them "
                    "into memory where the copy fits; llama-server's default maps the file)")
    ap.add_argument("--llama-prompt-cache", action="store_true",
                    help="leave llama-server's host-memory prompt cache on (see above)")
    ap.add_argument("--only", help="run the configs whose name contains one of these "
                    "(comma-separated)")
    ap.add_argument("--reps", type=int, default=1,
                    help="sweeps of every client count, servers alternated within each")
    ap.add_argument("--warm-crowd", type=int, default=0, metavar="K",
                    help="before each measured stage of N > 1 clients, N clients send K "
                    "requests each, unmeasured (every server alike): the steady state of a "
                    "server that has been up, not one learning from nothing")
    ap.add_argument("--out", default="/tmp/dflash-bench-serve.json")
    a = ap.parse_args()
    a.taus = [float(x) for x in a.taus.split(",") if x] if a.draft else []
    clients = [int(x) for x in a.clients.split(",")]
    ps = prompts(max(clients) * a.requests)
    runs = []
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {a.threads} threads; model {a.model}; "
          f"{a.max_tokens} tokens per request, {a.requests} requests per client, "
          f"{a.reps} rep(s), warm crowd {a.warm_crowd}", file=sys.stderr)
    cfgs = [c for c in configs(a) if not a.only or any(o in c[0] for o in a.only.split(","))]
    # Servers alternate within each rep and client count: on a shared machine
    # whose speed drifts by minutes, the ratios of neighbouring stages hold
    # where stages run a config's whole sweep apart do not. Odd reps run the
    # servers in reverse order, so a drift that favours the first or the
    # second stage of a rep cancels in the median over an even count of reps.
    for rep in range(a.reps):
        for n in clients:
            for name, cmd_of in (cfgs if rep % 2 == 0 else cfgs[::-1]):
                port = free_port()
                cmd = cmd_of(n, port)
                srv = Server(cmd, port, f"/tmp/bench-serve-{name.replace(' ', '_')}-{n}.log")
                started = utc_now()
                try:
                    r = asyncio.run(stage(port, os.path.basename(a.model), ps, n, a.requests,
                                          a.max_tokens, a.warm_crowd))
                finally:
                    rss = srv.stop()
                r.update(server=name, clients=n, rep=rep, peak_rss_mb=rss / 1024,
                         cmd=" ".join(cmd), started=started, ended=utc_now())
                runs.append(r)
                print(f"{name:24s} N={n} rep {rep}: {r['aggregate_tps']:.1f} tok/s aggregate, "
                      f"{r['busy_tps']:.1f} all busy, "
                      f"{r['request_tps_median']:.1f} per request, TTFT p50 "
                      f"{r['ttft_p50_ms']:.0f} ms, RSS {r['peak_rss_mb']:.0f} MB", file=sys.stderr)
                results = summary(runs)
                with open(a.out, "w") as f:
                    json.dump({"cpu": cpu_name(), "threads": a.threads, "model": a.model,
                               "warm_crowd": a.warm_crowd,
                               "max_tokens": a.max_tokens, "reps": a.reps, "results": results,
                               "runs": runs}, f, indent=1)
    table(summary(runs))


def summary(runs):
    """Per server and client count: the medians over reps, the aggregate's
    range, and its ratio to dflash classic of the same rep and clients
    (median over reps: each ratio compares stages run minutes apart)."""
    out = []
    keys = []
    for r in runs:
        if (r["server"], r["clients"]) not in keys:
            keys.append((r["server"], r["clients"]))
    for name, n in keys:
        rs = [r for r in runs if r["server"] == name and r["clients"] == n]
        m = {k: statistics.median(r[k] for r in rs) for k in
             ("aggregate_tps", "busy_tps", "request_tps_median", "request_tps_min",
              "request_tps_max", "ttft_p50_ms", "ttft_p99_ms", "peak_rss_mb")}
        agg = [r["aggregate_tps"] for r in rs]
        m.update(server=name, clients=n, reps=len(rs), aggregate_min=min(agg),
                 aggregate_max=max(agg), cmd=rs[0]["cmd"])
        for key, col in (("aggregate_tps", "x_classic"), ("busy_tps", "x_classic_busy")):
            ratios = []
            for r in rs:
                base = [b for b in runs if b["server"] == "dflash classic" and b["clients"] == n
                        and b["rep"] == r["rep"]]
                if base:
                    ratios.append(r[key] / base[0][key])
            m.update({col: statistics.median(ratios) if ratios else None,
                      col + "_min": min(ratios) if ratios else None,
                      col + "_max": max(ratios) if ratios else None})
        out.append(m)
    return out


def table(results):
    print("| server | clients | aggregate tok/s (min-max) | x 1 client | x classic (min-max) "
          "| all busy: tok/s, x classic (min-max) "
          "| per-request tok/s | TTFT p50 / p99 ms | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")

    def ratio(r, col):
        return (f"{r[col]:.2f} ({r[col + '_min']:.2f}-{r[col + '_max']:.2f})"
                if r[col] is not None else "")
    for r in results:
        one_c = next((x for x in results if x["server"] == r["server"] and x["clients"] == 1), r)
        print(f"| {r['server']} | {r['clients']} | {r['aggregate_tps']:.1f} "
              f"({r['aggregate_min']:.1f}-{r['aggregate_max']:.1f}) | "
              f"{r['aggregate_tps'] / one_c['aggregate_tps']:.2f} | {ratio(r, 'x_classic')} | "
              f"{r['busy_tps']:.1f}, {ratio(r, 'x_classic_busy')} | "
              f"{r['request_tps_median']:.1f} | "
              f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['peak_rss_mb']:.0f} |")

if __name__ == "__main__":
    main()
