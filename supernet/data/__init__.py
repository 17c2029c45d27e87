"""Prompts: LLaVA-style JSONL in and out, the built-in synthetic set and its images."""
