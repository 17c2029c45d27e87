"""The Hugging Face target VLM behind one adapter: family quirks, loading, prefill, verify,
rollback, hidden states of chosen layers and visual-token scores."""
