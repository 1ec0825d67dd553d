"""Local tokenization for precise KV matching (docs/hashing.md, "Precise-mode request encoding").

* `LocalTokenizer` — a Hugging Face tokenizer.json plus a Jinja2 chat template, used the way
  vLLM uses them (`render_chat`, `encode`, `decode`).
* `UnlockedTokenizer` — the same, releasing the interpreter lock on long texts (for a worker
  thread beside an event loop).
* `PromptEncoder` — a prompt text → `EncodedPrompt(token_count, block_hashes)`, the engine's
  block hashes (continuum_common.hashing.blocks), tokenizing and hashing only the pieces of
  text it has not seen before; `begin(text)` encodes lazily (`PartialPrompt`: `extend`, `finish`).
* `find_chat_template(tokenizer_json)` — a model directory's chat template, as Hugging Face
  finds it.
* `TokenizationError` (and `TokenizerLoadError`, `ChatTemplateError`) — everything that can go
  wrong; callers catch it and fall back.
"""

from continuum_common.tokenization.encoder import EncodedPrompt, EncoderStats, PartialPrompt, PromptEncoder
from continuum_common.tokenization.errors import ChatTemplateError, TokenizationError, TokenizerLoadError
from continuum_common.tokenization.local import LocalTokenizer, UnlockedTokenizer, find_chat_template
from continuum_common.tokenization.support import PiecewiseSupport

__all__ = [
    "ChatTemplateError",
    "EncodedPrompt",
    "EncoderStats",
    "LocalTokenizer",
    "PartialPrompt",
    "PiecewiseSupport",
    "PromptEncoder",
    "TokenizationError",
    "TokenizerLoadError",
    "UnlockedTokenizer",
    "find_chat_template",
]
