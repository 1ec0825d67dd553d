"""Pure decisions of the indexer (no I/O)."""
