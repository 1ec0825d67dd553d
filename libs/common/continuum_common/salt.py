"""Salt echo: the authenticated prefix key the ingress hands to vLLM / TRT-LLM as `cache_salt`.

The engine folds `cache_salt` into the first block's extra keys and publishes it back in its KV
events, so the listener can map a block chain to the router's prefix key without detokenizing.
The salt is authenticated (HMAC-SHA256 with a secret shared by ingress and listener) and bound
to the backend it was sent to, so an engine client cannot announce prefixes it does not hold or
claim them for another backend.

    cache_salt = "cr1." + prefix_key_hex (64) + "." + mac_hex (32)
    mac = HMAC-SHA256(secret, "continuum-salt-v1" ++ 0x00 ++ backend ++ 0x00 ++ prefix_key)[:16]

Side effect worth knowing: vLLM only shares KV blocks between requests with equal salts. Equal
prefix keys on one backend give equal salts, so requests that share a prefix key still share
their cache; requests whose first `max_prefix_length` bytes differ would not have shared much.
"""

from __future__ import annotations

import hashlib
import hmac

SALT_PREFIX = "cr1."
_DOMAIN = b"continuum-salt-v1\x00"


def _mac(secret: bytes, backend: str, prefix_key: bytes) -> bytes:
    return hmac.new(secret, _DOMAIN + backend.encode() + b"\x00" + prefix_key, hashlib.sha256).digest()[:16]


def make_salt(secret: bytes, backend: str, prefix_key: bytes) -> str:
    return f"{SALT_PREFIX}{prefix_key.hex()}.{_mac(secret, backend, prefix_key).hex()}"


def verify_salt(secret: bytes, backend: str, salt: object) -> bytes | None:
    """The prefix key carried by `salt` when it is authentic for `backend`, else None."""
    if not isinstance(salt, str) or not salt.startswith(SALT_PREFIX) or len(salt) != 4 + 64 + 1 + 32:
        return None
    key_hex, dot, mac_hex = salt[4:].partition(".")
    if not dot:
        return None
    try:
        key = bytes.fromhex(key_hex)
        mac = bytes.fromhex(mac_hex)
    except ValueError:
        return None
    if len(key) != 32 or not hmac.compare_digest(mac, _mac(secret, backend, key)):
        return None
    return key
