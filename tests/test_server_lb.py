"""test_server_lb.py - three `dflash serve` replicas behind HAProxy, run with
deploy/haproxy.cfg as shipped (only its addresses come from the environment),
all on 127.0.0.1, with concurrent openai clients (threads, streaming and not):

- affinity: the same X-Session-Id header, or the same OpenAI `user` field,
  reaches the same replica, and the keys spread over all three; a chat's
  second turn finds its first turn's tokens in that replica's prefix cache;
- kill -9 a replica mid-run: every non-streamed request completes (HAProxy
  retries it on another replica; a long one cut mid-generation comes back
  with the same greedy text), a stream cut on the dead replica ends with an
  error the client sees (no hang, no silent truncation), HAProxy marks it
  down; restarted on its port, it rejoins and its sessions come back to it;
- SIGTERM another replica: its running requests (a stream and a long
  non-streamed one) finish whole, its /health answers 503 "draining", a new
  request sent to it straight gets 503 with Retry-After, no balanced request
  reaches it after the signal, and it exits 0;
- reports requests completed, failed, cut, and HAProxy's retries and
  redispatches (its stats CSV).

The replicas run SmolLM2-135M (build/smollm2, as tests/test_smollm2.py; about
100 tokens/s on one thread) with one compute thread each: the built-in model
answers 400 tokens in 50 ms, too fast for a kill to land in a request. A
missing haproxy or model fails under CI=true and skips elsewhere."""
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import openai

from testlib import check, finish, missing, serve

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("DFLASH_BIN") or os.path.join(SRC, "build", "dflash")
MODEL = os.environ.get("DFLASH_SMOLLM2") or os.path.join(
    SRC, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
CFG = os.path.join(SRC, "deploy", "haproxy.cfg")
NAMES = ("r1", "r2", "r3")
# Eight slots: the five load clients and a pinned pair never queue on one replica, so
# the pair is running (not queued) when the kill or the drain lands.
REPLICA = ["-m", MODEL, "-t", "1", "-c", "1024", "--parallel", "8", "--shutdown-grace", "60"]
SHORT = 12          # max_tokens of the background load
LONG = 240          # of the requests a kill or a drain must land in (about 3-6 s here)
CLIENT_TIMEOUT = 60
PROMPT = "Write a short story about a lighthouse keeper."


def http(url, body=None, timeout=10):
    """(status, headers, text) of a GET, or of a POST of body (a dict); status 0 when the
    connection failed (text says why)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()
    except OSError as e:
        return 0, {}, f"{type(e).__name__}: {e}"


def wait_for(cond, limit_s, step=0.1):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


class Replica:
    def __init__(self, name, tmp):
        self.name, self.tmp, self.port, self.p, self.n = name, tmp, 0, None, 0

    def start(self):
        """Starts (the first time on a free port, then on the same one); True once healthy."""
        self.n += 1
        log = open(os.path.join(self.tmp, f"{self.name}-{self.n}.log"), "w")
        self.p, url = serve(BIN, [*REPLICA, "--host", "127.0.0.1", "--port", str(self.port)],
                            log)
        log.close()
        if url:
            self.port = int(url.rsplit(":", 1)[1])
        return url is not None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def log(self):
        with open(os.path.join(self.tmp, f"{self.name}-{self.n}.log")) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, wait_s=90):
        if not self.p or self.p.poll() is not None:
            return self.p.returncode if self.p else None
        self.p.send_signal(sig)
        try:
            return self.p.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return "hang"


class Balancer:
    def __init__(self, tmp, replicas):
        self.api, self.stats_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = {**os.environ, "DFLASH_LB_BIND": self.api, "DFLASH_LB_STATS": self.stats_addr}
        for r in replicas:
            env[f"DFLASH_{r.name.upper()}"] = f"127.0.0.1:{r.port}"
        self.logf = open(os.path.join(tmp, "haproxy.log"), "w")
        self.p = subprocess.Popen(["haproxy", "-db", "-f", CFG], env=env, stdout=self.logf,
                                  stderr=self.logf)

    def servers(self):
        """The backend's rows of the stats CSV by name (r1.., BACKEND); {} when unreachable."""
        code, _, text = http(f"http://{self.stats_addr}/stats;csv", timeout=5)
        if code != 200:
            return {}
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {row["svname"]: row for row in rows if row["pxname"] == "dflash"}

    def state(self, name):
        return (self.servers().get(name) or {}).get("status", "")

    def stop(self):
        self.p.terminate()
        self.p.wait(10)
        self.logf.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Clients:
    """Requests through the balancer; every outcome is recorded for the report."""

    def __init__(self, base):
        self.c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                               timeout=CLIENT_TIMEOUT)
        self.model = self.c.models.list().data[0].id
        self.mu = threading.Lock()
        self.results = []

    def body(self, n, user=None, messages=None):
        b = {"model": self.model, "temperature": 0, "max_tokens": n,
             "messages": messages or [{"role": "user", "content": PROMPT}],
             "extra_body": {"ignore_eos": True}}
        if user:
            b["user"] = user
        return b

    def raw_body(self, n):
        """body(n) as JSON for a plain HTTP POST."""
        b = self.body(n)
        return {**{k: v for k, v in b.items() if k != "extra_body"}, **b["extra_body"]}

    def ask(self, n, session=None, user=None, stream=False, first=None, messages=None):
        """One request; returns its record: kind, session, replica, ok, text, finish, error, t0,
        t1, and usage (prompt, cached) when not streamed. first (an Event) is set when a stream's
        first content arrives."""
        rec = {"kind": "stream" if stream else "plain", "session": session or user, "replica": None,
               "ok": False, "text": "", "finish": None, "error": None, "t0": time.monotonic()}
        hdr = {"X-Session-Id": session} if session else None
        try:
            raw = self.c.chat.completions.with_raw_response.create(
                **self.body(n, user, messages), stream=stream, extra_headers=hdr)
            rec["replica"] = raw.headers.get("x-dflash-replica")
            out = raw.parse()
            if stream:
                for ch in out:
                    for c in ch.choices:
                        rec["text"] += c.delta.content or ""
                        rec["finish"] = c.finish_reason or rec["finish"]
                    if first and rec["text"]:
                        first.set()
            else:
                rec["text"], rec["finish"] = out.choices[0].message.content, out.choices[0].finish_reason
                details = out.usage.prompt_tokens_details
                rec["usage"] = (out.usage.prompt_tokens, details.cached_tokens if details else 0)
            rec["ok"] = rec["finish"] == "length"
            if not rec["ok"]:
                rec["error"] = f"ended without a finish_reason ({rec['finish']})"
        except Exception as e:  # noqa: BLE001 - recorded and judged by the caller
            rec["error"] = f"{type(e).__name__}: {e}"
        rec["t1"] = time.monotonic()
        if first:
            first.set()
        with self.mu:
            self.results.append(rec)
        return rec

    def background(self, k, stop, stream):
        """A client that asks until stop is set, each request with a new session key."""
        n = 0
        while not stop.is_set():
            n += 1
            self.ask(SHORT, session=f"load-{k}-{n}", stream=stream)


def in_thread(fn, *args, **kw):
    box = {}
    th = threading.Thread(target=lambda: box.update(r=fn(*args, **kw)), daemon=True)
    th.start()
    return th, box


def affinity(cl):
    """Session keys by the replica they reach; checks the keys stick and spread."""
    by = {n: [] for n in NAMES}
    stuck = True
    for i in range(12):
        a = cl.ask(2, session=f"chat-{i}")
        b = cl.ask(2, session=f"chat-{i}")
        stuck &= a["ok"] and a["replica"] == b["replica"]
        if a["replica"] in by:
            by[a["replica"]].append(f"chat-{i}")
    check(stuck, "affinity: each X-Session-Id reaches the same replica twice")
    check(all(by.values()), f"affinity: the keys spread over all three replicas: {by}")
    users = [(cl.ask(2, user=f"user-{i}")["replica"], cl.ask(2, user=f"user-{i}")["replica"])
             for i in range(6)]
    check(all(a and a == b for a, b in users) and len({a for a, _ in users}) > 1,
          f"affinity: the body's `user` field sticks and spreads: {users}")
    # A second turn reaches the replica of the first, whose slot holds the first turn's tokens.
    turns = []
    for i in range(3):
        chat = [{"role": "user", "content": f"{PROMPT} Number {i}."}]
        a = cl.ask(16, user=f"talk-{i}", messages=chat)
        chat += [{"role": "assistant", "content": a["text"]}, {"role": "user", "content": "Go on."}]
        b = cl.ask(16, user=f"talk-{i}", messages=chat)
        turns.append((a["replica"], b["replica"], a.get("usage"), b.get("usage")))
    print(f"two-turn chats (replica 1, replica 2, (prompt, cached) 1, 2): {turns}")
    check(all(ra and ra == rb and ub and ub[1] >= ua[0] for ra, rb, ua, ub in turns),
          f"affinity: a second turn reuses the first turn's cache (replicas, (prompt, cached)): {turns}")
    return by


def pinned_pair(cl, session):
    """A long stream and a long non-streamed request on session's replica, both
    running when this returns; (threads and their result boxes)."""
    pl = in_thread(cl.ask, LONG, session=session)
    time.sleep(0.3)
    first = threading.Event()
    st = in_thread(cl.ask, LONG, session=session, stream=True, first=first)
    first.wait(CLIENT_TIMEOUT)   # the stream, sent after it, generates: so does the other
    time.sleep(0.3)
    return st, pl


def kill_and_rejoin(cl, lb, victim, session, reference):
    (st_th, st), (pl_th, pl) = pinned_pair(cl, session)
    t_kill = time.monotonic()
    victim.p.kill()
    victim.p.wait()
    pl_th.join(CLIENT_TIMEOUT)
    st_th.join(CLIENT_TIMEOUT)
    p, s = pl.get("r") or {}, st.get("r") or {}
    check(p.get("ok") and p.get("replica") != victim.name and p.get("text") == reference,
          f"kill: the non-streamed request cut on {victim.name} completes elsewhere with the same "
          f"text (on {p.get('replica')}: {p.get('error')})")
    check(s.get("replica") == victim.name and not s.get("ok") and s.get("error") and
          s["t1"] - t_kill < 10, f"kill: the stream on {victim.name} ends with an error the client sees "
          f"within 10 s: {s.get('error')!r} after {s.get('t1', 0) - t_kill:.1f} s")
    check(wait_for(lambda: lb.state(victim.name).startswith("DOWN"), 10),
          f"kill: HAProxy marks {victim.name} down ({lb.state(victim.name)})")
    time.sleep(1)
    check(victim.start(), f"restart: {victim.name} loads again on port {victim.port}")
    check(wait_for(lambda: lb.state(victim.name) == "UP", 15),
          f"restart: HAProxy marks {victim.name} up again ({lb.state(victim.name)})")
    t_up = time.monotonic()
    back = cl.ask(2, session=session)
    check(back["ok"] and back["replica"] == victim.name,
          f"restart: {victim.name}'s session comes back to it ({back['replica']})")
    time.sleep(2)
    with cl.mu:
        served = sum(1 for r in cl.results if r["replica"] == victim.name and r["t0"] > t_up)
    check(served > 1, f"restart: {victim.name} serves traffic again ({served} requests)")
    return t_kill


def drain(cl, lb, victim, session):
    (st_th, st), (pl_th, pl) = pinned_pair(cl, session)
    t_term = time.monotonic()
    victim.p.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    code, _, text = http(victim.url + "/health")
    check(code == 503 and text == '{"status":"draining"}',
          f"drain: {victim.name}'s /health answers 503 draining ({code} {text})")
    code, hdrs, text = http(victim.url + "/v1/chat/completions", cl.raw_body(4))
    check(code == 503 and hdrs.get("Retry-After") == "1",
          f"drain: a new request sent to {victim.name} straight gets 503 with Retry-After ({code} {text})")
    check(wait_for(lambda: lb.state(victim.name).startswith("DOWN"), 10),
          f"drain: HAProxy marks {victim.name} down ({lb.state(victim.name)})")
    pl_th.join(CLIENT_TIMEOUT)
    st_th.join(CLIENT_TIMEOUT)
    for what, box in (("stream", st), ("non-streamed request", pl)):
        r = box.get("r") or {}
        check(r.get("ok") and r.get("replica") == victim.name,
              f"drain: the running {what} finishes whole on {victim.name}: {r.get('error')}")
    rc = victim.stop(wait_s=60)
    check(rc == 0, f"drain: {victim.name} exits 0 once its requests are done (got {rc})")
    with cl.mu:
        late = [r for r in cl.results if r["replica"] == victim.name and r["t0"] > t_term + 0.1 and
                r["session"] != session]
    check(not late, f"drain: no balanced request reaches {victim.name} after SIGTERM ({len(late)})")
    return t_term


def report(cl, lb, t_kill, victim):
    res = cl.results
    plain = [r for r in res if r["kind"] == "plain"]
    streams = [r for r in res if r["kind"] == "stream"]
    be = lb.servers().get("BACKEND", {})
    cut = [r for r in streams if not r["ok"]]
    print(f"non-streamed: {sum(r['ok'] for r in plain)} completed, "
          f"{sum(not r['ok'] for r in plain)} failed; streams: {sum(r['ok'] for r in streams)} "
          f"completed, {len(cut)} cut; HAProxy: {be.get('wretr')} retries, {be.get('wredis')} "
          f"redispatches, {be.get('stot')} requests")
    for r in cut:
        print(f"  stream cut on {r['replica']} after {len(r['text'])} characters: {r['error'][:120]}")
    for name in NAMES:
        row = lb.servers().get(name, {})
        print(f"  {name}: {row.get('stot')} requests, {row.get('wretr')} retries, "
              f"{row.get('wredis')} redispatches, {row.get('status')}")
    lost = [r for r in plain if not r["ok"]]
    check(not lost, f"0 lost non-streamed requests ({len(lost)}: {[r['error'] for r in lost[:3]]})")
    wrong = [r for r in cut if r["replica"] != victim.name or r["t1"] < t_kill]
    check(not wrong, f"only streams on the killed replica are cut ({[r['error'] for r in wrong[:3]]})")
    check(int(be.get("wretr") or 0) + int(be.get("wredis") or 0) > 0, "HAProxy retried requests")


def main():
    if not shutil.which("haproxy"):
        missing("haproxy (Debian package haproxy; scripts/deps.sh)")
        return finish()
    if not os.path.exists(MODEL):
        missing(f"{MODEL} (make model)")
        return finish()
    with tempfile.TemporaryDirectory(prefix="dflash-lb-") as tmp:
        reps = [Replica(n, tmp) for n in NAMES]
        lb = None
        try:
            if not all(check(r.start(), f"{r.name} starts") for r in reps):
                return finish()
            lb = Balancer(tmp, reps)
            if not check(wait_for(lambda: all(lb.state(n) == "UP" for n in NAMES), 20),
                         f"HAProxy sees three replicas up: {[lb.state(n) for n in NAMES]}"):
                return finish()
            cl = Clients(f"http://{lb.api}")
            # The reference answer, straight from one replica.
            code, _, text = http(reps[0].url + "/v1/chat/completions", cl.raw_body(LONG),
                                 timeout=CLIENT_TIMEOUT)
            if not check(code == 200, f"the reference answer ({code} {text[:200]})"):
                return finish()
            reference = json.loads(text)["choices"][0]["message"]["content"]
            by = affinity(cl)
            if not all(by.values()):
                return finish()
            stop = threading.Event()
            load = [threading.Thread(target=cl.background, args=(k, stop, k >= 3), daemon=True)
                    for k in range(5)]
            for th in load:
                th.start()
            time.sleep(1.5)
            t_kill = kill_and_rejoin(cl, lb, reps[1], by["r2"][0], reference)
            drain(cl, lb, reps[2], by["r3"][0])
            stop.set()
            for th in load:
                th.join(CLIENT_TIMEOUT)
            report(cl, lb, t_kill, reps[1])
        finally:
            if lb:
                lb.stop()
            for r in reps:
                rc = r.stop()
                if not check(rc in (None, 0), f"{r.name} exits 0 on SIGTERM (got {rc})"):
                    print(r.log()[-1500:])
            if os.environ.get("DFLASH_LB_KEEP"):
                shutil.copytree(tmp, os.environ["DFLASH_LB_KEEP"], dirs_exist_ok=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
