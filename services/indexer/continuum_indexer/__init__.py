"""continuum_indexer: the KV index writer (JetStream -> Redis)."""
