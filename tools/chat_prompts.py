#!/usr/bin/env python3
"""chat_prompts.py - instruction prompts for training and evaluating a chat
drafter (models/smollm2-dflash), assembled from text nobody here wrote:
TinyStories (../shared/assets/corpus), Shakespeare (tinyshakespeare.txt), the
cs336 web-text sample and Debian's fortunes. Each prompt is an instruction
("continue this story", "summarise", "explain", ...) over a passage.

Passages are split into a training part and a held-out part by source
position, so the evaluation prompts use passages the drafter never saw.

    tools/chat_prompts.py --shared ../shared --train N --out-train train.jsonl \
        --eval 20 --out-eval eval.jsonl
Writes JSON lines {"prompt": "..."}; deterministic for a given --seed.

    tools/chat_prompts.py --shared ../shared --edit --eval 20 --out-eval edit.jsonl
writes editing prompts instead, over held-out story passages: fix the typos
put into a passage, or repeat it with a name replaced. Their answers repeat
the prompt: the workload of the n-gram lane (prompt lookup).
"""
import argparse
import glob
import json
import os
import random

STORY_TASKS = [
    "Continue this story:\n\n{p}",
    "Summarize this story in two sentences:\n\n{p}",
    "What is the moral of this story?\n\n{p}",
    "Who are the characters in this story, and what do they want?\n\n{p}",
    "Rewrite this story for a five-year-old:\n\n{p}",
    "Give this story a title and explain why it fits:\n\n{p}",
]
VERSE_TASKS = [
    "Explain this passage in plain modern English:\n\n{p}",
    "Summarize what happens in this scene:\n\n{p}",
    "What is the speaker feeling in these lines?\n\n{p}",
]
PROSE_TASKS = [
    "Summarize the following text:\n\n{p}",
    "Explain what this text is about:\n\n{p}",
    "Rewrite this text in clear, simple sentences:\n\n{p}",
]
QUOTE_TASKS = [
    "What does this quote mean?\n\n{p}",
    "Explain the joke or idea in this saying:\n\n{p}",
    "Do you agree with this? Explain briefly.\n\n{p}",
]
TOPIC_TASKS = [
    "Write a short story about {p}.",
    "Explain {p} to a child.",
    "Give three facts about {p}.",
]


def stories(shared):
    text = open(os.path.join(shared, "assets/corpus/tinystories_first2MiB.txt"), encoding="utf-8").read()
    docs = [d.strip() for d in text.split("<|endoftext|>")]
    return [d for d in docs if 200 <= len(d) <= 1200][:-1]  # the last one is cut


def shakespeare(shared):
    text = open(os.path.join(shared, "assets/corpus/tinyshakespeare.txt"), encoding="utf-8").read()
    blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
    out, cur = [], ""
    for b in blocks:  # speeches grouped into passages of 300..900 characters
        cur = f"{cur}\n\n{b}" if cur else b
        if len(cur) >= 300:
            if len(cur) <= 900:
                out.append(cur)
            cur = ""
    return out


def webtext(shared):
    lines = open(os.path.join(shared, "assets/corpus/cs336_corpus.en"), encoding="utf-8").read().split("\n")
    out, cur = [], []
    for ln in lines:
        ln = ln.strip()
        if len(ln) < 40:
            continue
        cur.append(ln)
        if sum(map(len, cur)) >= 300:
            out.append(" ".join(cur))
            cur = []
    return out


def fortunes():
    out = []
    skip = ("ascii-art", "art")
    for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if f.endswith((".dat", ".u8")) or os.path.basename(f) in skip or os.path.isdir(f):
            continue
        for q in open(f, encoding="utf-8", errors="replace").read().split("\n%\n"):
            q = q.strip()
            if 40 <= len(q) <= 400:
                out.append(q)
    return out


def topics(story_docs):
    """Nouns-ish words from stories ("a dog", "the moon"), for open prompts."""
    seen = {}
    for d in story_docs:
        w = d.split()
        for i in range(len(w) - 1):
            if w[i] in ("a", "the") and w[i + 1].isalpha() and len(w[i + 1]) > 3:
                seen.setdefault(f"{w[i]} {w[i + 1].lower()}", None)
    return list(seen)


def split(items, frac=0.9):
    k = int(len(items) * frac)
    return items[:k], items[k:]


def build(shared, seed):
    src = {
        "story": (stories(shared), STORY_TASKS),
        "verse": (shakespeare(shared), VERSE_TASKS),
        "prose": (webtext(shared), PROSE_TASKS),
        "quote": (fortunes(), QUOTE_TASKS),
    }
    src["topic"] = (topics(src["story"][0]), TOPIC_TASKS)
    train, held = {}, {}
    for name, (items, tasks) in src.items():
        a, b = split(items)
        train[name] = (a, tasks)
        held[name] = (b, tasks)
    return train, held


NAMES = ["Sam", "Mia", "Ben", "Zoe", "Max", "Ava"]


def typos(p, rng, rate=0.06):
    """Swaps two inner letters of about rate of the words (longer than 3 letters)."""
    out = []
    for w in p.split(" "):
        if len(w) > 3 and w.isalpha() and rng.random() < rate:
            i = rng.randrange(1, len(w) - 2)
            w = w[:i] + w[i + 1] + w[i] + w[i + 2:]
        out.append(w)
    return " ".join(out)


def edit_prompt(p, rng):
    """An editing instruction over passage p whose answer is p again, nearly."""
    caps = [w.strip(".,!?\"'") for w in p.split()]
    names = [w for w in set(caps) if w[:1].isupper() and w.isalpha() and len(w) > 2 and
             caps.count(w) >= 2 and w not in ("The", "She", "They", "One", "When", "But")]
    if names and rng.random() < 0.5:
        a = sorted(names)[0]
        b = rng.choice([n for n in NAMES if n != a])
        return f'Repeat this story exactly, but with every "{a}" replaced by "{b}":\n\n{p}'
    return f"Fix the typos in this text and write it out in full:\n\n{typos(p, rng)}"


def sample(pools, n, rng, weights):
    names = list(pools)
    out = []
    for _ in range(n):
        name = rng.choices(names, weights=[weights[k] for k in names])[0]
        items, tasks = pools[name]
        out.append({"prompt": rng.choice(tasks).format(p=rng.choice(items)), "source": name})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--eval", type=int, default=20)
    ap.add_argument("--out-train")
    ap.add_argument("--edit", action="store_true",
                    help="editing prompts over held-out stories (--eval of them to --out-eval)")
    ap.add_argument("--out-eval", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    train, held = build(a.shared, a.seed)
    if a.edit:
        items = held["story"][0]
        rows = [{"prompt": edit_prompt(p, rng), "source": "edit"}
                for p in rng.sample(items, min(a.eval, len(items)))]
        with open(a.out_eval, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        return
    if not a.out_train:
        raise SystemExit("chat_prompts: --out-train is needed (or --edit)")
    weights = {"story": 4, "verse": 1, "prose": 1, "quote": 2, "topic": 2}
    for path, rows in ((a.out_train, sample(train, a.train, rng, weights)),
                       (a.out_eval, sample(held, a.eval, rng, weights))):
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print({k: len(v[0]) for k, v in train.items()}, "train passages;",
          {k: len(v[0]) for k, v in held.items()}, "held out")


if __name__ == "__main__":
    main()
