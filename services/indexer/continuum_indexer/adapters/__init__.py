"""I/O adapters of the indexer: the only modules that talk to NATS, HTTP or websockets."""
