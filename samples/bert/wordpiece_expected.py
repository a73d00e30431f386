#!/usr/bin/env python3
"""Expected token ids of tests/data/wordpiece_corpus.jsonl from Hugging Face
`tokenizers` (the model's tokenizer.json, truncation to 512, no padding):
the answers tests/test_wordpiece.c checks our C tokenizer against, token for
token. Committed; regenerate with

    python3 samples/bert/wordpiece_expected.py models/all-MiniLM-L6-v2 \
        tests/data/wordpiece_corpus.jsonl tests/data/wordpiece_expected.jsonl
"""
import json
import os
import sys

from tokenizers import Tokenizer

model_dir, corpus, out = sys.argv[1:4]
tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
tok.enable_truncation(max_length=512)
tok.no_padding()
with open(corpus, encoding="utf-8") as f, open(out, "w") as o:
    for line in f:
        text = json.loads(line)
        o.write(json.dumps(tok.encode(text).ids) + "\n")
