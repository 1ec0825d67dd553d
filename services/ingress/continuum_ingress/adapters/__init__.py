"""I/O adapters: the only modules that hold HTTP clients (httpx) and talk to backends."""
