"""continuum_ingress: the OpenAI/Anthropic-compatible front door (`continuum-router serve`)."""
