"""testlib.py - what the Python tests share: counting checks, and the rule
that a missing asset or tool fails under CI (CI=true) and is a skip
elsewhere. A test ends with `return finish()` (the summary line ctest's
logs show, and the exit status: 77, ctest's skip, when anything was left out)."""
import os
import re
import subprocess
import time
import urllib.request

CI = os.environ.get("CI") == "true"
counts = {"pass": 0, "fail": 0, "skip": 0}
SKIP_RC = 77  # ctest's SKIP_RETURN_CODE (CMakeLists.txt)


def check(cond, what):
    if cond:
        counts["pass"] += 1
    else:
        counts["fail"] += 1
        print(f"FAIL: {what}", flush=True)
    return cond


def missing(what):
    """A missing tool or asset: a failure under CI, a skip otherwise."""
    if CI:
        check(False, f"{what} is missing (CI=true)")
    else:
        counts["skip"] += 1
        print(f"skip: {what} is missing", flush=True)


def failed():
    return counts["fail"]


def finish():
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    return 1 if counts["fail"] else SKIP_RC if counts["skip"] else 0


def serve(bin_path, args, log, health_s=60):
    """`dflash serve ARGS` with its output in log (an open file), on 127.0.0.1 and
    a free port unless args name --port: (process, its URL once /health answers
    200, or None when it never listened or never loaded within health_s)."""
    extra = [] if "--port" in args else ["--host", "127.0.0.1", "--port", "0"]
    p = subprocess.Popen([bin_path, "serve", *args, *extra], stdout=log,
                         stderr=subprocess.STDOUT)
    url = None
    for _ in range(600):
        with open(log.name) as f:
            m = re.search(r"listening on (http://\S+)", f.read())
        if m:
            url = m.group(1)
            break
        if p.poll() is not None:
            return p, None
        time.sleep(0.1)
    end = time.monotonic() + health_s
    while url and time.monotonic() < end:   # listening; loaded once /health answers 200
        try:
            if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                return p, url
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.1)
    return p, None


def stop(p):
    """SIGTERM, then the exit code (killed after 60 s)."""
    p.terminate()
    try:
        return p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()
