"""continuum_gemini_cache: Gemini cachedContents lifecycle service."""
