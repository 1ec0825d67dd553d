"""The native Gemini dialect's request translation (OpenAI chat → generateContent) on every chat
body the ingress validator accepts: a generateContent body or a ConversionError (a 400 naming
the parameter), never another exception (which would be a 500)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given

from continuum_ingress.errors import InvalidRequest
from continuum_ingress.gemini.protocol.request import to_generate_content
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.requests import parse_request
from tests.fuzz.strategies import FIELD_NAMES, chat_bodies, dump_json, fuzz_settings, mutated

# The fields the translation reads, besides the chat fields the validator knows.
GEMINI_FIELDS = [*FIELD_NAMES, "reasoning_effort", "extra_body", "google", "tool_calls", "function", "arguments",
                 "modalities", "audio", "prediction", "web_search_options", "json_schema", "functions",
                 "function_call", "thinking_config", "cached_content", "safety_settings", "image_url", "url",
                 "input_audio", "file", "file_data", "name", "tool_call_id", "extra_content", "thought_signature"]  # fmt: skip


@fuzz_settings(2.0)
@given(body=mutated(chat_bodies, 4, names=GEMINI_FIELDS))
def test_translation_of_accepted_chat_bodies(body: Any) -> None:
    try:
        parsed = parse_request(Api.CHAT, dump_json(body))
    except InvalidRequest:
        return
    try:
        request = to_generate_content(parsed.body)
    except InvalidRequest:
        return
    orjson.dumps(request)  # what the dialect sends upstream
