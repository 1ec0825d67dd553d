"""I/O adapters: ZMQ event publisher, HTTP API, uvicorn server wrapper."""
