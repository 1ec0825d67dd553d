"""Pure decisions over in-memory state: chain tracking, prefix depths, sequence checks."""
