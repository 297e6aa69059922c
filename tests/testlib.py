"""testlib.py - what the Python tests share: counting checks, and the rule
that a missing asset or tool fails under CI (CI=true) and is a skip
elsewhere. A test ends with `return finish()` (the summary line ctest's
logs show, and the exit status: 77, ctest's skip, when anything was left out)."""
import os

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
