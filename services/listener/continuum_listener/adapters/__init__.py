"""The only modules that talk to the network (ZMQ, HTTP, NATS)."""
