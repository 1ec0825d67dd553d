"""Match groups at run time: which backends share a matching mode, and how a request becomes
the keys of that mode (docs/kv-scorer.md, "Matching modes").

* `precise`: the engine's own block hashes. Token ids come from a local tokenizer
  (continuum_common.tokenization: the chat template rendered with Jinja2, tokenized piece by
  piece with a content cache so a new turn costs only what it adds) or, without one, from a
  backend's `/tokenize` (kv/tokenize.py); continuum_common.hashing.blocks hashes them.
  Any failure falls back to approximate keys for that request (counted).
* `approximate`: chained hashes of the conversation's text in fixed-size chunks (kv/chunks.py).
* `prefix_key`: the seed's prefix key (the request's `prefix_key`, read in the prefix-key index).

Every group owns a RouteMemory: approximate records (the whole approximate index) or, in precise
mode, speculative entries.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from continuum_common.config.kv_index import ApproximateMatching, KvCacheIndex, MatchGroup, MatchMode
from continuum_common.config.router import RouterConfig
from continuum_common.hashing.request_text import content_text
from continuum_ingress.kv.chunks import chunk_chain, conversation_bytes
from continuum_ingress.kv.route_memory import RouteMemory
from continuum_ingress.protocol.apis import Api

if TYPE_CHECKING:
    from continuum_common.hashing.blocks import BlockHasher
    from continuum_common.tokenization import LocalTokenizer, PartialPrompt, PromptEncoder
    from continuum_ingress.state import RequestState

log = logging.getLogger("continuum.ingress.kv")

DEFAULT_GROUP = "*"  # not a valid group name, so it never clashes with a configured one
PROMPT_CACHE_BYTES = 256 << 20
FallbackReason = Literal["tokenizer_error", "tokenize_failed", "disabled"]


# Measured bytes per token: each answer's weight decays by this per later answer (about the
# last hundred count), and the ratio stays within these bounds whatever an engine answers.
MEASURE_DECAY = 0.99
MIN_BYTES_PER_TOKEN = 0.5
MAX_BYTES_PER_TOKEN = 32.0


@dataclass(frozen=True, slots=True)
class RequestKeys:
    """What the scorer looks up for one request in one group."""

    mode: MatchMode
    chain: Sequence[int]  # block / chunk hashes, root first (empty in prefix_key mode)
    tokens_per_key: float  # tokens one chain entry stands for
    prompt_tokens: int  # exact in precise mode, estimated otherwise
    fallback: FallbackReason | None = None  # precise mode fell back to approximate keys


class GroupRuntime:
    """One match group (or the default group of backends that are in none)."""

    def __init__(self, name: str, section: KvCacheIndex, group: MatchGroup | None) -> None:
        self.name = name
        self.config = group
        self.mode: MatchMode = group.mode if group is not None else section.default_mode
        self.approx: ApproximateMatching = group.approximate if group is not None else section.approximate
        self.block_size = group.block_size if group is not None else 16
        self.chunk_tokens = self.approx.chunk_bytes / self.approx.bytes_per_token
        # Bytes per token of approximate estimates: the configured value until the engines' own
        # /tokenize answers measure it (a precise group without a local tokenizer, whose new
        # prompts are matched approximately; code or non-English text is far from 4).
        self.bytes_per_token = self.approx.bytes_per_token
        self._seen_bytes = 0.0
        self._seen_tokens = 0.0
        self.learn_answers = section.learn_answers
        self.hasher: BlockHasher | None = None
        self.tokenizer: LocalTokenizer | None = None
        self.encoder: PromptEncoder | None = None
        # Set when the local tokenizer proved unusable: precise mode then uses approximate keys.
        self.precise_disabled: str | None = None
        # precise mode's own approximate fallback (its chunk records live apart from the
        # speculative block entries: they are different hashes)
        self.fallback_memory = RouteMemory(float(self.approx.ttl_seconds)) if self.mode == "precise" else None
        if self.mode == "precise":
            assert group is not None  # the default group is never precise (schema)
            self._load_precise(group)
            self.memory = RouteMemory(section.speculative_ttl_ms / 1000)
        else:
            capacity = None
            if self.approx.capacity_tokens is not None:
                capacity = max(1, int(self.approx.capacity_tokens / self.chunk_tokens))
            self.memory = RouteMemory(float(self.approx.ttl_seconds), capacity=capacity)

    @property
    def approximate_memory(self) -> RouteMemory:
        """Where this group's approximate chunk records live (a precise group's fallback)."""
        return self.fallback_memory if self.fallback_memory is not None else self.memory

    def _load_precise(self, group: MatchGroup) -> None:
        from continuum_common.hashing.blocks import make_block_hasher

        self.hasher = make_block_hasher(
            group.engine, group.block_size, hash_seed=group.hash_seed, vllm_hash_algo=group.vllm_hash_algo
        )
        if group.tokenizer is None:
            return
        from continuum_common.tokenization import LocalTokenizer, PromptEncoder, TokenizationError

        try:
            self.tokenizer = LocalTokenizer(group.tokenizer, chat_template=group.chat_template)
        except TokenizationError as exc:
            # The router still starts and serves: this group is matched approximately (every
            # request counted as a fallback) until the files are fixed and the router restarted.
            log.error(
                "match group %s: the local tokenizer cannot be used (%s); precise matching is off", self.name, exc
            )
            self.precise_disabled = "tokenizer_error"
            return
        self.encoder = PromptEncoder(self.tokenizer, self.hasher, max_cache_bytes=PROMPT_CACHE_BYTES)

    def reserve(self, backends: int) -> None:
        """Records for this many backends made now, before the ingress freezes its start-up
        heap (RouteMemory.reserve)."""
        self.memory.reserve(backends)
        if self.fallback_memory is not None:
            self.fallback_memory.reserve(backends)

    # ---- keys --------------------------------------------------------------------------------

    def measured(self, nbytes: int, tokens: int) -> None:
        """An engine tokenized `nbytes` bytes of requests into `tokens` tokens: approximate
        estimates follow the decayed ratio (recent answers weigh most, one odd request little)."""
        if nbytes <= 0 or tokens <= 0:
            return
        self._seen_bytes = self._seen_bytes * MEASURE_DECAY + nbytes
        self._seen_tokens = self._seen_tokens * MEASURE_DECAY + tokens
        self.bytes_per_token = min(MAX_BYTES_PER_TOKEN, max(MIN_BYTES_PER_TOKEN, self._seen_bytes / self._seen_tokens))

    def approximate_keys(self, state: RequestState, fallback: FallbackReason | None = None) -> RequestKeys:
        data = conversation_bytes(state.key_api, state.key_body)
        chain = chunk_chain(data, self.approx.chunk_bytes)
        prompt = max(1, round(len(data) / self.bytes_per_token))
        return RequestKeys("approximate", chain, self.approx.chunk_bytes / self.bytes_per_token, prompt, fallback)

    def prefix_key_keys(self, state: RequestState) -> RequestKeys:
        """No chain (the prefix-key index is read by the prefix key); the prompt estimated."""
        data = conversation_bytes(state.key_api, state.key_body)
        return RequestKeys("prefix_key", (), 1.0, max(1, round(len(data) / self.approx.bytes_per_token)))

    def begin_local(self, state: RequestState) -> PartialPrompt:
        """The request's prompt for the local tokenizer, encoded as far as the encoder's cache
        knows it; `local_keys` takes its keys once it is encoded far enough (raises
        TokenizationError, or whatever the chat template raises)."""
        assert self.encoder is not None and self.tokenizer is not None
        body = state.key_body
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        if state.key_api is Api.COMPLETIONS:
            prompt = body.get("prompt")
            text = prompt if isinstance(prompt, str) else ""
            return self.encoder.begin(text, add_special_tokens=True, cache_salt=salt)
        text = self.tokenizer.render_chat(chat_messages(state.key_api, body), **template_kwargs(body))
        return self.encoder.begin(text, add_special_tokens=False, cache_salt=salt)

    def local_keys(self, prompt: PartialPrompt) -> RequestKeys:
        """Precise keys of what `prompt` has encoded; the prompt's size is exact once it is
        done, estimated from the encoded part's tokens per character before."""
        chain = list(prompt.block_hashes)
        return RequestKeys("precise", chain, float(self.block_size), max(1, prompt.estimated_tokens))

    def keys_from_tokens(self, state: RequestState, tokens: Sequence[int]) -> RequestKeys:
        """Precise keys from token ids a backend's /tokenize returned."""
        assert self.hasher is not None
        salt = state.key_body.get("cache_salt")
        digests = self.hasher.chain(tokens, cache_salt=salt if isinstance(salt, str) else None)
        wire = self.hasher.wire
        return RequestKeys("precise", [wire(d) for d in digests], float(self.block_size), max(1, len(tokens)))


def chat_messages(api: Api, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """OpenAI-shaped messages for a chat template (Anthropic's top-level system becomes the
    first message; content arrays keep their text parts, as vLLM does before templating)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = []
    plain = all(isinstance(m, dict) and isinstance(m.get("content"), str | None) for m in messages)
    if plain and not (api is Api.MESSAGES and body.get("system") is not None):
        return messages  # the common case: nothing to convert, no copy
    out: list[dict[str, Any]] = []
    if api is Api.MESSAGES and body.get("system") is not None:
        out.append({"role": "system", "content": content_text(body.get("system"))})
    for message in messages:
        if isinstance(message, Mapping):
            item = dict(message)
            if not isinstance(item.get("content"), str | None):
                item["content"] = content_text(item.get("content"))
            out.append(item)
    return out


def template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"add_generation_prompt": True}
    tools = body.get("tools")
    if tools:
        kwargs["tools"] = tools
    extra = body.get("chat_template_kwargs")
    if isinstance(extra, Mapping):
        kwargs.update({k: v for k, v in extra.items() if isinstance(k, str)})
    return kwargs


def build_groups(config: RouterConfig) -> tuple[dict[str, GroupRuntime], dict[str, GroupRuntime]]:
    """Group runtimes by name, and backend name → its group (the default group for the rest)."""
    section = config.kv_cache_index
    groups = {g.name: GroupRuntime(g.name, section, g) for g in section.groups}
    default = GroupRuntime(DEFAULT_GROUP, section, None)
    groups.setdefault(DEFAULT_GROUP, default)
    of_backend: dict[str, GroupRuntime] = {}
    for backend in config.backends:
        spec = config.match_group_of(backend.name)
        of_backend[backend.name] = groups[spec.name] if spec is not None else default
    for group in groups.values():
        group.reserve(sum(1 for g in of_backend.values() if g is group))
    return groups, of_backend
