"""Remembered remote tokenizations: digests per message prefix, the store's reach and bounds."""

from __future__ import annotations

from array import array

from continuum_ingress.kv.known_prefixes import Known, KnownPrefixes, KnownTexts, conversation_digests

SYS = {"role": "system", "content": "You answer questions about the report."}
U1 = {"role": "user", "content": "What is on page one?"}
A1 = {"role": "assistant", "content": "A table."}
U2 = {"role": "user", "content": "And on page two?"}


def known(blocks: int, tokens: int = 0) -> Known:
    return Known(array("Q", range(1, blocks + 1)), tokens or blocks * 16, 100)


def test_every_prefix_has_the_digest_of_the_shorter_request() -> None:
    body = {"model": "m"}
    turn2, sizes = conversation_digests(body, "m", [SYS, U1, A1, U2])
    turn1, _ = conversation_digests(body, "m", [SYS, U1])
    assert turn2[:2] == turn1
    assert len(set(turn2)) == 4
    assert sizes[0] == len(b'{"content":"You answer questions about the report.","role":"system"}')


def test_what_changes_the_rendering_changes_every_digest() -> None:
    base, _ = conversation_digests({}, "m", [SYS, U1])
    for body, model in (
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "m"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "m"),
        ({"cache_salt": "tenant-a"}, "m"),
        ({}, "other-model"),
    ):
        other, _ = conversation_digests(body, model, [SYS, U1])
        assert not set(other) & set(base), (body, model)


def test_key_order_inside_a_message_does_not_matter() -> None:
    a, _ = conversation_digests({}, "m", [{"role": "user", "content": "hi"}])
    b, _ = conversation_digests({}, "m", [{"content": "hi", "role": "user"}])
    assert a == b


def test_fields_set_to_null_do_not_change_a_digest_but_other_values_do() -> None:
    plain, _ = conversation_digests({}, "m", [SYS, A1])
    sdk = {**A1, "refusal": None, "tool_calls": None, "audio": None}
    replayed, sizes = conversation_digests({}, "m", [SYS, sdk])
    assert replayed == plain
    assert sizes[1] == len(b'{"content":"A table.","role":"assistant"}')
    named, _ = conversation_digests({}, "m", [SYS, {**A1, "name": "bot"}])
    assert named[1] != plain[1]


def test_find_takes_the_longest_prefix_within_reach() -> None:
    store = KnownPrefixes(1000)
    digests, _ = conversation_digests({}, "m", [SYS, U1, A1, U2, A1, U2])
    store.put(digests[0], known(3))
    assert store.find(digests[:1]) == (1, known(3))  # the whole request
    assert store.find(digests[:3]) == (1, known(3))  # two messages past it
    assert store.find(digests[:4]) is None  # three: too far, ask on the path
    store.put(digests[3], known(5))
    assert store.find(digests) == (4, known(5))
    assert store.find(digests, reach=1) is None


def test_the_store_is_bounded_by_the_blocks_it_holds_least_recent_first() -> None:
    store = KnownPrefixes(10)
    digests, _ = conversation_digests({}, "m", [SYS, U1, A1, U2])
    store.put(digests[0], known(4))
    store.put(digests[1], known(4))
    assert store.find(digests[:1]) is not None  # digests[0] is now the most recent
    store.put(digests[2], known(4))  # 12 > 10: the least recent (digests[1]) goes
    assert digests[1] not in store and digests[0] in store and digests[2] in store
    assert store.blocks == 8
    store.put(digests[2], known(2))  # replacing an entry counts the difference
    assert store.blocks == 6
    store.put(digests[3], known(11))  # larger than the whole store: not kept
    assert digests[3] not in store and store.blocks == 6
    store.clear()
    assert len(store) == 0 and store.blocks == 0


def test_a_text_extending_a_known_one_finds_it_to_a_chunk() -> None:
    store = KnownTexts(1000, chunk_bytes=8)
    turn1 = b"0123456789abcdefXYZ"  # two full chunks and a tail
    store.put(turn1, known(3))
    assert store.find(turn1) == (known(3), len(turn1))  # an exact repeat: all of it
    turn2 = turn1[:-1] + b"-and-then-more"  # shares 18 bytes: two full chunks
    assert store.find(turn2) == (known(3), 16)
    assert store.find(b"0123456-different") is None  # diverges inside the first chunk
    assert store.find(b"01234567") == (known(3), 8)  # a prefix of it: the chunk it shares


def test_texts_are_bounded_and_a_dropped_entry_takes_only_its_own_chunks() -> None:
    store = KnownTexts(10, chunk_bytes=4)
    store.put(b"aaaabbbb", known(4))
    store.put(b"aaaabbbbcccc", known(4))  # shares the first two chunks
    store.put(b"zzzzyyyy", known(4))  # 12 > 10: the least recent ("aaaabbbb") goes
    assert len(store) == 2 and store.blocks == 8
    # its chunks now lead to the longer text, which still holds them
    assert store.find(b"aaaabbbbdddd") == (known(4), 8)
    store.put(b"q" * 400, known(11))  # larger than the whole store: not kept
    assert store.find(b"q" * 400) is None
    store.clear()
    assert len(store) == 0 and store.blocks == 0 and store.find(b"zzzzyyyy") is None
