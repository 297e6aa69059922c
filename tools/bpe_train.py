#!/usr/bin/env python3
"""bpe_train.py - learns a small byte-level BPE tokenizer from text and writes
it as a Hugging Face tokenizer.json (+ tokenizer_config.json) that dflash's
tokenizer (and Hugging Face's) loads.

    tools/bpe_train.py --vocab 1024 --out DIR corpus1.txt [corpus2.txt ...]

The model is GPT-2's: text is cut by a split regex into words (a word keeps
its leading space), each word is a sequence of bytes shown in GPT-2's
byte-to-unicode alphabet, and merges join the most frequent adjacent pair,
one at a time, until the vocabulary has --vocab ids: 256 bytes, the merges,
then the special tokens <|endoftext|> (BOS, EOS, document separator) and
<|mask|> (never in text: the DFlash drafter's mask token). Ties between
equally frequent pairs go to the larger (first id, second id): the result
depends only on the text.

The split regex uses ASCII classes only, so Python's re (here) and PCRE2 (the
engine) cut text identically; other letters fall into the punctuation class
and are still covered byte by byte. encode() applies the merges as the
engine does (lowest rank first); tests compare it with `dflash tokenize`.
"""
import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint  # noqa: E402

SPLIT = r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"
SPECIALS = ["<|endoftext|>", "<|mask|>"]


def words_of(texts):
    """Counter of words (bytes) over all texts."""
    pat = re.compile(SPLIT)
    c = collections.Counter()
    for t in texts:
        c.update(w.encode("utf-8") for w in pat.findall(t))
    return c


def learn(texts, n_merges):
    """-> merges [(a, b)] of symbol ids (0..255 bytes, then 256 + merge index)."""
    counts = words_of(texts)
    words = [list(w) for w in counts]
    freq = [counts[w] for w in counts]
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += freq[i]
            where[p].add(i)
    merges = []
    while len(merges) < n_merges and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if best[1] < 2:
            break
        (a, b), new = best[0], 256 + len(merges)
        merges.append((a, b))
        for i in sorted(where.pop((a, b), ())):
            w, f = words[i], freq[i]
            for p in zip(w, w[1:]):
                pairs[p] -= f
                if pairs[p] <= 0:
                    del pairs[p]
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pairs[p] += f
                where[p].add(i)
    return merges


def symbol_bytes(merges):
    sb = [bytes([i]) for i in range(256)]
    for a, b in merges:
        sb.append(sb[a] + sb[b])
    return sb


def tokenizer_json(merges):
    """-> (tokenizer.json dict, tokenizer_config.json dict)."""
    b2u = make_checkpoint._bytes_to_unicode()
    sb = symbol_bytes(merges)

    def u(bs):
        return "".join(b2u[x] for x in bs)

    vocab = {u(bs): i for i, bs in enumerate(sb)}
    if len(vocab) != len(sb):
        raise SystemExit("bpe_train: two symbols share a spelling (cannot happen)")
    added = [{"id": len(sb) + i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, s in enumerate(SPECIALS)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
          "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated",
             "invert": False}, bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [u(sb[a]) + " " + u(sb[b]) for a, b in merges]},
    }
    tcfg = {
        "add_bos_token": True, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"}
                                 for t in added},
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": 1024, "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return tok, tcfg


class Encoder:
    """The tokenizer in Python: split regex, then merges by rank per word."""

    def __init__(self, merges):
        self.rank = {p: r for r, p in enumerate(merges)}
        self.pat = re.compile(SPLIT)
        self.cache = {}
        self.eot = 256 + len(merges)

    def word(self, bs):
        w = self.cache.get(bs)
        if w is not None:
            return w
        w = list(bs)
        while len(w) > 1:
            r, k = min((self.rank.get((w[j], w[j + 1]), 1 << 30), j) for j in range(len(w) - 1))
            if r == 1 << 30:
                break
            w[k:k + 2] = [256 + r]
        self.cache[bs] = w
        return w

    def encode(self, text):
        out = []
        for w in self.pat.findall(text):
            out += self.word(w.encode("utf-8"))
        return out


def read_merges(tokenizer_json_path):
    """Merges (symbol id pairs) back from a tokenizer.json this tool wrote."""
    with open(tokenizer_json_path, encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    return [tuple(vocab[x] for x in m.split(" ")) for m in tok["model"]["merges"]]


def write(out, merges):
    tok, tcfg = tokenizer_json(merges)
    os.makedirs(out, exist_ok=True)
    for name, obj in (("tokenizer.json", tok), ("tokenizer_config.json", tcfg)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")
    return tok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="+", help="UTF-8 text files")
    ap.add_argument("--vocab", type=int, default=1024, help="ids in all (bytes, merges, specials)")
    ap.add_argument("--out", required=True, help="folder for tokenizer.json")
    a = ap.parse_args(argv)
    texts = []
    for p in a.corpus:
        with open(p, encoding="utf-8", errors="replace") as f:
            texts += f.read().split(SPECIALS[0])   # documents, without the separator
    n = a.vocab - 256 - len(SPECIALS)
    if n < 0:
        raise SystemExit(f"bpe_train: --vocab must be at least {256 + len(SPECIALS)}")
    merges = learn(texts, n)
    write(a.out, merges)
    print(f"bpe_train: {len(merges)} merges, {256 + len(merges) + len(SPECIALS)} ids -> "
          f"{a.out}/tokenizer.json", file=sys.stderr)


if __name__ == "__main__":
    main()
