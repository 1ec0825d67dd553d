"""Pure routing decisions over snapshots: selection strategies, the KV scorer contract, the
circuit breaker and the Anthropic cache_control rules. No I/O, no clocks read here (callers
pass `now`)."""
