"""The built-in target: its variants, how it is built and trained, its cache and its
word-level tokenizer."""
