"""Test support: a small real OpenAI/Anthropic-compatible upstream (`StubUpstream`) and helpers
that run the ingress on loopback. Real HTTP over real sockets; nothing is mocked."""
