"""Model building blocks: torch and einops only, no file I/O, nothing runs on import."""
