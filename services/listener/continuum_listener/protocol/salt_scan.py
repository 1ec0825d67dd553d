"""Where an engine echoes the ingress's `cache_salt` (docs/hashing.md, kv-events-spec §1.7).

vLLM folds `cache_salt` into the extra keys of a request's first block only
(`start_token_idx == 0`), after the LoRA name and the multimodal keys and before the
prompt-embeds digest. The listener therefore looks for a string with the salt prefix in the
first block's extra keys; verification (HMAC, backend binding) happens in the tracker.
"""

from __future__ import annotations

from typing import Any

from continuum_common.salt import SALT_PREFIX

_MAX_KEYS = 64


def salt_candidate(extra_keys: Any, lora_name: str | None = None) -> str | None:
    """The first "cr1."-prefixed string of block 0's extra keys, or None."""
    if not isinstance(extra_keys, list) or not extra_keys:
        return None
    first = extra_keys[0]
    if not isinstance(first, list):
        return None
    for key in first[:_MAX_KEYS]:
        if type(key) is str and key.startswith(SALT_PREFIX) and key != lora_name:
            return key
    return None
