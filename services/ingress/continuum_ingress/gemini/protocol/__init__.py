"""Pure conversions between the OpenAI chat format and the Gemini Generative Language API
(provider-apis.md §1, §3): requests, responses, streams, usage and errors. No I/O."""
