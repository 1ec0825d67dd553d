"""I/O adapters: the only modules that open sockets to backends (adapters.h1 is the HTTP client)."""
