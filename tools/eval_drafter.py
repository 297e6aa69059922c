#!/usr/bin/env python3
"""eval_drafter.py - a drafter's real acceptance and speed on held-out prompts.

    tools/eval_drafter.py --model M --draft D --corpus held.txt --prompts 20 \\
        --modes classic,8,auto --temps 0,0.8 [--rules exact,rejection,typical] \\
        [--first-doc N] [--json out.json]

Prompts are the first --words words of documents (separated by --sep) from
--first-doc on: text the drafter was not trained on when the capture used
--max-docs below it. Each prompt runs through `dflash generate` once per
mode -- classic (--block-size 1, no drafter), N (a fixed block), auto (the
adaptive block), ngram (the n-gram lane alone, adaptive: --ngram, no
drafter), and N+ngram / auto+ngram (the drafter and the n-gram lane, the
policy picking per round), tN (draft trees of budget N every round: --tree-budget N),
chain (the adaptive policy without trees: --tree-budget 0) -- temperature and, above temperature 0, acceptance rule
(--spec-accept), with --stats-json. Reported per mode:
tau (tokens committed per verify round, the bonus included), acceptance by
block position (drafts accepted / proposed, pooled over prompts, each
prompt's ratios weighted by its rounds), and decode tokens/s (generated
tokens over decode time, pooled). With --check, every speculative output
must equal the classic output of the same prompt and temperature under the
exact rule (exit 1 otherwise): the engine's exact acceptance keeps sampled
output identical too (per-position keyed sampling). Rejection and typical
outputs are not compared (they promise a distribution, or less).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def prompts_from(path, sep, first, n, words):
    with open(path, encoding="utf-8") as f:
        docs = [d.strip() for d in f.read().split(sep) if d.strip()]
    out = []
    for d in docs[first:first + n]:
        out.append(" ".join(d.split()[:words]))
    return out


def prompts_jsonl(path, n):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()][:n]


def generate(binary, model, draft, prompt, n, mode, temp, seed, threads, rule="exact", extra=()):
    """-> (text and ids as printed, stats dict)."""
    with tempfile.TemporaryDirectory(prefix="evald-") as tmp:
        js = os.path.join(tmp, "s.json")
        cmd = [binary, "generate", "-m", model, "-p", prompt, "-n", str(n), "-q",
               "--temp", str(temp), "--seed", str(seed), "--stats-json", js,
               "--print-token-ids", *extra]
        if threads:
            cmd += ["-t", str(threads)]
        base = mode[:-len("+ngram")] if mode.endswith("+ngram") else mode
        if mode == "classic":
            cmd += ["--draft", "none", "--block-size", "1"]
        elif mode == "ngram":
            cmd += ["--draft", "none", "--ngram", "--block-size", "auto", "--spec-accept", rule]
        elif base.startswith("t"):   # a draft tree of budget N (DDTree) every round
            cmd += ["--draft", draft, "--block-size", "auto", "--tree-budget", base[1:],
                    "--spec-accept", rule]
        elif base == "chain":   # the adaptive policy without trees
            cmd += ["--draft", draft, "--block-size", "auto", "--tree-budget", "0",
                    "--spec-accept", rule]
        else:
            cmd += ["--draft", draft, "--block-size", base, "--spec-accept", rule]
            if base != mode:
                cmd += ["--ngram"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"eval_drafter: {' '.join(cmd)}: {r.stderr.strip()[-1000:]}")
        ids = [ln for ln in r.stderr.splitlines() if ln.startswith(("prompt ids", "generated ids"))]
        with open(js) as f:
            return r.stdout + "\n".join(ids), json.load(f)


def pool(stats):
    rounds = sum(s["rounds"] for s in stats)
    gen = sum(s["n_gen"] for s in stats)
    t = sum(s["t_decode"] for s in stats)
    out = {"prompts": len(stats), "tokens": gen, "decode_s": round(t, 4),
           "tok_s": round(gen / t, 1) if t > 0 else 0.0, "rounds": rounds}
    if rounds:
        out["tau"] = round(sum(s["committed"] for s in stats) / rounds, 3)
        width = max(len(s["acceptance_by_position"]) for s in stats)
        acc = []
        for i in range(width):
            w = [(s["acceptance_by_position"][i], s["rounds"]) for s in stats
                 if len(s["acceptance_by_position"]) > i]
            acc.append(round(sum(a * r for a, r in w) / max(1, sum(r for _, r in w)), 3))
        out["acceptance_by_position"] = acc
    lanes = {}
    for s in stats:
        for name, l in s.get("lanes", {}).items():
            t = lanes.setdefault(name, {"rounds": 0, "committed": 0})
            t["rounds"] += l["rounds"]
            t["committed"] += l["committed"]
    lanes = {k: {"rounds": v["rounds"], "tau": round(v["committed"] / v["rounds"], 3)}
             for k, v in lanes.items() if v["rounds"]}
    if len(lanes) > 1 or "ngram" in lanes:
        out["lanes"] = lanes
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", help="dflash binary (default: $DFLASH_BIN or the newest build*/dflash)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--corpus", help="text with held-out documents")
    ap.add_argument("--prompts-jsonl", help='held-out prompts, JSON lines {"prompt": ...} '
                    "(tools/chat_prompts.py), instead of --corpus")
    ap.add_argument("--chat", action="store_true", help="render prompts with the chat template")
    ap.add_argument("--dtype", help="convert the weights at load (generate's --dtype)")
    ap.add_argument("--sep", default="<|endoftext|>")
    ap.add_argument("--first-doc", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--words", type=int, default=6, help="words of each document as the prompt")
    ap.add_argument("-n", type=int, default=128, help="tokens per generation")
    ap.add_argument("--modes", default="classic,8,auto")
    ap.add_argument("--temps", default="0")
    ap.add_argument("--rules", default="exact",
                    help="acceptance rules tried above temperature 0 (exact,rejection,typical)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="speculative output must equal classic")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--interleave", action="store_true",
                    help="run every mode on a prompt before the next prompt (A/B alternated)")
    a = ap.parse_args(argv)
    binary = a.bin
    if not binary:
        import dumpcmp
        binary = dumpcmp.find_bin()
    if not binary:
        raise SystemExit("eval_drafter: no dflash binary (--bin or $DFLASH_BIN)")
    if a.prompts_jsonl:
        prompts = prompts_jsonl(a.prompts_jsonl, a.prompts)
    elif a.corpus:
        prompts = prompts_from(a.corpus, a.sep, a.first_doc, a.prompts, a.words)
    else:
        raise SystemExit("eval_drafter: --corpus or --prompts-jsonl")
    extra = (["--chat"] if a.chat else []) + (["--dtype", a.dtype] if a.dtype else [])
    report, bad = {"model": a.model, "draft": a.draft, "prompts": prompts, "n": a.n,
                   "threads": a.threads, "runs": {}}, 0
    for temp in [float(x) for x in a.temps.split(",")]:
        texts = {}
        rules = a.rules.split(",") if temp > 0 else ["exact"]
        runs = [(rule, mode) for rule in rules for mode in a.modes.split(",")
                if not (mode == "classic" and rule != rules[0])]  # classic has no rule
        stats = {run: [] for run in runs}
        # --interleave: every mode on a prompt before the next prompt, so a
        # shared machine's load changes weigh on all modes alike
        order = ([(run, i) for i in range(len(prompts)) for run in runs] if a.interleave else
                 [(run, i) for run in runs for i in range(len(prompts))])
        for (rule, mode), i in order:
            p = prompts[i]
            text, s = generate(binary, a.model, a.draft, p, a.n, mode, temp, a.seed + i,
                               a.threads, rule, extra)
            texts[(mode, rule, i)] = text
            stats[(rule, mode)].append(s)
            ref = texts.get(("classic", rules[0], i))
            if a.check and rule == "exact" and mode != "classic" and ref is not None and \
                    text != ref:
                print(f"MISMATCH temp {temp} mode {mode} prompt {i} {p!r}", file=sys.stderr)
                bad += 1
            if len(stats[(rule, mode)]) < len(prompts):
                continue
            r = pool(stats[(rule, mode)])
            key = f"temp={temp:g} block={mode}" + (f" rule={rule}" if mode != "classic" and
                                                   temp > 0 else "")
            report["runs"][key] = r
            print(f"{key}: {json.dumps(r)}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if bad:
        print(f"eval_drafter: {bad} speculative outputs differ from classic", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
