"""No prompt text, token ids, salts or keys in the logs of a full run.

Every logger at DEBUG while a whole stack serves real traffic: simulated vLLM engines (with
API keys) -> KV listener (salt echo) -> nats-server -> indexer -> redis-server -> the ingress
with prefix routing, the KV scorer and the Redis response cache. The traffic: chat requests
with a distinctive prompt and the client's API key (miss, hit, streamed), a completion whose
prompt is token ids, a request carrying its own `cache_salt`, malformed bodies that quote the
prompt, and admin calls with a wrong and a right token. Then the formatted log text (messages,
arguments and tracebacks) is searched for every one of those values."""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from continuum_common.hashing import request_prefix_key
from continuum_common.procs import NatsServer, RedisServer
from continuum_common.salt import make_salt
from continuum_testing.kv_stack import MODEL, SECRET, chat, key_of, kv_stack, words

PROMPT_MARK = "QuasarMarmaladeZebra"
CLIENT_KEY = "sk-client-hygiene-5d1e9c0b7a"
BACKEND_KEY = "sk-backend-hygiene-93f0aa41c2"
BACKEND_KEY_ENV = "CONTINUUM_TEST_HYGIENE_BACKEND_KEY"
ADMIN_TOKEN = "admin-hygiene-token-0c7e51"
WRONG_ADMIN_TOKEN = "admin-hygiene-wrong-9b2f44"
ADMIN_ENV = "CONTINUUM_TEST_HYGIENE_ADMIN"
CLIENT_SALT = "client-salt-hygiene-6a3d08"
TOKEN_IDS = [48151, 62342, 95117, 30451, 77213, 11839, 64207, 52961]


class Capture(logging.Handler):
    """Formats every record the way an operator would read it (with any traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def capture() -> Iterator[Capture]:
    handler = Capture()
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    # Loggers that do not propagate (uvicorn's, when configured) get the handler directly.
    detached = [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger) and not lg.propagate
    ]
    for lg in detached:
        lg.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
        for lg in detached:
            lg.removeHandler(handler)


def _token_id_patterns() -> list[re.Pattern[str]]:
    """Any two consecutive ids of TOKEN_IDS, however a list would be printed."""
    return [re.compile(rf"\b{a}\D{{1,3}}{b}\b") for a, b in itertools.pairwise(TOKEN_IDS)]


async def _traffic(s: Any) -> list[str]:
    """Send the requests; returns the cache_salt values the ingress computed for them."""
    http = s.http
    url = s.ingress.url
    client = {"authorization": f"Bearer {CLIENT_KEY}"}
    system = f"You are the {PROMPT_MARK} assistant. " + words("hygiene", 80)
    body = chat(system, f"Tell me about {PROMPT_MARK} please")
    for _ in range(2):  # miss, then hit from the Redis response cache
        response = await http.post(f"{url}/v1/chat/completions", json=body, headers=client)
        assert response.status_code == 200, response.text
    assert response.headers["x-cache"] == "HIT"
    streamed = {**body, "stream": True}
    for _ in range(2):
        async with http.stream("POST", f"{url}/v1/chat/completions", json=streamed, headers=client) as r:
            assert r.status_code == 200
            assert b"[DONE]" in b"".join([chunk async for chunk in r.aiter_bytes()])
    completion = {"model": MODEL, "prompt": TOKEN_IDS, "max_tokens": 4, "temperature": 0}
    for _ in range(2):
        response = await http.post(f"{url}/v1/completions", json=completion, headers=client)
        assert response.status_code == 200, response.text
    salted = {**chat(system, f"{PROMPT_MARK} with a salt"), "cache_salt": CLIENT_SALT}
    response = await http.post(f"{url}/v1/chat/completions", json=salted, headers=client)
    assert response.status_code == 200, response.text
    broken = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{PROMPT_MARK}"}}'
    response = await http.post(f"{url}/v1/chat/completions", content=broken.encode(), headers=client)
    assert response.status_code == 400
    wrong_type = {"model": MODEL, "messages": f"{PROMPT_MARK} {TOKEN_IDS}", "cache_salt": CLIENT_SALT}
    response = await http.post(f"{url}/v1/chat/completions", json=wrong_type, headers=client)
    assert response.status_code == 400
    for token, status in ((WRONG_ADMIN_TOKEN, 401), (ADMIN_TOKEN, 200)):
        admin = {"authorization": f"Bearer {token}"}
        response = await http.get(f"{url}/admin/response-cache/stats", headers=admin)
        assert response.status_code == status
    # The engines' KV events have gone through listener, NATS and indexer into the index.
    await s.wait_holders(key_of(body), bool)
    key = request_prefix_key(body, enabled=True)
    assert key is not None
    return [make_salt(SECRET.encode(), s.name(i), key) for i in range(len(s.fleet.engines))]


async def test_a_full_run_logs_no_prompt_token_ids_salt_or_key(
    nats_server: NatsServer, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, capture: Capture
) -> None:
    monkeypatch.setenv(BACKEND_KEY_ENV, BACKEND_KEY)
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    extra = {"response_cache": {"enabled": True, "backend": "redis"}, "admin": {"token_env": ADMIN_ENV}}
    async with kv_stack(
        nats_server, redis_server, monkeypatch, engines=2, backend_options={"api_key_env": BACKEND_KEY_ENV}, extra=extra
    ) as s:
        salts = await _traffic(s)
    text = "\n".join(capture.lines)
    assert len(capture.lines) > 20 and "DEBUG" in text  # the capture saw the run at DEBUG
    secrets = {
        "prompt": PROMPT_MARK,
        "client API key": CLIENT_KEY,
        "backend API key": BACKEND_KEY,
        "admin token": ADMIN_TOKEN,
        "wrong admin token": WRONG_ADMIN_TOKEN,
        "client cache_salt": CLIENT_SALT,
        "salt-echo secret": SECRET,
        **{f"salt MAC for engine {i}": salt.rsplit(".", 1)[1] for i, salt in enumerate(salts)},
    }
    leaked = [what for what, value in secrets.items() if value in text]
    leaked += [f"token ids ({p.pattern})" for p in _token_id_patterns() if p.search(text)]
    offending = [line for line in capture.lines if any(v in line for v in secrets.values())][:5]
    assert leaked == [], f"{leaked}: {offending}"
