"""I/O of the ingress's Gemini support (the NATS client of the gemini-cache service)."""
