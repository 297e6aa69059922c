"""test_server_provenance.py - return_provenance on dflash serve, with the built-in
model pair (models/default: always in the repository, fast, and its drafter is
accepted often, so every kind of token shows up):

- each streamed choice carries the kinds of the tokens committed since its last
  chunk ('c' classic step, 'd' accepted draft, 'b' the round's bonus); over the
  stream there is one letter per generated token, and the letters add up to the
  final chunk's stats: d == accepted, d + b == committed, c == classic_steps, and
  the rounds (d* b groups, the last may lack its b) == rounds;
- block 1 is all classic; blocks 4 and 8 and the adaptive policy speculate;
- a non-streamed answer carries the same letters as the stream (fixed block);
- a stop string that ends generation inside a round's accepted drafts still adds up;
- n = 2: each choice's letters, summed, add up to the request's summed stats;
- /v1/completions carries them too, streamed and not;
- off by default, and a non-boolean is a 400 naming the field.
"""
import json
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request

from testlib import check, failed, finish, serve, stop

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("DFLASH_BIN") or os.path.join(SRC, "build", "dflash")
PROMPT = "Tell me a joke about computers."


def post(url, body, path="/v1/chat/completions"):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def body(**kw):
    b = {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 120,
         "return_provenance": True}
    b.update(kw)
    return b


def stream(url, **kw):
    """(letters per choice index, content per choice, the final chunks' dflash stats)."""
    status, text = post(url, body(stream=True, **kw))
    check(status == 200, f"stream {kw}: status {status}: {text[:300]}")
    letters, content, stats = {}, {}, []
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        o = json.loads(line[6:])
        for c in o.get("choices", []):
            i = c["index"]
            letters[i] = letters.get(i, "") + c.get("provenance", "")
            content[i] = content.get(i, "") + (c.get("delta", {}).get("content") or "")
        if "dflash" in o and o.get("choices"):
            stats.append((o["dflash"], o["timings"]))
    return letters, content, stats


def rounds_of(s):
    """The rounds in a letter string: each d* b group, and a last run of d without its b."""
    return len(re.findall(r"d*b|d+$", s.replace("c", " ")))


def adds_up(s, st, what):
    ok = (set(s) <= set("cdb") and s.count("d") == st["accepted"] and
          s.count("d") + s.count("b") == st["committed"] and s.count("c") == st["classic_steps"] and
          rounds_of(s) == st["rounds"] and not re.search(r"dc", s))
    check(ok, f"{what}: letters {s!r} add up to the stats {st}")


def checks(url):
    for block in (1, 4, 8, 0):
        letters, content, stats = stream(url, block_size=block)
        s = letters.get(0, "")
        check(len(stats) == 1, f"block {block}: one final chunk with stats")
        if not stats:
            continue
        st, t = stats[0]
        check(len(s) == t["predicted_n"], f"block {block}: {len(s)} letters for "
              f"{t['predicted_n']} tokens")
        adds_up(s, st, f"block {block}")
        if block == 1:
            check(s and set(s) == {"c"}, f"block 1 is classic: {s!r}")
        else:
            check("d" in s and "b" in s, f"block {block} speculates and is accepted: {s!r}")
        if block in (1, 8):
            status, text = post(url, body(block_size=block))
            o = json.loads(text)
            got = o["choices"][0].get("provenance")
            check(status == 200 and got == s, f"block {block}: the whole answer's letters equal "
                  f"the stream's: {got!r} vs {s!r}")
            check(o["choices"][0]["message"]["content"] == content.get(0),
                  f"block {block}: the whole answer equals the stream")
            adds_up(got or "", o["dflash"], f"block {block}, not streamed")

    # a stop string inside a round: find a text reached by an accepted draft
    letters, content, stats = stream(url, block_size=8)
    s, text = letters.get(0, ""), content.get(0, "")
    cut = text[len(text) // 2:len(text) // 2 + 3]
    if check(len(cut) == 3, f"a stop string from the answer {text!r}"):
        letters, content, stats = stream(url, block_size=8, stop=[cut])
        check(content.get(0) == text[:text.index(cut)], f"stop {cut!r} ends the text before it")
        if stats:
            adds_up(letters.get(0, ""), stats[0][0], f"stop {cut!r}")

    # n = 2: greedy choices are equal, and together add up to the summed stats
    letters, content, stats = stream(url, block_size=8, n=2)
    both = letters.get(0, "") + letters.get(1, "")
    check(letters.get(0) and letters.get(0) == letters.get(1), f"n=2: the choices' letters {letters}")
    status, text = post(url, body(block_size=8, n=2))
    o = json.loads(text)
    got = "".join(c.get("provenance", "") for c in o.get("choices", []))
    check(status == 200 and got == both, f"n=2 not streamed: {got!r} vs {both!r}")
    st = o.get("dflash", {})
    check(got.count("d") == st.get("accepted") and got.count("c") == st.get("classic_steps") and
          got.count("d") + got.count("b") == st.get("committed"), f"n=2: letters add up to {st}")

    # completions: the same field
    comp = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 60, "block_size": 4,
            "return_provenance": True}
    status, text = post(url, comp, "/v1/completions")
    o = json.loads(text)
    whole = o["choices"][0].get("provenance", "") if status == 200 else ""
    check(len(whole) == o.get("usage", {}).get("completion_tokens"), f"completions: letters {whole!r}")
    adds_up(whole, o.get("dflash", {}), "completions")
    status, text = post(url, dict(comp, stream=True), "/v1/completions")
    streamed = "".join(c.get("provenance", "") for line in text.splitlines()
                       if line.startswith("data: {") for c in json.loads(line[6:]).get("choices", []))
    check(streamed == whole, f"completions streamed: {streamed!r} vs {whole!r}")

    # off by default; a wrong type names the field
    status, text = post(url, {k: v for k, v in body(stream=True).items() if k != "return_provenance"})
    check(status == 200 and "provenance" not in text, "no provenance unless asked for")
    status, text = post(url, body(return_provenance=1))
    check(status == 400 and json.loads(text)["error"].get("param") == "return_provenance",
          f"return_provenance: 1 is a 400 naming it: {text[:200]}")


def main():
    with tempfile.TemporaryDirectory(prefix="dflash-prov-") as tmp:
        with open(os.path.join(tmp, "serve.log"), "w") as log:
            p, url = serve(BIN, ["-t", "2", "--parallel", "2"], log)
            try:
                if check(url, "serve (built-in model) reports its address"):
                    checks(url)
            finally:
                check(stop(p) == 0, "serve exits 0 on SIGTERM")
            if failed():
                print(open(log.name).read()[-3000:])
    return finish()


if __name__ == "__main__":
    sys.exit(main())
