"""Bus contracts: what services send each other over NATS, with their codecs (pure, no I/O)."""
