"""Token ids returned with an answer (vLLM's `return_token_ids`), cut out of what the client
receives: members removed as bytes, streams split anywhere, unreadable values left alone."""

from __future__ import annotations

import orjson
import pytest

from continuum_ingress.kv.answer_ids import (
    MAX_LINE,
    OUTPUT_KEY,
    PROMPT_KEY,
    AnswerIds,
    key_at,
    parse_ids,
    read_member,
    remove_member,
)
from continuum_ingress.kv.tokenize import token_ids


def cut(data: bytes, key: bytes) -> tuple[bytes, bytes | None] | None:
    at = key_at(data, key)
    if at < 0:
        return None
    member = read_member(data, key, at)
    if member is None:
        return None
    end, value = member
    return remove_member(data, at, end)[0], value


@pytest.mark.parametrize(
    ("doc", "left"),
    [
        ({"a": 1, "token_ids": [1, 2], "b": 2}, {"a": 1, "b": 2}),
        ({"token_ids": [1, 2], "b": 2}, {"b": 2}),
        ({"a": 1, "token_ids": [1, 2]}, {"a": 1}),
        ({"token_ids": [7]}, {}),
        ({"a": {"token_ids": None}, "b": [1]}, {"a": {}, "b": [1]}),
    ],
)
def test_a_member_is_cut_with_one_comma_and_the_rest_stays_valid(
    doc: dict[str, object], left: dict[str, object]
) -> None:
    for option in (0, orjson.OPT_INDENT_2):
        data = orjson.dumps(doc, option=option)
        got = cut(data, OUTPUT_KEY)
        assert got is not None
        assert orjson.loads(got[0]) == left
        value = doc.get("token_ids")
        assert (None if got[1] is None else orjson.loads(got[1])) == value


def test_key_text_inside_strings_is_not_a_member() -> None:
    doc = {"content": "token_ids", "other": '"token_ids": [1]', "prompt_token_ids_x": 1}
    data = orjson.dumps(doc)
    assert cut(data, OUTPUT_KEY) is None
    assert cut(data, PROMPT_KEY) is None
    # the same text as a value, then the real key: the key is cut
    data = orjson.dumps({"content": "token_ids", "token_ids": [3]})
    got = cut(data, OUTPUT_KEY)
    assert got is not None and orjson.loads(got[0]) == {"content": "token_ids"} and got[1] == b"[3]"


def test_prompt_token_ids_is_not_taken_for_token_ids() -> None:
    data = orjson.dumps({"prompt_token_ids": [1], "x": 0})
    assert cut(data, OUTPUT_KEY) is None
    assert cut(data, PROMPT_KEY) == (b'{"x":0}', b"[1]")


def _chat_stream(prompt: list[int], outputs: list[list[int]]) -> bytes:
    role = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        "prompt_token_ids": prompt,
    }
    events = [role] + [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "token_ids": ids}]}
        for i, ids in enumerate(outputs)
    ]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _plain(stream: bytes) -> list[object]:
    out: list[object] = []
    for line in stream.split(b"\n"):
        if line.startswith(b"data: {"):
            out.append(orjson.loads(line[6:]))
    return out


def test_a_stream_split_anywhere_gives_the_client_the_same_answer_without_ids() -> None:
    prompt = list(range(100, 400))
    outputs = [[5], [6, 7], [8]]
    stream = _chat_stream(prompt, outputs)
    whole = AnswerIds(lambda _: True)
    whole.begin(strip=True)
    expected = whole.chunk(stream) + whole.end()
    assert b"token_ids" not in expected
    assert whole.prompt() == prompt and whole.answer() == [*prompt, 5, 6, 7, 8]
    events = _plain(expected)
    assert [e["choices"][0]["delta"] for e in events] == [  # type: ignore[index]
        {"role": "assistant", "content": ""},
        {"content": "w0 "},
        {"content": "w1 "},
        {"content": "w2 "},
    ]
    for size in (1, 2, 3, 7, 64, 1000):
        ids = AnswerIds(lambda _: True)
        ids.begin(strip=True)
        got = b"".join(ids.chunk(stream[i : i + size]) for i in range(0, len(stream), size)) + ids.end()
        assert got == expected, size
        assert ids.answer() == [*prompt, 5, 6, 7, 8]


def test_without_strip_the_client_gets_the_ids_and_they_are_read() -> None:
    stream = _chat_stream([1, 2, 3], [[4]])
    ids = AnswerIds(lambda _: True)
    ids.begin(strip=False)
    assert ids.chunk(stream) + ids.end() == stream
    assert ids.answer() == [1, 2, 3, 4]


def test_a_whole_completion_body_is_cut_and_read() -> None:
    body = orjson.dumps(
        {
            "id": "x",
            "choices": [{"index": 0, "text": "hi", "token_ids": [9, 8], "prompt_token_ids": [1, 2]}],
            "usage": {},
        }
    )
    ids = AnswerIds(lambda _: True)
    ids.begin(strip=True)
    out = orjson.loads(ids.body(body))
    assert out == {"id": "x", "choices": [{"index": 0, "text": "hi"}], "usage": {}}
    assert ids.prompt() == [1, 2] and ids.answer() == [1, 2, 9, 8] and not ids.missing()


def test_an_answer_without_ids_is_missing_and_one_with_two_prompts_is_not_learnt() -> None:
    ids = AnswerIds(lambda _: True)
    ids.begin(strip=True)
    body = b'{"choices":[{"index":0,"text":"hi"}]}'
    assert ids.body(body) == body
    assert ids.missing() and ids.prompt() is None
    two = AnswerIds(lambda _: True)
    two.begin(strip=True)
    two.body(b'{"choices":[{"prompt_token_ids":[1],"token_ids":[2]},{"prompt_token_ids":[1],"token_ids":[3]}]}')
    assert two.prompt() is None and two.answer() is None and not two.missing()


def test_an_unreadable_value_is_left_and_nothing_learnt() -> None:
    ids = AnswerIds(lambda _: True)
    ids.begin(strip=True)
    body = b'{"prompt_token_ids":"1,2","choices":[]}'
    assert ids.body(body) == body
    assert ids.broken and ids.prompt() is None and not ids.missing()
    bad = AnswerIds(lambda _: True)
    bad.begin(strip=True)
    bad.body(b'{"prompt_token_ids":[1,-2],"choices":[]}')
    assert bad.prompt() is None
    assert parse_ids(b"[1,2.5]") is None and parse_ids(b"[1,true]") is None and parse_ids(b"[4294967296]") is None
    assert parse_ids(b"[0,4294967295]") == [0, 4294967295]


def test_a_line_past_the_bound_is_passed_on_and_not_learnt() -> None:
    ids = AnswerIds(lambda _: True)
    ids.begin(strip=True)
    piece = b'data: {"prompt_token_ids":[' + b"1," * (MAX_LINE // 2)
    out = ids.chunk(piece)
    assert out == piece and ids.broken
    rest = b'1],"token_ids":[2]}\n\n'
    assert ids.chunk(rest) == rest, "the rest of the answer goes as it is"
    assert ids.prompt() is None


def test_a_retry_starts_over() -> None:
    ids = AnswerIds(lambda _: True)
    ids.begin(strip=True)
    ids.chunk(b'data: {"prompt_token_ids":[1,2')  # the first attempt broke mid-line
    ids.begin(strip=True)
    out = ids.chunk(_chat_stream([3], [[4]])) + ids.end()
    assert b"token_ids" not in out and ids.answer() == [3, 4]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ([0, 1, 2, 4294967295], True),
        ([], True),
        ([1, True], False),
        ([False], False),
        ([1.0], False),
        ([-1], False),
        ([4294967296], False),
        (["1"], False),
        ([None], False),
        ([[1]], False),
        ("1,2", False),
        ({"tokens": [1]}, False),
    ],
)
def test_token_id_lists_are_checked_exactly(value: object, ok: bool) -> None:
    assert token_ids(value) is ok
    assert (parse_ids(orjson.dumps(value)) is not None) is ok
