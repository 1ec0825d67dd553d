"""I/O adapters: the only modules that import nats, redis and httpx clients."""
