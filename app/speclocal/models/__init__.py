"""Model catalogue, fetching and GGUF inspection (no weights are loaded here)."""
