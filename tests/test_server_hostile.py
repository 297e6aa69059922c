"""test_server_hostile.py - dflash serve under hostile clients (issue 18, item 8).

1. Slowloris: hundreds of connections that trickle header bytes, from one
   address and from several loopback addresses (127.0.0.x), plus idle ones and
   a slow body. Meanwhile /health and a real completion (plain and streamed)
   answer promptly from another address; the per-address limit holds; every
   trickler is cut by --read-timeout, however steadily it sends.
2. Request memory: 16 clients each send an 8 MiB body at once to /tokenize,
   /v1/chat/completions and /v1/completions (long strings, long token arrays,
   many messages). Each gets a clear answer (OpenAI error shape), the server's
   peak RSS (VmHWM) stays under the bound docs/server.md states, and it serves
   a normal request afterwards. Heavy permits: with --heavy-requests slow large
   bodies in flight, one more gets 503 with Retry-After, and is admitted once
   the deadline has cut them.
3. Over-long prompts name the right field: "prompt" for /v1/completions,
   "messages" for chat, "content" for /tokenize.

Runs the built-in tiny model (models/default), two servers; about 13 s.
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import check, finish, missing  # noqa: E402

SRC = os.environ.get("DFLASH_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DFLASH_BIN", os.path.join(SRC, "build", "dflash"))
READ_TIMEOUT = 4        # --read-timeout for the attack, seconds
PER_IP = 32             # --max-connections-per-ip
HEAVY = 2               # --heavy-requests
MAX_BODY = 8 << 20      # the default --max-body; the bodies below are exactly this big
LEGIT = "127.0.0.200"   # the well-behaved client's address
SANITIZED = False       # set in main: a sanitizer build
SLOW = 1                # time limits are this many times longer under a sanitizer
MiB = 1 << 20


def start_server(name, read_timeout):
    args = [BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--read-timeout", str(read_timeout),
            "--max-connections-per-ip", str(PER_IP), "--max-connections", "1024",
            "--heavy-requests", str(HEAVY), "--temp", "0"]
    log = open(os.path.join(WORK, f"server-{name}.log"), "w+")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    port = None
    for _ in range(1200):
        log.seek(0)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read())
        if m:
            port = int(m.group(1))
            if status("GET", port, "/health")[0] == 200:
                return p, port, log
        if p.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    print(log.read())
    p.kill()
    raise SystemExit("the server did not start")


def request(method, port, path, body=None, src=LEGIT, timeout=30):
    """(status, headers, parsed JSON or text, seconds)."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        try:
            out = json.loads(raw)
        except ValueError:
            out = raw.decode("utf-8", "replace")
        return r.status, dict(r.getheaders()), out, time.monotonic() - t0
    except (OSError, http.client.HTTPException) as e:
        return -1, {}, str(e), time.monotonic() - t0
    finally:
        c.close()


def status(method, port, path, body=None):
    return request(method, port, path, body)[0::3]


def is_error(out, param=None):
    e = out.get("error") if isinstance(out, dict) else None
    return (isinstance(e, dict) and isinstance(e.get("message"), str) and e["message"] and
            "type" in e and "code" in e and "param" in e and (param is None or e["param"] == param))


def sanitized():
    """A sanitizer build: its allocator keeps freed memory in quarantine, so RSS says nothing."""
    try:
        out = subprocess.run(["ldd", BIN], capture_output=True, text=True).stdout
    except OSError:
        return False
    return "libasan" in out or "libtsan" in out


def rss_ok(hwm, bound, what):
    if SANITIZED:
        print(f"(under a sanitizer, not checked: {what} {hwm / MiB:.0f} MiB <= {bound / MiB:.0f} MiB)")
        return
    check(hwm <= bound, f"{what} {hwm / MiB:.0f} MiB <= {bound / MiB:.0f} MiB")


def rss(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


# ---- 1. slowloris ------------------------------------------------------------------

class Trickler:
    """Sockets that send a request's bytes one at a time; notes when the server cuts each."""

    def __init__(self, port):
        self.port = port
        self.socks = []   # [socket, bytes still to send, time opened, time cut or None, source]
        self.stop = False

    def open(self, src, n, head, rest):
        for _ in range(n):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.bind((src, 0))
                s.connect(("127.0.0.1", self.port))
                s.sendall(head)
            except OSError:
                s.close()
                continue
            s.setblocking(False)
            self.socks.append([s, rest, time.monotonic(), None, src])

    def alive(self, src=None):
        return [e for e in self.socks if e[3] is None and src in (None, e[4])]

    def run(self, period=0.25):
        while not self.stop:
            now = time.monotonic()
            for e in self.alive():
                s = e[0]
                try:
                    if s.recv(4096) == b"":
                        e[3] = now
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    e[3] = now
                    continue
                if e[1]:
                    try:
                        s.send(e[1][:1])
                        e[1] = e[1][1:] or b"X-Pad: " + b"a" * 64   # never ends the headers
                    except BlockingIOError:
                        pass
                    except OSError:
                        e[3] = now
            time.sleep(period)

    def close(self):
        self.stop = True
        for e in self.socks:
            e[0].close()


def slowloris(port):
    header = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"Content-Type: application/json\r\n")
    t = Trickler(port)
    t0 = time.monotonic()
    t.open("127.0.0.1", 300, *header)                # one address: the per-address limit holds
    for k in range(2, 12):                           # ten more addresses, 30 each
        t.open(f"127.0.0.{k}", 30, *header)
    t.open("127.0.0.12", 20, b"", b"")                # connect and say nothing
    body = b'{"prompt": "x", "max_tokens": 2}' + b" " * 400   # headers whole, then a body too slow
    t.open("127.0.0.13", 10, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
           % len(body), body)
    th = threading.Thread(target=t.run, daemon=True)
    th.start()
    time.sleep(0.8)
    held, from_one = len(t.alive()), len(t.alive("127.0.0.1"))
    print(f"slowloris: {held} connections held ({from_one} of 300 from 127.0.0.1)", flush=True)
    # Without the per-address limit all 300 would be held; MHD closes the rest at once.
    check(0 < from_one <= PER_IP, f"one address holds at most --max-connections-per-ip ({from_one})")
    check(held >= 300, f"the attack holds hundreds of connections ({held})")

    # During the attack: /health and real completions answer promptly.
    for i in range(3):
        st, _, out, dt = request("GET", port, "/health")
        check(st == 200 and dt < 1.0 * SLOW, f"/health under attack: {st} in {dt:.2f} s")
    st, _, out, dt = request("POST", port, "/v1/completions",
                             {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    check(st == 200 and out["choices"][0]["text"] is not None and dt < 2.0 * SLOW,
          f"a completion under attack: {st} in {dt:.2f} s")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(LEGIT, 0))
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True}))
    r = c.getresponse()
    events = [ln for ln in r.read().decode().split("\n") if ln.startswith("data: ")]
    c.close()
    check(r.status == 200 and events and events[-1] == "data: [DONE]" and len(events) >= 3,
          f"a streamed chat under attack: {r.status}, {len(events)} events")
    check(time.monotonic() - t0 < READ_TIMEOUT, "those answers came before the deadline cut anyone")

    # The deadline: everyone cut after READ_TIMEOUT (+ the watcher's period and slack).
    while t.alive() and time.monotonic() - t0 < READ_TIMEOUT + 5:
        time.sleep(0.1)
    left = len(t.alive())
    cuts = [e[3] - e[2] for e in t.socks if e[3] is not None]
    early = [d for d in cuts if d < READ_TIMEOUT - 0.5]
    check(left == 0, f"every trickler cut by --read-timeout {READ_TIMEOUT} s ({left} left)")
    # Those over the per-address limit are closed at once; the rest only at the deadline.
    check(len(cuts) - len(early) >= held - 2, f"held connections last until the deadline "
          f"({len(cuts) - len(early)} of {held})")
    late = [d for d in cuts if d >= READ_TIMEOUT - 0.5]
    if late:
        print(f"slowloris: cut after {min(late):.2f} .. {max(late):.2f} s", flush=True)
    t.close()
    th.join()
    st, dt = status("GET", port, "/health")
    check(st == 200, "/health after the attack")


# ---- 2. memory ---------------------------------------------------------------------

def pad_json(prefix, filler, suffix, size=MAX_BODY):
    """prefix + filler repeated + suffix, exactly size bytes (filler: one unit)."""
    n = (size - len(prefix) - len(suffix)) // len(filler)
    body = prefix + filler * n + suffix
    return body + b" " * (size - len(body))


def big_bodies():
    """Sixteen 8 MiB bodies: (path, body, what)."""
    s = [
        ("/tokenize", pad_json(b'{"content": "', b"a", b'"}'), "tokenize a long string"),
        ("/tokenize", pad_json(b'{"content": "', b"word ", b'", "with_pieces": true}'),
         "tokenize words with pieces"),
        ("/v1/chat/completions", pad_json(b'{"messages": [{"role": "user", "content": "', b"hi ",
                                          b'"}], "max_tokens": 4}'), "chat: one long message"),
        ("/v1/chat/completions", pad_json(b'{"messages": [', b'{"role": "user", "content": "a"},',
                                          b'{"role": "user", "content": "a"}], "max_tokens": 4}'),
         "chat: many short messages"),
        ("/v1/completions", pad_json(b'{"prompt": "', b"x", b'", "max_tokens": 4}'),
         "completions: a long string"),
        ("/v1/completions", pad_json(b'{"prompt": [', b"1,", b'1], "max_tokens": 4}'),
         "completions: a long token array"),
        ("/v1/completions", pad_json(b'{"prompt": "a", "logit_bias": {', b'"1": 1,', b'"1": 1}}'),
         "completions: a huge object"),
        ("/v1/completions", pad_json(b'{"prompt": "', b"\\u00e9", b'"}'), "completions: escapes"),
    ]
    return s + s   # 16


def memory(port, pid):
    for _ in range(2):   # warm: the first requests allocate the model's working buffers
        request("POST", port, "/v1/completions", {"prompt": "Hello", "max_tokens": 8})
        request("POST", port, "/tokenize", {"content": "Hello world " * 100})
    base = rss(pid, "VmRSS")
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")   # resets VmHWM to the current RSS
    bound = base + HEAVY * 3 * MAX_BODY + 64 * MiB   # docs/server.md, "Limits"
    bodies = big_bodies()
    results = [None] * len(bodies)

    def send(i):
        path, body, _ = bodies[i]
        results[i] = request("POST", port, path, body, src=f"127.0.1.{i + 1}", timeout=60)

    ths = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    t0 = time.monotonic()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    hwm = rss(pid, "VmHWM")
    codes = {}
    for (path, body, what), (st, hdr, out, dt) in zip(bodies, results):
        codes[st] = codes.get(st, 0) + 1
        ok = st in (400, 413, 503) and is_error(out)
        if st == 503:
            ok = ok and hdr.get("Retry-After") == "1"
        check(ok, f"8 MiB body, {what}: {st} {str(out)[:160]}")
    print(f"memory: 16 x 8 MiB in {time.monotonic() - t0:.1f} s, answers {codes}; RSS before "
          f"{base / MiB:.0f} MiB, peak {hwm / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB", flush=True)
    rss_ok(hwm, bound, "peak RSS")
    check(codes.get(400, 0) + codes.get(413, 0) >= HEAVY, "some bodies were parsed and refused")

    # One at a time, each kind is parsed and refused for what it is.
    expect = [(400, "content"), (400, "content"), (400, "messages"), (413, None), (400, "prompt"),
              (413, None), (413, None), (400, "prompt")]   # big_bodies' order
    for (path, body, what), want in zip(bodies, expect):
        st, _, out, _ = request("POST", port, path, body, timeout=60)
        check(st == want[0] and is_error(out, want[1]), f"alone, {what}: {st} {str(out)[:160]}")
    hwm = rss(pid, "VmHWM")
    rss_ok(hwm, bound, "peak RSS after those")

    # A body under the budget is tokenized; the server still answers normally.
    st, _, out, _ = request("GET", port, "/props")
    n_ctx = out["default_generation_settings"]["n_ctx"] if st == 200 else 0
    st, _, out, _ = request("POST", port, "/tokenize", {"content": "ab " * (n_ctx * 32 // 3 - 10)})
    check(st == 200 and len(out.get("tokens", [])) > n_ctx, f"/tokenize within the budget: {st}")
    st, _, out, _ = request("POST", port, "/v1/completions", {"prompt": "Hello", "max_tokens": 8})
    check(st == 200 and out["choices"][0]["text"] is not None, "a completion after the flood")


def heavy_permits(port):
    """HEAVY slow large bodies hold the permits; one more gets 503 until they are cut."""
    socks = []
    for k in range(HEAVY):
        s = socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.2.{k + 1}", 0))
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{\"content\": \""
                  % MiB)
        socks.append(s)
    time.sleep(0.3)
    t0 = time.monotonic()
    body = pad_json(b'{"content": "', b"a", b'"}', MiB)
    st, hdr, out, _ = request("POST", port, "/tokenize", body)
    check(st == 503 and is_error(out) and out["error"].get("code") == "server_busy" and
          hdr.get("Retry-After") == "1", f"a large body while {HEAVY} hold the permits: {st} {out}")
    time.sleep(max(0, READ_TIMEOUT + 1 - (time.monotonic() - t0)))
    st, hdr, out, _ = request("POST", port, "/tokenize", body)
    check(st == 400 and is_error(out, "content"), f"admitted once the deadline cut them: {st}")
    for s in socks:
        s.close()


# ---- 3. the field an over-long prompt names ----------------------------------------

def params(port):
    st, _, out, _ = request("GET", port, "/props")
    n_ctx = out["default_generation_settings"]["n_ctx"]
    for text, what in (("word " * (n_ctx + 10), "over the context"),
                       ("word " * (n_ctx * 8), "over the byte budget")):
        st, _, out, _ = request("POST", port, "/v1/completions", {"prompt": text})
        check(st == 400 and is_error(out, "prompt") and out["error"]["code"] ==
              "context_length_exceeded", f"completions, prompt {what}: {st} {out}")
        st, _, out, _ = request("POST", port, "/v1/completions", {"prompt": [text]})
        check(st == 400 and is_error(out, "prompt"), f"completions, [prompt] {what}: {st}")
        st, _, out, _ = request("POST", port, "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": text}]})
        check(st == 400 and is_error(out, "messages") and out["error"]["code"] ==
              "context_length_exceeded", f"chat, content {what}: {st} {out}")
    st, _, out, _ = request("POST", port, "/tokenize", {"content": "word " * (n_ctx * 8)})
    check(st == 400 and is_error(out, "content"), f"/tokenize over the budget: {st} {out}")


def run_server(name, read_timeout, phases, log_checks):
    """Starts a server, runs phases(port, pid), stops it; checks its exit and log."""
    p, port, log = start_server(name, read_timeout)
    try:
        phases(port, p.pid)
        p.terminate()
        rc = p.wait(timeout=30)
        check(rc == 0, f"{name}: exit status {rc} on SIGTERM")
    finally:
        if p.poll() is None:
            p.kill()
        log.seek(0)
        text = log.read()
        if "Sanitizer" in text or counts_failed():
            print(text[-4000:])
        check("Sanitizer" not in text, f"{name}: no sanitizer report")
        log_checks(text)


def attack_log(text):
    http_lines = text.count("dflash serve: http:")
    check(http_lines <= 40, f"the attack's log is rate-limited ({http_lines} HTTP lines)")
    check("within --read-timeout" in text, "the log says tricklers were cut")


def main():
    global SANITIZED, SLOW, READ_TIMEOUT
    if not os.access(BIN, os.X_OK):
        check(False, f"no dflash binary at {BIN}")
        return finish()
    if subprocess.run([BIN, "serve", "--help"], capture_output=True).returncode:
        missing("dflash serve (libmicrohttpd) in this build")
        return finish()
    SANITIZED = sanitized()
    if SANITIZED:   # everything runs several times slower
        SLOW, READ_TIMEOUT = 4, 10
    run_server("attack", READ_TIMEOUT,
               lambda port, pid: (params(port), slowloris(port), heavy_permits(port)), attack_log)
    # The flood gets a deadline it cannot reach on a slow machine: 128 MiB are sent.
    run_server("flood", 120, memory, lambda text: None)
    return finish()


def counts_failed():
    from testlib import failed
    return failed()


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory(prefix="dflash-hostile.") as WORK:
        sys.exit(main())
