"""I/O adapters of the response cache: the only modules here that import redis or httpx."""
