#!/usr/bin/env python3
"""Regenerates data/kjv_excerpt.txt, the bundled training corpus, from Debian's King James text.

Not run by the build: the excerpt is committed. This records exactly how it was made.
Needs the Debian packages bible-kjv (the `bible` reader) and bible-kjv-text (its compressed
data), e.g. `apt-get install bible-kjv`, or both .debs unpacked with `dpkg-deb -x` and
--bible/--data-dir pointed at them.

Usage: scripts/make_kjv_corpus.py [--bible /usr/bin/bible] [--data-dir /usr/lib] [--out FILE]
"""
import argparse
import re
import subprocess

# The books in the excerpt (the reader's abbreviations -> the heading written), in order.
BOOKS = [("Ge", "The Book of Genesis"), ("Exo", "The Book of Exodus"), ("Ruth", "The Book of Ruth"),
         ("Psa", "Psalms"), ("Prv", "Proverbs"), ("Eccl", "Ecclesiastes"),
         ("SSol", "The Song of Solomon"), ("Mark", "The Gospel According to Saint Mark"),
         ("John", "The Gospel According to Saint John")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bible", default="/usr/bin/bible")
    ap.add_argument("--data-dir", default="/usr/lib")
    ap.add_argument("--out", default="data/kjv_excerpt.txt")
    a = ap.parse_args()
    # -f: one verse per line, prefixed with its reference ("Ge1:1 In the beginning ...").
    text = subprocess.run([a.bible, "-p", a.data_dir, "-f", "gen1:1-rev22:21"], check=True,
                          capture_output=True, text=True, encoding="ascii").stdout
    verses = {}
    for line in text.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            raise SystemExit("unexpected line from the bible reader: %r" % line)
        book, ch, vs, t = m.groups()
        verses.setdefault(book, []).append((int(ch), int(vs), t))
    out = []
    for abbr, heading in BOOKS:
        out.append(heading + "\n")
        last = None
        for ch, vs, t in verses[abbr]:
            if ch != last:
                out.append("\nChapter %d\n\n" % ch)
                last = ch
            out.append("%d:%d %s\n" % (ch, vs, t))
        out.append("\n\n")
    with open(a.out, "w", encoding="ascii") as f:
        f.write("".join(out))


if __name__ == "__main__":
    main()
