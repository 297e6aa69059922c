#!/usr/bin/env python3
"""check_layers.py - fails on an #include that goes up the layers, on a
function of include/dflash.h defined outside src/api/ (the public API is
implemented in one layer), and on getenv outside src/cli/ (the library's
knobs are options).

DESIGN.md: layers include downward only,
    base <- kernels <- io <- models/draft <- decode <- api <- cli/server.
sample and tokenizer sit beside models/draft (they use base, kernels and io;
the decode loop uses them). A file may include its own layer or any lower
one; include/dflash.h (the public header: types and declarations only) is
open to all. The CLI and the server see only the public header and each
other's headers, never the engine's internals.

Usage: check_layers.py [ROOT]   (ROOT defaults to the repository; it must
hold src/ and include/). Prints FILE:LINE for each bad include and exits 1
if there is any, else prints a one-line summary and exits 0."""
import os
import re
import sys

LEVEL = {"base": 0, "kernels": 1, "io": 2, "models": 3, "draft": 3, "sample": 3,
         "tokenizer": 3, "decode": 4, "api": 5, "cli": 6, "server": 6}
TOP = 6
# Known exceptions, each with why and what ends it. Keep this list short.
ALLOWED = {}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer_of(root, path):
    """(name, level) of a file under src/ or include/; None for include/."""
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "include":
        return None
    if len(rel) < 3 or rel[1] not in LEVEL:   # a file straight in src/, or an unknown folder
        return (rel[1] if len(rel) >= 3 else "src", None)
    return (rel[1], LEVEL[rel[1]])


def resolve(root, src_file, name):
    """Where the compiler finds "name": beside the file, then include/, then src/."""
    for d in (os.path.dirname(src_file), os.path.join(root, "include"), os.path.join(root, "src")):
        p = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(p):
            return p
    return None


def check(root):
    bad, n = [], 0
    for top in ("src", "include"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                me = layer_of(root, path)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for ln, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        n += 1
                        where = f"{os.path.relpath(path, root)}:{ln}"
                        target = resolve(root, path, m.group(1))
                        if target is None:
                            bad.append(f'{where}: "{m.group(1)}" not found under src/ or include/')
                            continue
                        them = layer_of(root, target)
                        if them is None:                       # the public header
                            continue
                        if (os.path.relpath(path, root), m.group(1)) in ALLOWED:
                            continue
                        if me is None:
                            bad.append(f'{where}: the public header includes internal "{m.group(1)}"')
                        elif me[1] is None or them[1] is None:
                            unknown = me[0] if me[1] is None else them[0]
                            folder = "src/" if unknown == "src" else f"src/{unknown}/"
                            bad.append(f'{where}: "{m.group(1)}": {folder} has no layer '
                                       f'(LEVEL in scripts/check_layers.py)')
                        elif them[1] > me[1]:
                            bad.append(f'{where}: {me[0]} includes "{m.group(1)}" from {them[0]}, '
                                       f'a higher layer')
                        elif me[1] == TOP and them[1] < TOP:
                            bad.append(f'{where}: {me[0]} includes internal "{m.group(1)}" '
                                       f'({them[0]}); the CLI and the server use include/dflash.h')
    return bad, n


DECL = re.compile(r"^(?:[A-Za-z_]\w*[\s*]+)+(dfl_\w+)\(", re.M)


def api_outside(root):
    """Definitions of include/dflash.h's functions outside src/api/: the public
    API is implemented in one layer (the CLI and the server see it there)."""
    try:
        with open(os.path.join(root, "include", "dflash.h"), encoding="utf-8") as fh:
            public = set(DECL.findall(fh.read()))
    except OSError:
        return []
    bad = []
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        rel_dir = os.path.relpath(dirpath, root).split(os.sep)
        if rel_dir[:2] == ["src", "api"]:
            continue
        for f in sorted(files):
            if not f.endswith(".c"):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                for ln, line in enumerate(fh, 1):
                    m = DECL.match(line)
                    if m and m.group(1) in public and not line.rstrip().endswith(";"):
                        bad.append(f"{os.path.relpath(path, root)}:{ln}: {m.group(1)} of "
                                   f"include/dflash.h is defined outside src/api/")
    return bad


GETENV = re.compile(r"\bgetenv\s*\(")


def env_reads(root):
    """getenv below the CLI: the engine and the server take their knobs from
    options structs, which the CLI fills (from flags or the environment)."""
    bad = []
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        if os.path.relpath(dirpath, root).split(os.sep)[:2] == ["src", "cli"]:
            continue
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for ln, line in enumerate(fh, 1):
                        if GETENV.search(line.split("//")[0]):
                            bad.append(f"{os.path.relpath(path, root)}:{ln}: reads the "
                                       f"environment; take it in an options struct")
    return bad


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    bad, n = check(root)
    bad += api_outside(root) + env_reads(root)
    for b in bad:
        print(b)
    if bad:
        print(f"check_layers: {len(bad)} problem(s): includes that go up the layers (of {n}), "
              f"public functions outside src/api/, or the environment read below the CLI")
        return 1
    print(f"check_layers: {n} includes, all downward; the public API is in src/api/; "
          f"only the CLI reads the environment")
    return 0


if __name__ == "__main__":
    sys.exit(main())
