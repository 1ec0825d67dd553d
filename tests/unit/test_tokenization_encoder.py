"""PromptEncoder: piece-by-piece tokenizing and incremental hashing equal whole-text tokenizing
plus a full rehash, for every supported tokenizer family, on random texts and random multi-turn
conversations; the caches are really used; unsupported tokenizers fall back to whole texts."""

from __future__ import annotations

import gc
import itertools
import logging
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from continuum_common.hashing.blocks import BlockHasher, make_block_hasher
from continuum_common.tokenization import LocalTokenizer, PromptEncoder, TokenizationError
from continuum_common.tokenization.cache import ByteLRU, TwoGenerationCache
from continuum_common.tokenization.chunks import ChunkTokenizer, PieceMismatch
from continuum_common.tokenization.pieces import CUT, SPECIAL, START, TextSplitter
from continuum_sim.hf_tokenizer import corpus, train_tokenizer

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<unk>"]
EXTRA_TEXT = [
    "Ünïcödé wörds: café naïve façade; Ελληνικά; русский текст; 中文字符 和 日本語 テキスト; 한국어",
    "def f(x):\n    return x + 1  # comment\n\n\tif x == 0: pass\r\n",
    "Numbers 0 7 42 123 4567 89012; v1.2.3; 0xdeadBEEF; 2024-01-31T12:00Z; 3.14159",
] * 20
FRAGMENTS = [
    " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "\u00a0", ".", ",", "!", "?", ":", ";", "'s", "'", "-", "_",
    "(", ")", '"', "0", "12", "345", "6789", "é", "e\u0301", "ß", "中文", "русский", "😀", "ﬁ", "Ⅻ", "¨", "½",
    "the", "The", "cache", "token", "x", "A", "I", "don't", "<|im_start|>", "<|im_end|>", "<s>", "</s>",
    " the", " cache", " Über", " 東京", " a", ". The", "? Yes", ": x",
]  # fmt: skip


def _train(
    model: str,
    pre: Any,
    *,
    normalizer: Any = None,
    post: Any = None,
    decoder: Any = None,
    byte_alphabet: bool = False,
) -> Tokenizer:
    if model == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>" if not byte_alphabet else None))
        alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_alphabet else []
        trainer: Any = trainers.BpeTrainer(vocab_size=1500, special_tokens=SPECIALS, initial_alphabet=alphabet,
                                           show_progress=False)  # fmt: skip
    elif model == "unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=800, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False
        )
    else:
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        trainer = trainers.WordPieceTrainer(vocab_size=1500, special_tokens=SPECIALS, show_progress=False)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    if post is not None:
        tok.post_processor = post
    if decoder is not None:
        tok.decoder = decoder
    tok.train_from_iterator(itertools.chain(corpus(0, paragraphs=300), EXTRA_TEXT), trainer=trainer)
    return tok


def _bos(tok: Tokenizer, template: str = "<s> $A") -> processors.TemplateProcessing:
    pairs = [(s, tok.token_to_id(s)) for s in ("<s>", "</s>")]
    return processors.TemplateProcessing(single=template, special_tokens=pairs)


def build_families(tmp: Path) -> dict[str, Path]:
    """tokenizer.json files: the supported families, and two the encoder must refuse."""
    out: dict[str, Path] = {"qwen2-trained": train_tokenizer(tmp / "qwen2").tokenizer}

    def save(name: str, tok: Tokenizer) -> None:
        out[name] = tmp / f"{name}.json"
        tok.save(str(out[name]))

    save("gpt2", _train("bpe", pre_tokenizers.ByteLevel(add_prefix_space=False), byte_alphabet=True,
                        decoder=decoders.ByteLevel()))  # fmt: skip
    save("gpt2-prefix-space", _train("bpe", pre_tokenizers.ByteLevel(add_prefix_space=True), byte_alphabet=True))
    llama3 = _train(
        "bpe",
        pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"), pre_tokenizers.ByteLevel(use_regex=False)]
        ),
        byte_alphabet=True,
    )
    llama3.post_processor = _bos(llama3)
    save("llama3-bos", llama3)
    meta = _train("bpe", pre_tokenizers.Metaspace(prepend_scheme="first"), normalizer=normalizers.NFKC())
    meta.post_processor = _bos(meta, "<s> $A </s>")
    save("metaspace-first-bos-eos", meta)
    save("unigram-metaspace-always", _train("unigram", pre_tokenizers.Metaspace(prepend_scheme="always")))
    save(
        "wordpiece-bert",
        _train("wordpiece", pre_tokenizers.BertPreTokenizer(),
               normalizer=normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()])),
    )  # fmt: skip
    # Refused: Llama-2's legacy layout (the model sees whole texts) and an added token with rstrip.
    legacy = _train(
        "bpe", None, normalizer=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    )
    save("legacy-prepend", legacy)
    rstrip = _train("bpe", pre_tokenizers.ByteLevel(), byte_alphabet=True)
    rstrip.add_special_tokens([AddedToken("<tool>", rstrip=True, lstrip=False, special=True, normalized=False)])
    save("rstrip-special", rstrip)
    return out


SUPPORTED = [
    "qwen2-trained", "gpt2", "gpt2-prefix-space", "llama3-bos", "metaspace-first-bos-eos",
    "unigram-metaspace-always", "wordpiece-bert",
]  # fmt: skip
REFUSED = {"legacy-prepend": "normalizer 'Prepend'", "rstrip-special": "lstrip/rstrip"}


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LocalTokenizer]:
    return {name: LocalTokenizer(path) for name, path in build_families(tmp_path_factory.mktemp("fam")).items()}


def reference(tok: LocalTokenizer, hasher: BlockHasher, text: str, add: bool, **keys: Any) -> tuple[int, list[int]]:
    ids = tok.encode(text, add_special_tokens=add)
    return len(ids), [hasher.wire(d) for d in hasher.chain(ids, **keys)]


def encoded(encoder: PromptEncoder, text: str, add: bool, **keys: Any) -> tuple[int, list[int]]:
    out = encoder.encode(text, add_special_tokens=add, **keys)
    return out.token_count, out.block_hashes


texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=60).map("".join)


# -- the self-check ---------------------------------------------------------------------------------


def test_supported_families_pass_the_self_check(families: dict[str, LocalTokenizer]) -> None:
    hasher = make_block_hasher("vllm", 4, hash_seed="0")
    for name in SUPPORTED:
        encoder = PromptEncoder(families[name], hasher)
        assert encoder.piecewise, (name, encoder.support.reason)
    assert PromptEncoder(families["llama3-bos"], hasher).support.prefix_ids == (0,)
    both = PromptEncoder(families["metaspace-first-bos-eos"], hasher).support
    assert (both.prefix_ids, both.suffix_ids) == ((0,), (1,))


def test_unsupported_families_fall_back_to_whole_texts(
    families: dict[str, LocalTokenizer], caplog: pytest.LogCaptureFixture
) -> None:
    hasher = make_block_hasher("vllm", 4, hash_seed="0")
    caplog.set_level(logging.WARNING, logger="continuum.tokenization")  # whatever earlier tests set
    for name, reason in REFUSED.items():
        caplog.clear()
        encoder = PromptEncoder(families[name], hasher)
        assert "piece-by-piece encoding is off" in caplog.text and reason in caplog.text
        assert not encoder.piecewise and reason in encoder.support.reason, (name, encoder.support.reason)
        text = "Hello world, hello cache.<s> Again the same text"
        assert encoded(encoder, text, False) == reference(families[name], hasher, text, False)
        assert encoded(encoder, text, False) == reference(families[name], hasher, text, False)
        assert encoder.stats.whole_text == 2 and encoder.stats.whole_text_hits == 1
        partial = encoder.begin(text + " more", add_special_tokens=False)  # lazily: whole at once
        count, whole = reference(families[name], hasher, text + " more", False)
        assert partial.done and (partial.token_count, partial.block_hashes) == (count, whole)
        assert partial.finish().block_hashes == whole and encoder.stats.requests == 3


# -- equality with whole-text tokenization ------------------------------------------------------------


@pytest.mark.parametrize("name", SUPPORTED)
def test_random_texts_equal_whole_text(families: dict[str, LocalTokenizer], name: str) -> None:
    tok = families[name]
    hasher = make_block_hasher("vllm", 4, hash_seed="0")
    encoder = PromptEncoder(tok, hasher, piece_chars=16)  # tiny pieces: many cuts per text

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text=texts, add=st.booleans(), salt=st.sampled_from([None, "s1"]))
    def check(text: str, add: bool, salt: str | None) -> None:
        assert encoded(encoder, text, add, cache_salt=salt) == reference(tok, hasher, text, add, cache_salt=salt)

    check()
    assert encoder.stats.fallbacks == 0 and encoder.stats.whole_text == 0


def conversations(seed: int, turns: int) -> Iterator[list[dict[str, str]]]:
    """A random conversation, one message list per turn (each extends the previous)."""
    rng = random.Random(seed)

    def text(words: int) -> str:
        return "".join(rng.choice(FRAGMENTS) for _ in range(words))

    messages = [{"role": "system", "content": text(rng.randint(0, 200))}]
    for _ in range(turns):
        messages.append({"role": "user", "content": text(rng.randint(0, 60))})
        yield list(messages)
        messages.append({"role": "assistant", "content": text(rng.randint(0, 80))})


PLAIN_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"


@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_random_conversations_turn_by_turn(
    families: dict[str, LocalTokenizer], name: str, engine: str, tmp_path: Path
) -> None:
    """ChatML (added tokens between messages) for the trained tokenizer, a template without any
    added token for the others (the whole prompt is one span, cut only at safe cuts)."""
    if name == "qwen2-trained":
        tok = families[name]
        files = train_tokenizer(tmp_path / "t")
        tok = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    else:
        template = tmp_path / "plain.jinja"
        template.write_text(PLAIN_TEMPLATE)
        tok = LocalTokenizer(families[name].path, chat_template=template)
    hasher = make_block_hasher(engine, 3, hash_seed="0")  # type: ignore[arg-type]
    encoder = PromptEncoder(tok, hasher, piece_chars=32, max_cache_bytes=4 << 20)
    for seed in range(12):
        keys = {"cache_salt": "tenant" if seed % 3 == 1 else None, "lora_name": "lora-a" if seed % 4 == 2 else None}
        for messages in conversations(seed, turns=6):
            text = tok.render_chat(messages)
            assert encoded(encoder, text, False, **keys) == reference(tok, hasher, text, False, **keys)
    assert encoder.stats.node_hits > encoder.stats.node_misses  # later turns reuse earlier ones


# -- lazy encoding (begin / extend / finish) ------------------------------------------------------------


@pytest.mark.parametrize("name", SUPPORTED)
def test_a_lazily_encoded_prompt_is_a_prefix_as_it_goes_and_whole_when_finished(
    families: dict[str, LocalTokenizer], name: str
) -> None:
    tok = families[name]
    hasher = make_block_hasher("vllm", 4, hash_seed="0")
    encoder = PromptEncoder(tok, hasher, piece_chars=16)

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text=texts, add=st.booleans(), steps=st.lists(st.integers(0, 3), max_size=6), warm=st.booleans())
    def check(text: str, add: bool, steps: list[int], warm: bool) -> None:
        count, whole = reference(tok, hasher, text, add)
        if warm:
            encoder.encode(text[: len(text) // 2], add_special_tokens=add)
        partial = encoder.begin(text, add_special_tokens=add)
        for step in steps:
            # Every full block hashed so far is the whole prompt's block (its start is fixed).
            assert partial.block_hashes == whole[: len(partial.block_hashes)]
            assert partial.token_count <= count
            partial.extend(step)
        result = partial.finish()
        assert (result.token_count, result.block_hashes) == (count, whole)
        assert partial.done and partial.estimated_tokens == count
        assert encoded(encoder, text, add) == (count, whole)

    check()


def test_begin_takes_the_known_start_without_tokenizing_and_estimates_the_rest(tmp_path: Path) -> None:
    files = train_tokenizer(tmp_path)
    tok = CountingTokenizer(files.tokenizer, chat_template=files.chat_template)
    encoder = PromptEncoder(tok, make_block_hasher("vllm", 16, hash_seed="0"))
    rng = random.Random(7)
    words = [f"w{i}x" for i in range(400)]
    system = " ".join(rng.choice(words) for _ in range(3000)) + "."
    first = encoder.encode(system, add_special_tokens=False)
    longer = system + " " + " ".join(rng.choice(words) for _ in range(2000)) + "."
    tok.calls = 0
    partial = encoder.begin(longer, add_special_tokens=False)
    assert tok.calls == 0 and not partial.done, "the known start costs no tokenizer call"
    # Known: every piece of the shorter text but its last (cut only once text followed it).
    assert len(first.block_hashes) - 64 <= len(partial.block_hashes) <= len(first.block_hashes)
    assert partial.block_hashes == first.block_hashes[: len(partial.block_hashes)]
    whole = reference(tok, encoder.hasher, longer, False)[0]
    assert abs(partial.estimated_tokens - whole) < 0.1 * whole
    partial.extend(1)
    assert tok.calls > 0 and partial.chars_done < len(longer)
    assert partial.finish().token_count == whole


# -- the caches are used -------------------------------------------------------------------------------


class CountingTokenizer(LocalTokenizer):
    calls = 0
    chars = 0

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        self.calls += 1
        self.chars += len(text)
        return super().encode(text, add_special_tokens=add_special_tokens)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        self.calls += 1
        self.chars += len(text)
        return super().encode_with_offsets(text)


class NegativeIdsTokenizer(LocalTokenizer):
    """Ids no engine would send (negative) for every word, consistently, so the self-check
    still passes (added tokens keep theirs)."""

    def _odd(self, ids: list[int]) -> list[int]:
        added = set(self.added_tokens.values())
        return [i if i in added else -1 - i for i in ids]

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self._odd(super().encode(text, add_special_tokens=add_special_tokens))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids, offsets = super().encode_with_offsets(text)
        return self._odd(ids), offsets


def test_ids_that_cannot_be_packed_are_a_tokenization_error(tmp_path: Path) -> None:
    """SGLang's formula checks only the ids of full blocks; an unfinished block's ids are
    packed into the cached node, and one that does not fit is the error callers fall back on."""
    files = train_tokenizer(tmp_path)
    tok = NegativeIdsTokenizer(files.tokenizer, chat_template=files.chat_template)
    encoder = PromptEncoder(tok, make_block_hasher("sglang", 16))
    assert encoder.piecewise
    with pytest.raises(TokenizationError, match="token ids must be"):
        encoder.encode("hello there", add_special_tokens=False)  # fewer ids than one block


def test_next_turn_tokenizes_and_hashes_only_what_is_new(tmp_path: Path) -> None:
    files = train_tokenizer(tmp_path)
    tok = CountingTokenizer(files.tokenizer, chat_template=files.chat_template)
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    encoder = PromptEncoder(tok, hasher)
    rng = random.Random(5)
    words = [f"w{i}x" for i in range(400)]

    def prose(count: int) -> str:
        return " ".join(rng.choice(words) for _ in range(count)) + "."

    system = prose(3000)
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": prose(50)}]
    tok.calls = tok.chars = 0
    first = encoder.encode(tok.render_chat(turn1), add_special_tokens=False)
    assert tok.calls > 0 and first.token_count > 3000
    calls, blocks = tok.calls, encoder.stats.hashed_blocks

    # The same request again: nothing is tokenized or hashed.
    assert encoder.encode(tok.render_chat(turn1), add_special_tokens=False) == first
    assert tok.calls == calls and encoder.stats.hashed_blocks == blocks

    # The next turn: only its new text goes through the tokenizer (its words are all known, so
    # only the chunks whose ids depend on what precedes them), and only its blocks are hashed.
    turn2 = [*turn1, {"role": "assistant", "content": prose(40)}, {"role": "user", "content": prose(30)}]
    tok.chars = 0
    second = encoder.encode(tok.render_chat(turn2), add_special_tokens=False)
    assert second.block_hashes[: len(first.block_hashes) - 1] == first.block_hashes[:-1]
    assert 0 < tok.chars < 100  # a few span-first chunks ("assistant\nwNx"), not the 4k-token prompt
    new_blocks = encoder.stats.hashed_blocks - blocks
    assert new_blocks <= (second.token_count - first.token_count) // 16 + 3

    # Another conversation under the same system prompt reuses its chain nodes.
    hits = encoder.stats.node_hits
    other = [{"role": "system", "content": system}, {"role": "user", "content": prose(20)}]
    encoder.encode(tok.render_chat(other), add_special_tokens=False)
    assert encoder.stats.node_hits - hits >= len(system) // 2048


def test_memory_stays_within_the_budget_and_results_stay_right(tmp_path: Path) -> None:
    files = train_tokenizer(tmp_path)
    tok = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    budget = 256 << 10
    encoder = PromptEncoder(tok, hasher, max_cache_bytes=budget)
    for seed in range(40):
        for messages in conversations(seed, turns=3):
            text = tok.render_chat(messages) * 3
            assert encoded(encoder, text, False) == reference(tok, hasher, text, False)
            assert encoder.cache_bytes <= budget


def test_the_cache_costs_the_cyclic_collector_nothing(families: dict[str, LocalTokenizer], tmp_path: Path) -> None:
    """Cached chain nodes, their keys and whole-text results leave the collector's view at the
    first collection they survive, so a full cache does not lengthen the ingress's collection
    pauses."""
    files = train_tokenizer(tmp_path)
    tok = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    piecewise = PromptEncoder(tok, hasher, piece_chars=64)
    whole = PromptEncoder(families["legacy-prepend"], hasher)
    assert piecewise.piecewise and not whole.piecewise
    gc.collect()
    tracked = len(gc.get_objects())
    nodes = 0
    for seed in range(30):
        for messages in conversations(seed, turns=4):
            text = tok.render_chat(messages)
            nodes += len(piecewise.begin(text, add_special_tokens=False).finish().block_hashes)
            whole.encode(text, add_special_tokens=False)
    gc.collect()
    assert piecewise.stats.node_misses > 500 and whole.stats.whole_text > 100 and nodes > 500
    # What is left tracked is the few objects the encoding made outside the caches.
    assert len(gc.get_objects()) - tracked < 100


def test_a_tokenizer_surprise_falls_back_to_the_whole_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = train_tokenizer(tmp_path)
    tok = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    encoder = PromptEncoder(tok, hasher)

    def surprise(self: ChunkTokenizer, context: Any, text: str) -> list[int]:
        raise PieceMismatch("added token did not tokenize to its own id")

    monkeypatch.setattr(ChunkTokenizer, "_encode_in_context", surprise)
    text = tok.render_chat([{"role": "user", "content": "hello there"}])
    assert encoded(encoder, text, False) == reference(tok, hasher, text, False)
    assert encoder.stats.fallbacks == 1 and encoder.stats.whole_text == 1


# -- the splitter ------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(text=texts, more=texts, n=st.sampled_from([16, 24, 64]))
def test_pieces_cover_the_text_cut_safely_and_stay_put_when_text_is_appended(text: str, more: str, n: int) -> None:
    splitter = TextSplitter(SPECIALS, n)
    pieces = splitter.pieces(text)
    assert "".join(p for _, p in pieces) == text
    for (_context, piece), (next_context, _) in itertools.pairwise(pieces):
        if next_context == CUT:  # a cut inside a span: right before " " + letter, after a non-space
            assert not piece[-1].isspace()
    for context, piece in pieces:
        if context == CUT:
            assert piece[0] == " " and piece[1].isalpha()
        if context == SPECIAL:
            assert piece in SPECIALS
    assert all(p for _, p in pieces)
    # Appending never moves an earlier cut: all pieces but the last one stay.
    longer = splitter.pieces(text + more)
    assert longer[: max(len(pieces) - 1, 0)] == pieces[: max(len(pieces) - 1, 0)]
    if pieces:
        assert pieces[0][0] in (START, SPECIAL)


def test_pieces_prefer_sentence_ends_and_stay_near_the_target_size() -> None:
    sentence = "The cache keeps the blocks of every prompt it saw. "
    text = sentence * 200
    pieces = TextSplitter([], 256).pieces(text)
    assert all(128 <= len(p) <= 512 for _, p in pieces[:-1])
    assert all(p.endswith("saw.") for _, p in pieces[:-1])


# -- the caches ----------------------------------------------------------------------------------


def test_byte_lru_evicts_least_recently_used() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    for key in "abcd":
        lru.put(key, 1, 30)
    assert lru.get("a") is None and lru.bytes == 90 and lru.evictions == 1
    assert lru.get("b") == 1
    lru.put("e", 1, 30)  # evicts c (b was used)
    assert lru.get("c") is None and lru.get("b") == 1
    lru.put("big", 1, 101)  # larger than the budget: not kept, nothing evicted
    assert lru.get("big") is None and len(lru) == 3


def test_two_generation_cache_bounds_bytes_and_keeps_recent_hits() -> None:
    sizer: Callable[[str, int], int] = lambda key, value: 10  # noqa: E731
    cache: TwoGenerationCache[str, int] = TwoGenerationCache(100, sizer)
    for i in range(5):
        cache.put(f"k{i}", i)
    cache.put("k5", 5)  # young (half = 50 bytes) full: it becomes the old generation
    assert cache.get_many(["k0", "k5", "zz"]) == [0, 5, None]  # k0 promoted from the old one
    for i in range(6, 30):
        if cache.get(f"k{i}") is None:
            cache.put(f"k{i}", i)
        assert cache.bytes <= 100
    assert cache.get("k29") == 29 and cache.get("k1") is None
