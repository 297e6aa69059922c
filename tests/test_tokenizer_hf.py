#!/usr/bin/python3
"""test_tokenizer_hf.py - Hugging Face's Rust `tokenizers` as the oracle for the
engine's tokenizer, encode and decode, through `dflash tokenize --jsonl` and
`dflash detokenize --jsonl` (one process per vocabulary and mode).

Vocabularies: Qwen3 and Llama-3 tokenizer.json (../shared/assets/tokenizers),
SmolLM2's GGUF vocabulary ($DFLASH_SMOLLM2, default
$DFLASH_SRC/build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, made by `make
model`) and llama.cpp's Llama-2 sentencepiece GGUF (vectors/llama.cpp). For a
GGUF the oracle is transformers' own conversion
(AutoTokenizer.from_pretrained(dir, gguf_file=...).backend_tokenizer) with
the two steps it gets wrong put back (gguf_oracle says which and why).

Texts: the shared vectors (basic_20 texts, llama.cpp's .inp cases), every
corpus file whole, slices of them cut at random byte offsets on UTF-8
boundaries, and adversarial strings (whitespace runs, mixed scripts, NFC
pairs, emoji ZWJ sequences, special-token text, random mixes of all these).
Encode: ids id for id, special-token text parsed and not parsed
(tokenizers' encode_special_tokens), add_special on and off. Decode: the
oracle's ids, every id of the vocabulary and random id sequences (which split
characters, so U+FFFD handling is compared too), byte for byte, with special
tokens shown and skipped. $DFLASH_SEED changes the random cuts (default fixed).
"""
import json
import os
import random
import subprocess
import sys
import time
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("DFLASH_SRC", os.path.join(HERE, ".."))
SHARED = os.environ.get("DFLASH_SHARED", os.path.join(SRC, "..", "shared"))
ASSETS = os.path.join(SHARED, "assets")
SMOLLM2 = os.environ.get("DFLASH_SMOLLM2",
                         os.path.join(SRC, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
LLAMA2_SPM = os.path.join(ASSETS, "vectors", "llama.cpp", "ggml-vocab-llama-spm.gguf")
SEED = int(os.environ.get("DFLASH_SEED", "20250601"))
sys.path.insert(0, HERE)
from testlib import check, finish, missing  # noqa: E402

SHOW = 3  # mismatches printed in full per group

# ---- texts ------------------------------------------------------------------------------

WS = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\r", "\x0b", "\x0c", "\u00a0", "\u3000",
      "\u2009", "\u200b", "\u2028", "\u0085", "\u1680"]
WORDS = ["a", "The", "hello", "WORLD", "I'm", "don't", "'s", "'S", "'ll", "'VE", "\u2019s", "x",
         "42", "1234567", "3.14", "1,000", "\u0663\u0664\u0665", "\uff10\uff11\uff12", "\u00b2",
         "\u00bd", "\u216b", "\u4f60\u597d", "\u4e16\u754c", "\u65e5\u672c\u8a9e",
         "\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4", "\u041f\u0440\u0438\u0432\u0435\u0442",
         "\u043c\u0438\u0440", "\u0645\u0631\u062d\u0628\u0627", "\u05e9\u05dc\u05d5\u05dd",
         "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e44\u0e17\u0e22",
         "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "e\u0301", "\u00e9",
         "\u1100\u1161\u11a8", "\u212b", "A\u030a", "\ufb01", "\uff48\uff45\uff4c\uff4c\uff4f",
         "\u00ad", "\ufeff", "\U0001d400", "\U00010348", "\ue000", "\uffff", "\U0010ffff", "\x01",
         "\x7f", "\U0001f600", "\U0001f44d\U0001f3fd",
         "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
         "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f1fa\U0001f1f8", "1\ufe0f\u20e3",
         "\u2764\ufe0f",
         "\U0001f9d1\U0001f3ff\u200d\U0001f680", "def f(x):\n    return x",
         '{"a": [1, 2]}',
         "http://example.com/a?b=c", "#include <stdio.h>", "```", "...", "!!!", "\u2014",
         "\u201cquoted\u201d", "\\", "$1", "a1b2", "__init__", "CamelCase", "snake_case"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
           "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|reserved_special_token_0|>", "<repo_name>", "<file_sep>", "<|im_start", "|>", "<",
           "<<", "<|", "<|im_end|>>", "<s>", "</s>", "<unk>"]


def adversarial(rng):
    """Hand-written cases, then random mixes of whitespace, words and special-token text."""
    out = ["", " ", "  1", "a  1", "  \n1", "x \t 12", "<|im_start|>user\nhi<|im_end|>\n",
           " <|im_end|> ", "<|im_end|><|im_end|>", "x<|endoftext|>y", "a <think>b</think> c",
           "<|im_start|><|im_start|>", "<|im_start|" + "x" * 5, "\u00e9" * 20 + "e\u0301" * 20,
           # bytes SmolLM2's vocabulary lacks: dropped, not <unk> (a fixed bug)
           "a\x04b\x06 \x13\x14\x16\x1d!", "x\U00040000\U00080000y"]
    for k in (1, 2, 3, 5, 8, 16, 33):
        for w in (" ", "\n", "\t", " \n", "\u3000", "\r\n"):
            out += [w * k, "a" + w * k + "b", w * k + "1", "x" + w * k, w * k + "<|im_end|>"]
    atoms = WS + WORDS + SPECIAL
    for _ in range(600):
        n = rng.randint(1, 14)
        out.append("".join(rng.choice(atoms) if rng.random() < 0.7 else rng.choice(WS)
                           for _ in range(n)))
    # random characters from the scripts above and beyond (no surrogates, no NUL), assigned
    # in Python's Unicode (14.0 with Debian 12's Python 3.11, as its PCRE2 10.42): those
    # assigned since split differently (a known gap, docs/tokenizer.md)
    def char(lo, hi):
        c = chr(rng.randint(lo, hi))
        return c if unicodedata.category(c) != "Cn" else char(lo, hi)

    blocks = [(0x01, 0x7f), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x3000, 0x30ff),
              (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xfe00, 0xfeff), (0xff00, 0xffef),
              (0x1f300, 0x1faff), (0x10000, 0x10ffff)]
    for _ in range(300):
        lo, hi = rng.choice(blocks)
        out.append("".join(char(lo, hi) if rng.random() < 0.8 else rng.choice(WS)
                           for _ in range(rng.randint(1, 24))))
    return out


def vectors():
    texts = []
    for name in ("qwen3_basic_20.json", "llama3_basic_20.json"):
        p = os.path.join(ASSETS, "vectors", name)
        if not os.path.exists(p):
            missing(p)
            continue
        texts += [c["text"] for c in json.load(open(p, encoding="utf-8"))["cases"]]
    for name in ("qwen2", "llama-bpe", "llama-spm"):
        p = os.path.join(ASSETS, "vectors", "llama.cpp", f"ggml-vocab-{name}.gguf.inp")
        if not os.path.exists(p):
            missing(p)
            continue
        cases = open(p, encoding="utf-8", newline="").read().split("\n__ggml_vocab_test__\n")
        texts += cases[:-1]  # the file ends with the separator
    return texts


def corpus(rng):
    """(whole files, slices cut at random UTF-8 boundaries)."""
    d = os.path.join(ASSETS, "corpus")
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    if not names:
        missing(d)
    files, slices = [], []
    for name in names:
        b = open(os.path.join(d, name), "rb").read()
        files.append(b.decode("utf-8"))

        def cut(i):  # forward to the next character start
            while i < len(b) and b[i] & 0xC0 == 0x80:
                i += 1
            return i

        for _ in range(min(400, len(b) // 8)):
            n = rng.choice((rng.randint(1, 16), rng.randint(17, 256), rng.randint(257, 4096)))
            a = cut(rng.randrange(len(b)))
            slices.append(b[a:cut(min(len(b), a + n))].decode("utf-8"))
    return files, slices


# ---- the two sides --------------------------------------------------------------------------

def engine(binary, model, sub, flags, items):
    """One dflash process for all items; a list of results, or None after a failed check."""
    inp = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items).encode("utf-8")
    r = subprocess.run([binary, sub, "-m", model, "--jsonl", "-", *flags], input=inp,
                       capture_output=True, timeout=600)
    if not check(r.returncode == 0, f"dflash {sub} {' '.join(flags)} -m {model}: exit "
                 f"{r.returncode}: {r.stderr.decode(errors='replace').strip()[-500:]}"):
        return None
    try:
        out = [json.loads(line) for line in r.stdout.decode("utf-8").split("\n")[:-1]]
    except ValueError as e:  # invalid UTF-8 or JSON is a bug of the engine
        check(False, f"dflash {sub} -m {model}: output is not UTF-8 JSON lines: {e}")
        return None
    check(len(out) == len(items), f"dflash {sub}: {len(out)} lines for {len(items)} inputs")
    return out


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_ids(what, texts, want, got, hf):
    bad = 0
    for t, w, g in zip(texts, want, got):
        if w.ids == g:
            continue
        bad += 1
        if bad <= SHOW:
            i = first_diff(w.ids, g)
            print(f"  {what}: text {t[:300]!r}{'...' if len(t) > 300 else ''}\n"
                  f"    first difference at id {i}: hf {w.ids[max(0, i - 3):i + 5]} "
                  f"{[hf.id_to_token(x) for x in w.ids[i:i + 5]]}\n"
                  f"    dflash {g[max(0, i - 3):i + 5]} {[hf.id_to_token(x) for x in g[i:i + 5]]}")
    n = sum(len(t.encode("utf-8")) for t in texts)
    print(f"  {what}: {len(texts)} strings, {n} bytes, {sum(len(w.ids) for w in want)} ids, "
          f"{bad} differ", flush=True)
    check(bad == 0, f"{what}: {bad} of {len(texts)} strings tokenize differently")


def compare_text(what, seqs, want, got):
    bad = 0
    for s, w, g in zip(seqs, want, got):
        w, g = w.encode("utf-8"), g.encode("utf-8")
        if w == g:
            continue
        bad += 1
        if bad <= SHOW:
            i = first_diff(w, g)
            print(f"  {what}: ids {s[:40]}{'...' if len(s) > 40 else ''}\n"
                  f"    first difference at byte {i}: hf {w[max(0, i - 8):i + 16]!r}\n"
                  f"    dflash {g[max(0, i - 8):i + 16]!r}")
    n = sum(len(w.encode("utf-8")) for w in want)
    print(f"  {what}: {len(seqs)} id lists, {sum(map(len, seqs))} ids, {n} bytes, {bad} differ",
          flush=True)
    check(bad == 0, f"{what}: {bad} of {len(seqs)} id lists decode differently")


def byte_runs_ok(hf, ids):
    """False when a run of byte-fallback tokens (<0xNN>) mixes invalid bytes with valid
    characters. tokens' ByteFallback decoder writes U+FFFD for every byte of such a run,
    "\\xa3" "8" -> "\ufffd\ufffd", where sentencepiece (the tokenizer these vocabularies come
    from) and dflash keep the valid characters, "\ufffd8": no oracle for those lists."""
    run = bytearray()
    for t in [hf.id_to_token(i) for i in ids] + [None]:
        if t and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            run.append(int(t[3:5], 16))
            continue
        text = run.decode("utf-8", "replace")  # U+FFFD per maximal invalid subpart
        if "\ufffd" in text and text != "\ufffd" * len(run):
            return False
        run.clear()
    return True


def encode_hf(tok, texts, add_special, parse_special):
    tok.encode_special_tokens = not parse_special
    fast = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets
    return fast(texts, add_special_tokens=add_special)


def by_group(names, sizes, *lists):
    """Cuts lists batched over groups back into (group, slices...) per group."""
    k = 0
    for g, n in zip(names, sizes):
        yield (g, *(x[k:k + n] for x in lists))
        k += n


def test_vocab(binary, name, model, hf, groups, rng):
    t0 = time.time()
    print(f"{name}: {model}", flush=True)
    v = hf.get_vocab_size(with_added_tokens=True)
    ids_of = {}
    for mode, flags, add, parse, which in (
            ("encode", [], False, True, ("vectors", "adversarial", "slices", "files")),
            ("encode --no-parse-special", ["--no-parse-special"], False, False,
             ("vectors", "adversarial", "slices")),
            ("encode --special", ["--special"], True, True, ("vectors", "adversarial"))):
        which = [g for g in which if groups[g]]
        texts = [t for g in which for t in groups[g]]
        want = encode_hf(hf, texts, add, parse)
        got = engine(binary, model, "tokenize", flags, texts)
        if got is None:
            continue
        for g, t, w, o in by_group(which, [len(groups[g]) for g in which], texts, want, got):
            compare_ids(f"{name} {mode} {g}", t, w, o, hf)
            if not flags:
                ids_of[g] = [x.ids for x in w]
    # decode: the oracle's ids of every text, every id of the vocabulary (shuffled, 7 a line),
    # and random sequences (mostly short, so split characters end lines too)
    every = list(range(v))
    rng.shuffle(every)
    ids_of["every id"] = [every[i:i + 7] for i in range(0, v, 7)]
    ids_of["random ids"] = [[rng.randrange(v) for _ in range(rng.randint(1, 12))]
                            for _ in range(2000)]
    special = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}
    for g in ids_of:  # skipped special tokens join the byte runs around them
        kept = [s for s in ids_of[g]
                if byte_runs_ok(hf, s) and byte_runs_ok(hf, [i for i in s if i not in special])]
        if len(kept) < len(ids_of[g]):
            print(f"  {name} decode {g}: {len(ids_of[g]) - len(kept)} id lists where "
                  f"Hugging Face and sentencepiece decode <0xNN> runs differently left out")
        ids_of[g] = kept
    seqs = [s for g in ids_of for s in ids_of[g]]
    for mode, flags, skip in (("decode", [], False), ("decode --skip-special", ["--skip-special"],
                                                      True)):
        want = hf.decode_batch(seqs, skip_special_tokens=skip)
        got = engine(binary, model, "detokenize", flags, seqs)
        if got is None:
            continue
        for g, q, w, o in by_group(list(ids_of), [len(x) for x in ids_of.values()], seqs, want,
                                   got):
            compare_text(f"{name} {mode} {g}", q, w, o)
    print(f"{name}: {time.time() - t0:.1f} s")


def jsonl_errors(binary, model):
    """A bad line stops the run with its number; an unknown id is named."""
    for sub, inp, msg in (("tokenize", '"a"\n5\n', "line 2 is not a JSON string"),
                          ("detokenize", "[1, 2]\n[1, -1]\n", "line 2 is not a JSON array"),
                          ("detokenize", "[1, 2.5]\n", "line 1 is not a JSON array"),
                          ("detokenize", "[999999999]\n", "999999999 is not in the vocabulary")):
        r = subprocess.run([binary, sub, "-m", model, "--jsonl", "-"], input=inp.encode(),
                           capture_output=True, timeout=60)
        err = r.stderr.decode(errors="replace")
        check(r.returncode == 1 and msg in err, f"dflash {sub} --jsonl {inp!r}: exit "
              f"{r.returncode}, stderr {err.strip()!r}, expected 1 and {msg!r}")


def gguf_oracle(path):
    """The tokenizer transformers converts from a GGUF file, with the steps its conversion
    leaves out put back: for pre "smollm" the Digits split (SmolLM2's tokenizer.json:
    Digits(individual_digits), then ByteLevel; llama.cpp: \\p{N}, then GPT-2's regex), and
    for a sentencepiece vocabulary with a space prefix Llama-2's tokenizer.json normalizer
    (a "\u2581" before the text, spaces as "\u2581", no pre-tokenizer) in place of
    Metaspace(prepend_scheme="first"), which turns " x" into "\u2581x" where Llama-2's file,
    sentencepiece and llama.cpp give "\u2581\u2581x" (transformers builds Phi-3 this way)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tokenizers import normalizers, pre_tokenizers
    from transformers import AutoTokenizer
    from transformers.integrations.gguf.reader import read_gguf_metadata  # what it reads with
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tok = hf.backend_tokenizer
    meta = read_gguf_metadata(path)[0]
    if (meta.get("tokenizer.ggml.pre") == "smollm" and
            isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel)):
        print("  transformers' conversion has no Digits split for pre \"smollm\": added")
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), tok.pre_tokenizer])
    if (meta.get("tokenizer.ggml.model") == "llama" and
            meta.get("tokenizer.ggml.add_space_prefix", True) and
            isinstance(tok.pre_tokenizer, pre_tokenizers.Metaspace)):
        print("  transformers' conversion prepends \"\u2581\" with Metaspace(first): replaced")
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.pre_tokenizer = None
    return tok


def main():
    t0 = time.time()
    binary = os.environ.get("DFLASH_BIN")
    if not binary or not os.access(binary, os.X_OK):
        missing("the dflash binary ($DFLASH_BIN)")
        return finish()
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        missing(f"Hugging Face tokenizers ({e})")
        return finish()
    rng = random.Random(SEED)
    files, slices = corpus(rng)
    groups = {"vectors": vectors(), "adversarial": adversarial(rng), "slices": slices,
              "files": files}
    print(f"seed {SEED} (DFLASH_SEED): {', '.join(f'{len(v)} {k}' for k, v in groups.items())}")
    for name in ("qwen3", "llama3"):
        d = os.path.join(ASSETS, "tokenizers", name)
        if not os.path.exists(os.path.join(d, "tokenizer.json")):
            missing(f"{d}/tokenizer.json")
            continue
        test_vocab(binary, name, d, Tokenizer.from_file(os.path.join(d, "tokenizer.json")),
                   groups, rng)
        if name == "qwen3":
            jsonl_errors(binary, d)
    # Hugging Face runs a sentencepiece vocabulary's whole file as one word (13 s); slices only
    spm = dict(groups, files=[])
    for name, path, g in (("smollm2", SMOLLM2, groups), ("llama2-spm", LLAMA2_SPM, spm)):
        if not os.path.exists(path):
            missing(path + (" (make model; or set $DFLASH_SMOLLM2)" if path == SMOLLM2 else ""))
            continue
        try:
            hf = gguf_oracle(path)
        except ImportError as e:
            missing(f"transformers ({e})")
            continue
        test_vocab(binary, name, path, hf, g, rng)
    print(f"test_tokenizer_hf: {time.time() - t0:.1f} s")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
