"""test_webui.py - the chat page at / of dflash serve, in a real browser: Debian's
chromium, headless, driven by selenium through Debian's chromium-driver.

With the built-in model pair (models/default: in the repository, fast, and its
drafter is accepted often, so all three colours show):
- the page loads from the binary (web/index.html compiled in), asks for the
  server's API key, names the model once given it, and every control has an
  accessible name;
- a prompt sent with a system prompt set streams an answer whose text equals
  `dflash generate --chat` on the same messages (greedy);
- the coloured tokens (one data-kinds letter per token) add up to the server's
  stats for that request, both as /metrics counts them and as the final chunk
  says, and the page's own counters show the same;
- "Compare with classic decode" finds the classic answer identical;
- a request the server refuses (temperature 5) shows its error in plain words;
- a screenshot is kept at build/webui_screenshot.png (CI keeps it as an artifact).
With SmolLM2 (build/smollm2, `make model`; slow enough to stop mid-answer): the
Stop button cancels the request on the server (the slot is freed, /metrics
counts a cancelled request) and the page says "Stopped.".
Without a browser, over HTTP: / is web/index.html byte for byte (text/html, a
Content-Security-Policy, no API key needed even when the server has one);
--path DIR serves DIR's files and nothing outside it or hidden; --no-webui
answers 404.
Chromium, its driver or selenium missing: a failure under CI=true, else a skip.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from testlib import check, failed, finish, missing, serve, stop

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("DFLASH_BIN") or os.path.join(SRC, "build", "dflash")
BUILD = os.environ.get("DFLASH_BUILD") or os.path.join(SRC, "build")
SHOT = os.path.join(BUILD, "webui_screenshot.png")
SMOL = os.environ.get("DFLASH_SMOLLM2") or os.path.join(
    SRC, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
SMOL_DRAFT = os.path.join(SRC, "models", "smollm2-135m-dflash")
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SYSTEM = "You are a witty assistant."
PROMPT = "Tell me a joke about computers."
MAX_TOKENS = 160
KEY = "webui-test-key"


def get(url, headers=None):
    """(status, headers, body bytes) of a GET; errors are answers too."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def file_checks(tmp):
    """The page's files over plain HTTP: compiled in, --path, --no-webui."""
    page = open(os.path.join(SRC, "web", "index.html"), "rb").read()
    site = os.path.join(tmp, "site")
    os.makedirs(os.path.join(site, "css"))
    for name, data in (("index.html", b"<p>mine</p>"), ("css/a.css", b"p{}"), (".secret", b"no")):
        with open(os.path.join(site, name), "wb") as f:
            f.write(data)
    with open(os.path.join(tmp, "secret.txt"), "wb") as f:
        f.write(b"outside")
    runs = ((["--api-key", "k"], "compiled in"), (["--path", site], "--path"), (["--no-webui"], "off"))
    for args, what in runs:
        with open(os.path.join(tmp, "files.log"), "w") as log:
            p, url = serve(BIN, ["-t", "2", *args], log)
            try:
                if not check(url, f"serve ({what}) reports its address"):
                    continue
                status, h, body = get(url + "/")
                if what == "compiled in":
                    check(status == 200 and body == page and h["Content-Type"].startswith("text/html")
                          and "default-src 'self'" in (h["Content-Security-Policy"] or ""),
                          f"/ is web/index.html without a key: {status} {h['Content-Type']}")
                    check(get(url + "/v1/models")[0] == 401, "the API still needs the key")
                    check(get(url + "/other.html")[0] == 404, "no other files without --path")
                elif what == "--path":
                    check(status == 200 and body == b"<p>mine</p>", f"--path: / is DIR/index.html: {body[:40]}")
                    status, h, body = get(url + "/css/a.css")
                    check(status == 200 and body == b"p{}" and h["Content-Type"].startswith("text/css"),
                          f"--path: a file with its content type: {status} {h['Content-Type']}")
                    for bad in ("/.secret", "/../secret.txt", "/%2e%2e/secret.txt", "/css/../../secret.txt",
                                "/css", "/nothing.js"):
                        check(get(url + bad)[0] == 404, f"--path: {bad} is a 404")
                else:
                    check(status == 404, f"--no-webui: / is a 404 ({status})")
            finally:
                check(stop(p) == 0, f"serve ({what}) exits 0 on SIGTERM")


def browser():
    """A headless chromium under selenium, or None (reported missing)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium (pip install -r requirements.txt)")
        return None
    for path, pkg in ((CHROMIUM, "chromium"), (DRIVER, "chromium-driver")):
        if not shutil.which(path):
            missing(f"{path} (apt-get install {pkg}; scripts/deps.sh)")
            return None
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,1000"):
        opts.add_argument(a)
    return webdriver.Chrome(options=opts, service=Service(DRIVER))


def metrics(url, key=None):
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    out = {}
    for name, key in (("dflash_spec_rounds_total", "rounds"), ("dflash_spec_accepted_total", "accepted"),
                      ("dflash_spec_committed_total", "committed"),
                      ("dflash_classic_steps_total", "classic_steps"),
                      ('dflash_requests_total{result="cancelled"}', "cancelled"),
                      ('dflash_requests_total{result="ok"}', "ok")):
        m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
        out[key] = float(m.group(1)) if m else None
    return out


def wait(cond, timeout=60, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return None


def generate(system, prompt, n, model=None, draft=None):
    args = [BIN, "generate", "--chat", "--system", system, "-p", prompt, "-n", str(n), "-t", "2", "-q"]
    if model:
        args += ["-m", model, "--draft", draft]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"dflash generate: exit {r.returncode}: {r.stderr[-300:]}")
    return r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout   # it ends the text with \n


def set_field(d, el_id, value):
    el = d.find_element("id", el_id)
    el.clear()
    el.send_keys(str(value))


def send(d, text):
    d.find_element("id", "prompt").send_keys(text)
    d.find_element("id", "send").click()


def accessible(d):
    from selenium.webdriver.common.by import By
    controls = d.find_elements(By.CSS_SELECTOR, "input, textarea, select, button")
    nameless = [c.get_attribute("id") or c.tag_name for c in controls if not c.accessible_name.strip()]
    check(len(controls) >= 8 and not nameless, f"every control has an accessible name "
          f"({len(controls)} controls; without: {nameless})")


def answer_kinds(d):
    """Letters of every token span of the last answer, counted."""
    kinds = d.execute_script(
        "const m = [...document.querySelectorAll('.msg.assistant')].pop();"
        "return [...m.querySelectorAll('.tok')].map(s => s.dataset.kinds).join('');")
    return {k: kinds.count(k) for k in "dbc"}, kinds


def chat_checks(d, url):
    """The server has an API key (KEY): the page asks for it, then chats with it."""
    d.get(url + "/")
    check(d.title == "dflash chat", f"the page loads: title {d.title!r}")
    check(wait(lambda: "API key" in d.find_element("id", "model").text, 30),
          f"without the key the page asks for it: {d.find_element('id', 'model').text!r}")
    set_field(d, "api-key", KEY)
    d.find_element("id", "system").click()   # the key field's change event
    check(wait(lambda: "drafter" in d.find_element("id", "model").text, 30),
          f"with the key the page names the model: {d.find_element('id', 'model').text!r}")
    accessible(d)
    want = generate(SYSTEM, PROMPT, MAX_TOKENS)
    set_field(d, "system", SYSTEM)
    set_field(d, "max-tokens", MAX_TOKENS)
    before = metrics(url, KEY)
    send(d, PROMPT)
    last = wait(lambda: d.execute_script("return !window.dflash.busy && window.dflash.last"), 120)
    check(last, "the answer ends with the server's stats")
    if not last:
        return
    after = metrics(url, KEY)
    got = d.execute_script("return [...document.querySelectorAll('.msg.assistant .body')].pop().textContent")
    check(got == want and got == last["content"],
          f"the streamed text equals dflash generate --chat: {got!r} vs {want!r}")
    counts, kinds = answer_kinds(d)
    server = {k: after[k] - before[k] for k in ("rounds", "accepted", "committed", "classic_steps")}
    rounds = len(re.findall(r"d*b|d+$", kinds.replace("c", " ")))
    check(counts["d"] == server["accepted"] and counts["d"] + counts["b"] == server["committed"] and
          counts["c"] == server["classic_steps"] and rounds == server["rounds"],
          f"the colouring adds up to /metrics: {counts}, {rounds} rounds vs {server}")
    st = last["dflash"]
    check(all(st[k] == server[k] for k in server), f"the final chunk's stats equal /metrics: {st}")
    check(counts["d"] > 0 and counts["b"] > 0, f"drafted and bonus tokens are coloured: {counts}")
    shown = {k: d.find_element("id", "s-" + k).text for k in "dbcr"}
    check(shown == {"d": str(counts["d"]), "b": str(counts["b"]), "c": str(counts["c"]), "r": str(rounds)},
          f"the page's counters show the colouring: {shown}")
    check(last["match"] and "matches" in d.find_element("id", "server-stats").text,
          "the page says its colouring matches the server's stats")
    d.execute_script("window.scrollTo(0, 0)")
    d.save_screenshot(SHOT)
    check(os.path.getsize(SHOT) > 10000, f"screenshot at {SHOT}")
    # the same request as classic decode
    d.find_element("xpath", "//button[text()='Compare with classic decode']").click()
    note = wait(lambda: "classic decode" in (t := d.execute_script(
        "return [...document.querySelectorAll('.msg.assistant .note')].pop().textContent")) and
        "Compare" not in t and t, 60)
    check(note and "identical to classic decode" in note, f"classic decode is identical: {note!r}")
    # an error in plain words
    set_field(d, "temperature", 5)
    send(d, "Hello")
    err = wait(lambda: d.find_element("id", "error").text, 30)
    check(err and "refused" in err and "temperature" in err, f"a refused request shows why: {err!r}")
    set_field(d, "temperature", 0)


def stop_checks(d, tmp):
    """Stop cancels the request on the server: SmolLM2 answers slowly enough."""
    if not os.path.exists(SMOL):
        missing(f"{SMOL} (make model) for the Stop check")
        return
    with open(os.path.join(tmp, "smol.log"), "w") as log:
        p, url = serve(BIN, ["-m", SMOL, "--draft", SMOL_DRAFT, "-t", "2"], log)
        try:
            if not check(url, "serve SmolLM2 reports its address"):
                return
            d.get(url + "/")
            set_field(d, "max-tokens", 3000)
            before = metrics(url)
            send(d, "Write a very long story about a dragon who learns to cook, in twenty chapters.")
            check(wait(lambda: len(d.execute_script(
                "return [...document.querySelectorAll('.msg.assistant .tok')]")) >= 5, 120),
                "tokens stream in")
            d.find_element("id", "stop").click()
            check(wait(lambda: "Stopped." in d.execute_script(
                "return [...document.querySelectorAll('.msg.assistant .note')].pop().textContent"), 10),
                "the page says Stopped.")
            freed = wait(lambda: not any(s["is_processing"] for s in json.loads(
                urllib.request.urlopen(url + "/slots", timeout=10).read())), 10)
            after = metrics(url)
            check(freed and after["cancelled"] == before["cancelled"] + 1,
                  f"Stop cancels the request on the server: slot freed {bool(freed)}, "
                  f"cancelled {before['cancelled']} -> {after['cancelled']}")
        finally:
            check(stop(p) == 0, "serve SmolLM2 exits 0 on SIGTERM")


def main():
    with tempfile.TemporaryDirectory(prefix="dflash-webui-") as tmp:
        file_checks(tmp)
    d = browser()
    if not d:
        return finish()
    try:
        with tempfile.TemporaryDirectory(prefix="dflash-webui-") as tmp:
            with open(os.path.join(tmp, "serve.log"), "w") as log:
                p, url = serve(BIN, ["-t", "2", "--api-key", KEY], log)
                try:
                    if check(url, "serve (built-in model) reports its address"):
                        chat_checks(d, url)
                finally:
                    check(stop(p) == 0, "serve exits 0 on SIGTERM")
                if failed():
                    print(open(log.name).read()[-3000:])
            stop_checks(d, tmp)
    finally:
        d.quit()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
