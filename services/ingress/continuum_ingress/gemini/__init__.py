"""`type: gemini` backends in the ingress: the OpenAI-compatible or native
(`generateContent`) dialect with full conversion both ways, and the ingress half of the Gemini
context cache (lookups, ensures, drops and usage over NATS to the gemini-cache service).

* `protocol/`: pure conversions (OpenAI chat <-> generateContent, streams, usage, errors).
* `policy`: which requests may use a context cache.
* `context_cache`: the rewriter / rejection handler / component; `adapters/bus`: its NATS client.
* `dialect`: the per-attempt upstream dialect; `admin`: the admin endpoints; `wiring`: assembly.
"""
