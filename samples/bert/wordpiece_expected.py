#!/usr/bin/env python3
"""Writes the reference ids for tests/test_wordpiece.c.

Reads tests/data/wordpiece_corpus.jsonl (one JSON string a line) and encodes
each with Hugging Face `tokenizers` from the model's tokenizer.json (padding
off, truncation to 512 ids), writing tests/data/wordpiece_expected.jsonl: one
JSON list of ids a line, in the corpus's order. The C test compares
samples/bert/wordpiece.c against it without needing Python.

  python3 samples/bert/wordpiece_expected.py [MODEL_DIR]   (default models/all-MiniLM-L6-v2)
"""
import json
import sys

from tokenizers import Tokenizer

MAX_LEN = 512


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "models/all-MiniLM-L6-v2"
    tok = Tokenizer.from_file(model_dir + "/tokenizer.json")
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_LEN)
    # split on "\n" only: a JSON line may hold U+2028 or U+0085 unescaped
    with open("tests/data/wordpiece_corpus.jsonl", encoding="utf-8", newline="") as f:
        lines = [l for l in f.read().split("\n") if l]
    with open("tests/data/wordpiece_expected.jsonl", "w", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(tok.encode(json.loads(line)).ids) + "\n")
    print("wrote %d lines to tests/data/wordpiece_expected.jsonl" % len(lines))


if __name__ == "__main__":
    main()
