"""continuum_listener: engine KV events -> NATS JetStream."""
