#!/usr/bin/env python3
"""expect.py - greedy `dflash generate` outputs for the prompts api.py sends.

usage: expect.py DFLASH_BIN TARGET [DRAFT|none] OUT.json
Writes {chat_prompt, completion_prompt, max_tokens, ctx_size, with_draft,
chat_text, completion_text, sampled_text}: the text generate prints, less the
newline it adds."""
import json
import subprocess
import sys

CHAT = "Tell me a short story about a lighthouse."
COMPLETION = "Once upon a time, in a small village by the sea,"
MAX_TOKENS = 24
CTX = 512


def generate(binary, target, draft, *args):
    cmd = [binary, "generate", "-q", "-m", target, "--draft", draft, "-c", str(CTX),
           "-n", str(MAX_TOKENS), "--temp", "0", *args]
    out = subprocess.run(cmd, capture_output=True, timeout=300)
    if out.returncode:
        sys.exit(f"expect.py: {' '.join(cmd)} failed:\n{out.stderr.decode(errors='replace')}")
    text = out.stdout
    if not text.endswith(b"\n"):
        sys.exit("expect.py: generate output does not end with its newline")
    return text[:-1].decode("utf-8")


def main():
    binary, target, draft, out = sys.argv[1:5]
    res = {
        "chat_prompt": CHAT, "completion_prompt": COMPLETION, "max_tokens": MAX_TOKENS,
        "ctx_size": CTX, "with_draft": draft != "none",
        "chat_text": generate(binary, target, draft, "--chat", "--no-think", "-p", CHAT),
        "completion_text": generate(binary, target, draft, "-p", COMPLETION),
        # Sampled requests decode classically: the same text as without a drafter.
        "sampled_text": generate(binary, target, "none", "--chat", "--no-think", "--temp", "0.9",
                                 "--top-p", "0.95", "--top-k", "40", "--min-p", "0.01",
                                 "--seed", "1234", "-p", CHAT),
    }
    with open(out, "w") as f:
        json.dump(res, f, ensure_ascii=False, indent=1)


main()
