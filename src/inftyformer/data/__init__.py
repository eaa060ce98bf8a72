"""Data readers, tokenizers and streams (no task logic)."""
