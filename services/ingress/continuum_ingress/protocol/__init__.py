"""Pure request parsing and validation, and provider-shaped error bodies (no I/O)."""
