"""continuum_sim: a simulated vLLM engine."""
