#!/usr/bin/python3
"""Writes about 1 MiB of mixed-script text for bench_tokenizer.

Real sentences in many scripts are already on every Debian machine: the
translations in /usr/share/locale/*/LC_MESSAGES/*.mo. This takes the
translated strings of a fixed list of languages (CJK, Cyrillic, Arabic,
Hebrew, Devanagari, Thai, Greek, Vietnamese, accented Latin), files in sorted
order, and interleaves them one string per language in turn until the size is
reached. The text depends on which packages are installed; bench_tokenizer
prints the file's size and script mix next to its numbers.

usage: bench/make_mixed_text.py OUT [BYTES]
"""
import os
import struct
import sys

LANGS = ["zh_CN", "ja", "ko", "ru", "uk", "ar", "he", "hi", "th", "el", "vi", "de", "fr", "es"]


def mo_strings(path):
    """Translated strings of a GNU gettext .mo file (plural forms split)."""
    data = open(path, "rb").read()
    if len(data) < 28:
        return []
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if end is None:
        return []
    n, _, trans = struct.unpack(end + "III", data[8:20])
    out = []
    for i in range(n):
        length, off = struct.unpack(end + "II", data[trans + 8 * i: trans + 8 * i + 8])
        raw = data[off: off + length]
        if not raw or raw.startswith(b"Project-Id-Version") or b"Content-Type:" in raw:
            continue
        for part in raw.split(b"\0"):
            try:
                s = part.decode("utf-8").strip()
            except UnicodeDecodeError:
                continue
            if len(s) > 3:
                out.append(s)
    return out


def main():
    out_path = sys.argv[1]
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    per_lang = []
    for lang in LANGS:
        d = f"/usr/share/locale/{lang}/LC_MESSAGES"
        strings = []
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith(".mo"):
                    strings += mo_strings(os.path.join(d, f))
        if strings:
            per_lang.append(strings)
    if not per_lang:
        sys.exit("no translations under /usr/share/locale")
    buf, total, i = [], 0, 0
    while total < size:
        for strings in per_lang:
            s = (strings[i % len(strings)] + "\n").encode("utf-8")
            buf.append(s)
            total += len(s)
        i += 1
    text = b"".join(buf)[:size].decode("utf-8", "ignore").encode("utf-8")
    open(out_path, "wb").write(text)
    print(f"{out_path}: {len(text)} bytes from {len(per_lang)} languages")


if __name__ == "__main__":
    main()
