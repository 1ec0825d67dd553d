"""I/O adapters of the KV index (the only kvindex modules that import redis)."""
