#!/usr/bin/env python3
"""plot_serve.py - bench_serve.py's results as an SVG: aggregate tok/s and
median time to first token against concurrent clients, one line per server.
Plain SVG, no plotting library.

    python3 bench/plot_serve.py RESULTS.json OUT.svg"""
import json
import sys

COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#8c564b"]
W, H, PAD = 420, 300, 50


def panel(x0, title, series, key, ylabel):
    xs = sorted({c for pts in series.values() for c, _ in pts})
    ymax = max(v[key] for pts in series.values() for _, v in pts) * 1.1 or 1
    px = lambda c: x0 + PAD + (W - 2 * PAD) * xs.index(c) / max(1, len(xs) - 1)
    py = lambda y: H - PAD - (H - 2 * PAD) * y / ymax
    out = [f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{x0 + PAD}" y1="{H - PAD}" x2="{x0 + W - PAD}" y2="{H - PAD}" stroke="#000"/>',
           f'<line x1="{x0 + PAD}" y1="{PAD}" x2="{x0 + PAD}" y2="{H - PAD}" stroke="#000"/>',
           f'<text x="{x0 + W / 2}" y="{H - 12}" text-anchor="middle" font-size="11">'
           'concurrent streaming clients</text>',
           f'<text x="{x0 + 14}" y="{H / 2}" font-size="11" transform="rotate(-90 {x0 + 14} '
           f'{H / 2})" text-anchor="middle">{ylabel}</text>']
    for c in xs:
        out.append(f'<text x="{px(c)}" y="{H - PAD + 15}" text-anchor="middle" font-size="10">'
                   f'{c}</text>')
    for i in range(5):
        y = ymax * i / 4
        out.append(f'<text x="{x0 + PAD - 4}" y="{py(y) + 3}" text-anchor="end" font-size="10">'
                   f'{y:.0f}</text>')
    for k, (name, pts) in enumerate(series.items()):
        col = COLORS[k % len(COLORS)]
        path = " ".join(f"{px(c):.1f},{py(v[key]):.1f}" for c, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="2"/>')
        out += [f'<circle cx="{px(c):.1f}" cy="{py(v[key]):.1f}" r="3" fill="{col}"/>'
                for c, v in pts]
    return out


def main():
    res = json.load(open(sys.argv[1]))
    series = {}
    for r in res["results"]:
        series.setdefault(r["server"], []).append((r["clients"], r))
    for pts in series.values():
        pts.sort(key=lambda p: p[0])
    body = panel(0, "aggregate tok/s", series, "aggregate_tps", "tokens per second")
    body += panel(W, "time to first token, p50", series, "ttft_p50_ms", "milliseconds")
    for k, name in enumerate(series):
        body.append(f'<rect x="{PAD + 170 * (k % 4)}" y="{H + 8 + 18 * (k // 4)}" width="12" '
                    f'height="12" fill="{COLORS[k % len(COLORS)]}"/>')
        body.append(f'<text x="{PAD + 170 * (k % 4) + 16}" y="{H + 18 + 18 * (k // 4)}" '
                    f'font-size="11">{name}</text>')
    foot = f'{res.get("cpu", "")}, {res.get("threads", "")} threads, {res.get("max_tokens")} tokens'
    body.append(f'<text x="{PAD}" y="{H + 60}" font-size="10" fill="#555">{foot}</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 70}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="#fff"/>'
           + "".join(body) + "</svg>\n")
    open(sys.argv[2], "w").write(svg)


if __name__ == "__main__":
    main()
