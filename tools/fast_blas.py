"""fast_blas.py - run a torch trainer on OpenBLAS when Debian has it.

Debian's python3-torch calls the system libblas.so.3, which by default is the
generic reference BLAS (about 1 GFLOP/s here). With the Debian package
libopenblas0-pthread installed, pointing the loader at its libblas.so.3 makes
the trainers about 20x faster, without touching the system's alternatives
(other programs keep theirs). Training results do not depend on it beyond
float rounding. Call reexec() before importing torch; DFLASH_FAST_BLAS=0
turns it off.

One BLAS thread by default: on a machine shared with other jobs, spinning
BLAS / OpenMP threads make every small matmul wait on the slowest core.
"""
import os
import sys

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread"


def reexec(threads=1):
    if os.environ.get("DFLASH_FAST_BLAS") == "0":
        return
    if not os.path.exists(os.path.join(OPENBLAS, "libblas.so.3")):
        return
    cur = os.environ.get("LD_LIBRARY_PATH", "")
    if OPENBLAS in cur.split(":"):
        return
    env = dict(os.environ, LD_LIBRARY_PATH=OPENBLAS + (":" + cur if cur else ""))
    env.setdefault("OPENBLAS_NUM_THREADS", str(threads))
    env.setdefault("OMP_NUM_THREADS", str(threads))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
