"""Pure parsing of what arrives on the bus (no I/O)."""
