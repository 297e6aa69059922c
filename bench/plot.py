#!/usr/bin/python3
"""plot.py - draws the side-by-side and spec A/B results into one PNG.

    /usr/bin/python3 bench/plot.py RESULTS.json OUT.png [--spec BENCH.json ...]

RESULTS.json is what bench/llamacpp_side_by_side.sh writes (records of
engine, pair, type, metric, value); each --spec file is a `dflash bench
--json` output with a spec section (tok/s against tau per mode). Needs
Debian's python3-matplotlib (not a test dependency: nothing in tests/ plots).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"dflash": "#1f77b4", "llama.cpp": "#ff7f0e"}


def bars(ax, recs, metric, title, ylabel):
    keys = sorted({(r["pair"], r["type"]) for r in recs if r["metric"] == metric})
    val = {(r["engine"], r["pair"], r["type"]): r["value"] for r in recs if r["metric"] == metric}
    w = 0.38
    for i, eng in enumerate(("dflash", "llama.cpp")):
        xs = [k + (i - 0.5) * w for k in range(len(keys))]
        ys = [val.get((eng, p, t), 0) for p, t in keys]
        ax.bar(xs, ys, w, label=eng, color=COLORS[eng])
        for x, y in zip(xs, ys):
            if y:
                ax.text(x, y, f"{y:.0f}" if y >= 10 else f"{y:.1f}", ha="center", va="bottom",
                        fontsize=7)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{p}\n{t}" for p, t in keys], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.legend(fontsize=7)


def verify(ax, recs):
    curves = {}
    for r in recs:
        if r["engine"] == "dflash" and r["metric"].startswith(("verify_ratio_b", "roofline_ratio_b")):
            kind, b = r["metric"].rsplit("_b", 1)
            curves.setdefault((r["pair"], r["type"], kind), []).append((int(b), r["value"]))
    for (p, t, kind), pts in sorted(curves.items()):
        pts.sort()
        if kind == "verify_ratio":
            ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", ms=3, label=f"{p} {t}")
        elif p == sorted(curves)[0][0]:
            ax.plot([b for b, _ in pts], [v for _, v in pts], ls="--", lw=1, color="gray",
                    label=f"roofline {t}")
    ax.set_xlabel("verify block B (rows)", fontsize=8)
    ax.set_ylabel("forward time / one row", fontsize=8)
    ax.set_title("verify cost vs block (dflash)", fontsize=10)
    ax.legend(fontsize=6)


def spec(ax, path):
    j = json.load(open(path))
    s = j["spec"]
    modes = []
    for r in s["runs"]:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    for m in modes:
        pts = [(r["tau"], r["x_classic"]) for r in s["runs"] if r["mode"] == m]
        ax.plot([t for t, _ in pts], [x for _, x in pts], marker="o", ms=3, label=m,
                ls="-" if m != "classic" else ":")
    ax.axhline(1, color="gray", lw=0.8)
    ax.set_xlabel("tau (committed tokens per round at block 16)", fontsize=8)
    ax.set_ylabel("speed / classic decode", fontsize=8)
    ax.set_title(f"replay A/B, {j['model']['name']} {s['type']}", fontsize=10)
    ax.legend(fontsize=6)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--spec", action="append", default=[])
    a = ap.parse_args(argv)
    recs = json.load(open(a.results))
    n = 4 + len(a.spec)
    cols = 3
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows))
    axes = list(axes.flat)
    bars(axes[0], recs, "decode_tok_s", "decode (classic, 128 tokens)", "tok/s")
    bars(axes[1], recs, "prefill_tok_s", "prefill (512 tokens)", "tok/s")
    ms = sorted({r["metric"] for r in recs if r["metric"].startswith("spec_ms_per_round_b")},
                key=lambda m: int(m.rsplit("b", 1)[1]))
    bars(axes[2], recs, ms[0] if ms else "none",
         f"DFlash round at zero acceptance, block {ms[0].rsplit('b', 1)[1] if ms else '?'}",
         "ms per round (lower is better)")
    verify(axes[3], recs)
    for i, p in enumerate(a.spec):
        spec(axes[4 + i], p)
    for ax in axes[n:]:
        ax.axis("off")
    threads = next((r["cmd"].split(" -t ")[1].split()[0] for r in recs if " -t " in r["cmd"]), "?")
    fig.suptitle(f"dflash vs llama.cpp, same GGUF weights, {threads} threads", fontsize=11)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
