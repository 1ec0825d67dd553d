"""OpenAI chat completion request -> Gemini `generateContent` request (provider-apis.md §1.6).

* messages -> `contents`: `user` -> role `user`, `assistant` -> role `model` (text parts and
  `functionCall` parts from `tool_calls`), `tool` / `function` -> role `user` with
  `functionResponse` parts (consecutive tool results share one turn, as Gemini expects the
  answers to parallel calls together); `system` / `developer` -> `systemInstruction` parts.
* sampling parameters -> `generationConfig`; `response_format` -> `responseMimeType` /
  `responseJsonSchema`; `reasoning_effort` -> `thinkingConfig` (Google's compat mapping).
* `tools` / `functions` -> one `functionDeclarations` tool; `tool_choice` -> `toolConfig`.
* `extra_body.google` (or a top-level `google` object; both are seen in the wild):
  `cached_content` -> top-level `cachedContent`, `thinking_config` -> `thinkingConfig`,
  `safety_settings` -> `safetySettings`.
* Gemini 3 thought signatures travel in `tool_calls[].extra_content.google.thought_signature`,
  the convention of Google's own OpenAI-compatible endpoint, and go back as `thoughtSignature`.

What the native API cannot express (`logit_bias`, audio output, predicted outputs, web search,
non-function tools, remote files other than images) is a ConversionError (HTTP 400 naming the
parameter), never silently dropped. Fields that do not change the output (`user`, `metadata`,
`store`, `stream_options`, `service_tier`, `parallel_tool_calls`, ...) are ignored.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from continuum_common.gemini_api import bare_model, cache_resource
from continuum_ingress.gemini.errors import ConversionError

SYSTEM_ROLES = frozenset({"system", "developer"})
_TEXT_TYPES = frozenset({"text", "input_text"})
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*)*;base64,(?P<data>.*)$", re.DOTALL)
_UNSUPPORTED = ("audio", "prediction", "web_search_options")
_EFFORT_BUDGET = {"none": 0, "minimal": 1024, "low": 1024, "medium": 8192, "high": 24576, "xhigh": 24576, "max": 24576}
_EFFORT_LEVEL = {"none": "low", "minimal": "low", "low": "low", "medium": "high", "high": "high"}
_EFFORT_LEVEL.update({"xhigh": "high", "max": "high"})
_THINKING_KEYS = {"include_thoughts": "includeThoughts", "thinking_budget": "thinkingBudget"}
_THINKING_KEYS["thinking_level"] = "thinkingLevel"


def google_extras(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Gemini-specific options of an OpenAI-shaped request: `extra_body.google` (the
    documented wire format) merged over a top-level `google` object."""
    out: dict[str, Any] = {}
    for holder in (body, body.get("extra_body")):
        google = holder.get("google") if isinstance(holder, Mapping) else None
        if isinstance(google, Mapping):
            out.update(google)
    return out


def to_generate_content(body: Mapping[str, Any]) -> dict[str, Any]:
    """The generateContent body for an OpenAI chat body (already validated by the ingress)."""
    for name in _UNSUPPORTED:
        if body.get(name) is not None:
            raise ConversionError(f"'{name}' is not supported by the native Gemini API.", param=name)
    if body.get("logit_bias"):
        raise ConversionError("'logit_bias' is not supported by the Gemini API.", param="logit_bias")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise ConversionError("Only text output is supported through the native Gemini API.", param="modalities")
    system, contents = convert_messages(body.get("messages") or [])
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": system}
    tools = convert_tools(body)
    if tools:
        out["tools"] = tools
    tool_config = convert_tool_choice(body.get("tool_choice"))
    if tool_config:
        out["toolConfig"] = tool_config
    google = google_extras(body)
    config = generation_config(body, google)
    if config:
        out["generationConfig"] = config
    ref = google.get("cached_content")
    if ref is not None:
        if not isinstance(ref, str) or not ref:
            raise ConversionError("google.cached_content must be a cachedContents/{id} name.", param="extra_body")
        out["cachedContent"] = cache_resource(ref)
    safety = google.get("safety_settings")
    if safety is not None:
        out["safetySettings"] = safety
    return out


# --------------------------------------------------------------------------- messages


def convert_messages(messages: Sequence[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(systemInstruction parts, contents)."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        content = message.get("content")
        if role in SYSTEM_ROLES:
            system.extend(_text_parts(content, f"{where}.content"))
        elif role == "user":
            parts = _user_parts(content, f"{where}.content")
            contents.append({"role": "user", "parts": parts or [{"text": ""}]})
        elif role == "assistant":
            contents.append({"role": "model", "parts": _assistant_parts(message, where, call_names)})
        else:  # tool, function
            part = _function_response(message, where, call_names)
            last = contents[-1] if contents else None
            if last is not None and last["role"] == "user" and all("functionResponse" in p for p in last["parts"]):
                last["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
    return system, contents


def _text_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}]
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type", "text")
        if kind in _TEXT_TYPES and isinstance(part.get("text"), str):
            parts.append({"text": part["text"]})
        elif kind != "refusal":
            raise ConversionError(f"Content parts of type {kind!r} are not supported here.", param=f"{where}[{j}]")
    return parts


def _user_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return _text_parts(content, where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type", "text")
        at = f"{where}[{j}]"
        if kind in _TEXT_TYPES:
            parts.extend(_text_parts([part], where))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str):
                raise ConversionError("image_url.url must be a string.", param=f"{at}.image_url")
            parts.append(_media_part(url, at, "image/jpeg"))
        elif kind == "input_audio":
            audio = part.get("input_audio")
            if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
                raise ConversionError("input_audio needs data and format.", param=f"{at}.input_audio")
            mime = f"audio/{audio.get('format') or 'wav'}"
            parts.append({"inlineData": {"mimeType": mime, "data": audio["data"]}})
        elif kind == "file":
            file = part.get("file")
            data = file.get("file_data") if isinstance(file, Mapping) else None
            if not isinstance(data, str) or not data.startswith("data:"):
                raise ConversionError("Only inline file_data (a data: URL) is supported.", param=f"{at}.file")
            parts.append(_media_part(data, at, "application/octet-stream"))
        else:
            raise ConversionError(f"Content parts of type {kind!r} are not supported.", param=at)
    return parts


def _media_part(url: str, where: str, default_mime: str) -> dict[str, Any]:
    match = _DATA_URL.match(url)
    if match is not None:
        return {"inlineData": {"mimeType": match["mime"] or default_mime, "data": match["data"]}}
    if url.startswith(("http://", "https://", "gs://")):
        mime = mimetypes.guess_type(url.split("?", 1)[0])[0] or default_mime
        return {"fileData": {"mimeType": mime, "fileUri": url}}
    raise ConversionError("Media must be a data: URL or an http(s):// or gs:// URL.", param=where)


def _assistant_parts(message: Mapping[str, Any], where: str, call_names: dict[str, str]) -> list[dict[str, Any]]:
    parts = [p for p in _text_parts(message.get("content"), f"{where}.content") if p["text"]]
    calls = message.get("tool_calls") or []
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        calls = [*calls, {"type": "function", "function": legacy}]
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ConversionError("tool_calls need a function with a name.", param=at)
        part: dict[str, Any] = {"functionCall": {"name": fn["name"], "args": _arguments(fn.get("arguments"), at)}}
        signature = _thought_signature(call)
        if signature is not None:
            part["thoughtSignature"] = signature
        parts.append(part)
        if isinstance(call.get("id"), str):
            call_names[call["id"]] = fn["name"]
    return parts or [{"text": ""}]


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = orjson.loads(raw) if isinstance(raw, str) else None
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ConversionError("function.arguments must be a JSON object.", param=f"{where}.function.arguments")
    return value


def _thought_signature(call: Mapping[str, Any]) -> str | None:
    extra = call.get("extra_content")
    google = extra.get("google") if isinstance(extra, Mapping) else None
    signature = google.get("thought_signature") if isinstance(google, Mapping) else None
    return signature if isinstance(signature, str) else None


def _function_response(message: Mapping[str, Any], where: str, call_names: Mapping[str, str]) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    name = call_names.get(call_id) if isinstance(call_id, str) else None
    name = name or message.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError(
            "A tool message must answer a tool call of an earlier assistant message (tool_call_id).",
            param=f"{where}.tool_call_id",
        )
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(p["text"] for p in _text_parts(content, where))
    try:
        value = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        value = text
    response = value if isinstance(value, dict) else {"content": value}
    return {"functionResponse": {"name": name, "response": response}}


# --------------------------------------------------------------------------- tools


def _declaration(tool: Any, where: str, *, legacy: bool = False) -> dict[str, Any]:
    """A functionDeclaration from a `tools[]` entry (`{"type": "function", "function": {...}}`)
    or, with `legacy`, a `functions[]` entry (the function object itself)."""
    fn: Any = None
    if isinstance(tool, Mapping):
        if legacy:
            fn = tool
        elif tool.get("type", "function") == "function":
            fn = tool.get("function", tool)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ConversionError("Only function tools are supported by the Gemini API.", param=where)
    decl: dict[str, Any] = {"name": fn["name"]}
    if isinstance(fn.get("description"), str):
        decl["description"] = fn["description"]
    if fn.get("parameters") is not None:
        decl["parametersJsonSchema"] = fn["parameters"]
    return decl


def convert_tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    declarations = [_declaration(t, f"tools[{i}]") for i, t in enumerate(body.get("tools") or [])]
    declarations += [_declaration(f, f"functions[{i}]", legacy=True) for i, f in enumerate(body.get("functions") or [])]
    return [{"functionDeclarations": declarations}] if declarations else []


def convert_tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        mode = {"none": "NONE", "auto": "AUTO", "required": "ANY"}.get(choice)
        if mode is None:
            raise ConversionError(f"Unknown tool_choice {choice!r}.", param="tool_choice")
        return {"functionCallingConfig": {"mode": mode}}
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        if choice.get("type") == "function" and isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [fn["name"]]}}
        allowed = choice.get("allowed_tools")
        if choice.get("type") == "allowed_tools" and isinstance(allowed, Mapping):
            names = [_declaration(t, "tool_choice.allowed_tools")["name"] for t in allowed.get("tools") or []]
            mode = "ANY" if allowed.get("mode") == "required" else "AUTO"
            config: dict[str, Any] = {"mode": mode}
            if mode == "ANY":
                config["allowedFunctionNames"] = names
            return {"functionCallingConfig": config}
    raise ConversionError("Unsupported tool_choice.", param="tool_choice")


# --------------------------------------------------------------------------- generation config


def generation_config(body: Mapping[str, Any], google: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    simple = (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("top_k", "topK"),
        ("n", "candidateCount"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    )
    for openai_name, gemini_name in simple:
        if body.get(openai_name) is not None:
            config[gemini_name] = body[openai_name]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        config["maxOutputTokens"] = limit
    stop = body.get("stop")
    if stop is not None:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("logprobs"):
        config["responseLogprobs"] = True
        if body.get("top_logprobs") is not None:
            config["logprobs"] = body["top_logprobs"]
    config.update(_response_format(body.get("response_format")))
    thinking = _thinking(body, google)
    if thinking is not None:
        config["thinkingConfig"] = thinking
    return config


def _response_format(fmt: Any) -> dict[str, Any]:
    if not isinstance(fmt, Mapping) or fmt.get("type") in (None, "text"):
        return {}
    if fmt.get("type") == "json_object":
        return {"responseMimeType": "application/json"}
    schema = fmt.get("json_schema")
    if fmt.get("type") == "json_schema" and isinstance(schema, Mapping):
        out: dict[str, Any] = {"responseMimeType": "application/json"}
        if schema.get("schema") is not None:
            out["responseJsonSchema"] = schema["schema"]
        return out
    raise ConversionError("Unsupported response_format.", param="response_format")


def _thinking(body: Mapping[str, Any], google: Mapping[str, Any]) -> dict[str, Any] | None:
    effort = body.get("reasoning_effort")
    raw = google.get("thinking_config")
    if effort is not None and raw is not None:
        raise ConversionError(
            "reasoning_effort and google.thinking_config cannot be combined.", param="reasoning_effort"
        )
    if isinstance(raw, Mapping):
        return {_THINKING_KEYS.get(str(k), str(k)): v for k, v in raw.items()}
    if effort is None:
        return None
    if effort not in _EFFORT_BUDGET:
        raise ConversionError(f"Unknown reasoning_effort {effort!r}.", param="reasoning_effort")
    model = body.get("model")
    if isinstance(model, str) and bare_model(model).startswith("gemini-3"):
        # Gemini 3 takes a level and cannot switch thinking off ("none" is the lowest level).
        return {"thinkingLevel": _EFFORT_LEVEL[effort]}
    return {"thinkingBudget": _EFFORT_BUDGET[effort]}
