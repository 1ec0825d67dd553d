"""continuum_sim: a simulated vLLM engine (OpenAI/Anthropic API, prefix cache, real vLLM KV events).

Public API (docs/sim-engine.md):

* `SimFleet` — async context manager that starts N engines on free ports and exposes their
  `EngineEndpoints` (HTTP URL, KV-event and replay endpoints, block size, ...).
* `EngineConfig`, `KvEventsConfig`, `TimingConfig` — frozen configuration dataclasses.
* `Tokenizer`, `render_chat` — the simulator's tokenizer and ChatML template, for clients that
  need the engine's exact token ids (benchmarks computing ideal hit rates, listener tests).
"""

from continuum_sim.app import EngineEndpoints
from continuum_sim.config import EngineConfig, KvEventsConfig
from continuum_sim.fleet import SimFleet, fleet_configs, listener_sources, router_backends
from continuum_sim.policy.timing import TimingConfig
from continuum_sim.protocol.chat_template import ChatMessage, parse_messages
from continuum_sim.protocol.chat_template import render as render_chat
from continuum_sim.protocol.tokenizer import SPECIAL_TOKENS, Tokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "ChatMessage",
    "EngineConfig",
    "EngineEndpoints",
    "KvEventsConfig",
    "SimFleet",
    "TimingConfig",
    "Tokenizer",
    "fleet_configs",
    "listener_sources",
    "parse_messages",
    "render_chat",
    "router_backends",
]
