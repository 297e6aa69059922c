#!/usr/bin/env python3
"""test_layers.py - the layer check (scripts/check_layers.py, DESIGN.md's
"layers include downward only"): the tree passes it, and on a small
made-up tree it names the file and line of each include that goes up
(kernels -> io, decode -> api, the CLI -> an internal header, a folder
with no layer) and lets downward and same-layer includes through; and it
names a function of include/dflash.h defined outside src/api/ and a
getenv outside src/cli/."""
import os
import subprocess
import sys
import tempfile

from testlib import check, finish

SRC = os.environ.get("DFLASH_SRC") or os.path.join(os.path.dirname(__file__), "..")
SCRIPT = os.path.join(SRC, "scripts", "check_layers.py")


def run(root):
    p = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
    return p.returncode, p.stdout


def main():
    rc, out = run(SRC)
    check(rc == 0, f"the tree's includes go downward only:\n{out}")

    files = {
        "include/dflash.h": "int dfl_open(const char *path);\n"
                            "const char *dfl_name(void);   /* two public functions */\n"
                            "typedef int (*dfl_cb)(void *ud);\n",
        "src/api/open.c": '#include "engine.h"\nint dfl_open(const char *path) { return !path; }\n',
        "src/io/name.c": '#include "io/io.h"\nstatic int helper(void);\n'
                         'const char *dfl_name(void) {\n    return "x";\n}\n',    # public: line 3
        "src/base/base.h": '#include "dflash.h"\n',
        "src/io/io.h": '#include "base/base.h"\n',
        "src/kernels/kernels.h": '#include "base/base.h"\n\n#include "io/io.h"\n',   # up: line 3
        "src/kernels/ops.c": '#include "kernels.h"\n',                               # same folder
        "src/decode/loop.c": '#include "kernels/kernels.h"\n#include "api/engine.h"\n',  # up: 2
        "src/api/engine.h": '#include "decode/decode.h"\n',
        "src/decode/decode.h": '#include "models/model.h"\n',
        "src/models/model.h": '#include "io/io.h"\n',
        "src/cli/cmd.c": '#include "dflash.h"\n#include "cli.h"\n#include "api/engine.h"\n',  # 3
        "src/cli/cli.h": '#include "server/server.h"\n',                              # same layer
        "src/cli/env.c": '#include "cli.h"\nconst char *k(void) { return getenv("K"); }\n',
        "src/models/knob.c": '#include "models/model.h"\nint k(void) { return !getenv("K"); }\n',
        "src/server/server.h": '#include "dflash.h"\n',
        "src/misc/x.c": '#include "base/base.h"\n',                                   # no layer
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w") as f:
                f.write(text)
        rc, out = run(root)
        check(rc == 1, f"a tree with upward includes fails (rc {rc})")
        lines = [l for l in out.splitlines() if not l.startswith("check_layers:")]
        want = ["src/kernels/kernels.h:3:", "src/decode/loop.c:2:", "src/cli/cmd.c:3:",
                "src/misc/x.c:1:", "src/io/name.c:3: dfl_name", "src/models/knob.c:2: reads"]
        for w in want:
            check(any(l.startswith(w) for l in lines), f"{w} is named in:\n{out}")
        check(len(lines) == len(want), f"only the {len(want)} bad includes are named:\n{out}")
        # Fix the bad ones: the tree passes.
        for name, text in (("src/kernels/kernels.h", '#include "base/base.h"\n'),
                           ("src/decode/loop.c", '#include "kernels/kernels.h"\n'),
                           ("src/cli/cmd.c", '#include "dflash.h"\n#include "cli.h"\n')):
            with open(os.path.join(root, name), "w") as f:
                f.write(text)
        os.remove(os.path.join(root, "src/misc/x.c"))
        os.remove(os.path.join(root, "src/models/knob.c"))
        os.rename(os.path.join(root, "src/io/name.c"), os.path.join(root, "src/api/name.c"))
        rc, out = run(root)
        check(rc == 0, f"the same tree with downward includes only passes:\n{out}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
