"""Cost-model variants of `continuum-kv-precise`, for tuning runs of `bench compare`
(`--plugin continuum_bench.fleet.cost_variants`). Each name spells its overrides of
`kv_cache_index.scoring.cost`: `pen<miss_penalty>`, `eps<load_factor_epsilon>`; `nostarts`
turns off the placement of conversation starts, `noload` the shared load view between replicas,
`slack<n>` sets `load_bound_slack`, `req<n>` `placement_request_tokens`, `nomemory` turns off
the remembered tokenizations (`tokenize_memory_blocks: 0`), `known<n>` sets the smallest
remembered part used (`tokenize_memory_min_tokens`), `tol<δ>` `placement_tolerance`, `hashnew` turns off
`place_new_prefixes` (the strategy places prompts nobody holds), `offpath` sets
`tokenize_new_prompts: off_path` (the default now; the name stays for the runs recorded before),
`onpath` sets `on_path`, `wait<ms>` `on_path` with `tokenize_wait_ms`, `tokenize` turns off
`token_ids_from_answers` (an off-path /tokenize per request: the default now; the name stays for
the runs recorded before), `ids` turns it on, `unheldon` / `unheldoff` set `tokenize_unheld_text`
(with `--tokenizer hf`), `req<n>-tt<k>k` sets `placement_request_tokens`
and `placement_tolerance_tokens` (k thousand). `pen<n>` sets only
`miss_penalty`; placement keeps its own `placement_miss_penalty` (runs recorded before the two
were separate charged placement `pen<n>` too).

    continuum-router bench compare --plugin continuum_bench.fleet.cost_variants --workloads trace \\
        --routers continuum-kv-precise-pen1-eps0.25,continuum-kv-precise-pen3-eps1 ...
"""

from __future__ import annotations

from continuum_bench.fleet.continuum import KvStack, register_stack

PENALTIES = (0.0, 1.0, 3.0, 6.0)
EPSILONS = (0.25, 1.0, 2.0, 4.0)

for _pen in PENALTIES:
    for _eps in EPSILONS:
        _name = f"continuum-kv-precise-pen{_pen:g}-eps{_eps:g}"
        _cost = (("miss_penalty", _pen), ("load_factor_epsilon", _eps))
        register_stack(_name, KvStack(_name, "memory", "precise", "blocks", cost=_cost))

_NO_STARTS = (("place_conversation_starts", False),)
register_stack(
    "continuum-kv-precise-nostarts",
    KvStack("continuum-kv-precise-nostarts", "memory", "precise", "blocks", cost=_NO_STARTS),
)
register_stack(
    "continuum-kv-precise-x3-nostarts",
    KvStack("continuum-kv-precise-x3-nostarts", "memory", "precise", "blocks", replicas=3, cost=_NO_STARTS),
)
register_stack(
    "continuum-kv-precise-x3-noload",
    KvStack("continuum-kv-precise-x3-noload", "memory", "precise", "blocks", replicas=3, load_sharing=False),
)

for _slack in (0, 1, 2):
    register_stack(
        f"continuum-kv-precise-slack{_slack}",
        KvStack(
            f"continuum-kv-precise-slack{_slack}", "memory", "precise", "blocks", cost=(("load_bound_slack", _slack),)
        ),
    )

for _req in (0, 256, 1024):
    register_stack(
        f"continuum-kv-precise-req{_req}",
        KvStack(
            f"continuum-kv-precise-req{_req}", "memory", "precise", "blocks", cost=(("placement_request_tokens", _req),)
        ),
    )

# Conversation starts placed or not, with neither the bound's slack nor the per-request demand.
for _starts in (True, False):
    _name = "continuum-kv-precise-slack0-req0" if _starts else "continuum-kv-precise-nostarts-slack0-req0"
    _overrides: tuple[tuple[str, float | bool], ...] = (
        ("load_bound_slack", 0),
        ("placement_request_tokens", 0),
        ("place_conversation_starts", _starts),
    )
    register_stack(_name, KvStack(_name, "memory", "precise", "blocks", cost=_overrides))

# A larger miss penalty alone (placement unchanged).
for _pen in (6.0, 10.0, 20.0, 30.0):
    _name = f"continuum-kv-precise-pen{_pen:g}"
    register_stack(_name, KvStack(_name, "memory", "precise", "blocks", cost=(("miss_penalty", _pen),)))

# A larger miss penalty with two requests of slack.
for _pen in (6.0, 10.0):
    _name = f"continuum-kv-precise-pen{_pen:g}-slack2"
    register_stack(
        _name,
        KvStack(_name, "memory", "precise", "blocks", cost=(("miss_penalty", _pen), ("load_bound_slack", 2))),
    )

# Every precise request asks /tokenize on its path (no remembered tokenizations).
register_stack(
    "continuum-kv-precise-nomemory",
    KvStack("continuum-kv-precise-nomemory", "memory", "precise", "blocks", group=(("tokenize_memory_blocks", 0),)),
)


def _group_variant(tail: str, group: tuple[tuple[str, int | str], ...]) -> None:
    """`continuum-kv-precise-<tail>` and its three-replica form `continuum-kv-precise-x3-<tail>`,
    with these overrides of the match group."""
    for replicas, suffix in ((1, ""), (3, "-x3")):
        name = f"continuum-kv-precise{suffix}-{tail}"
        register_stack(name, KvStack(name, "memory", "precise", "blocks", replicas=replicas, group=group))


# The smallest remembered part a request is matched with (else it is a new prompt).
for _min in (0, 128, 256, 512):
    _group_variant(f"known{_min}", (("tokenize_memory_min_tokens", _min),))

# How far a conversation start's holder may be busier than the mean before its prefix is
# copied elsewhere (placement_tolerance), with one or two requests of slack.
for _tol in (0.0, 0.15, 0.25, 0.5):
    for _slack in (1, 2):
        _name = f"continuum-kv-precise-tol{_tol:g}" + ("-slack2" if _slack == 2 else "")
        _tolerance: tuple[tuple[str, float | bool], ...] = (("placement_tolerance", _tol), ("load_bound_slack", _slack))
        register_stack(_name, KvStack(_name, "memory", "precise", "blocks", cost=_tolerance))

# Prompts nobody holds go to the configured strategy (PrefixAwareHash) instead of the least busy.
register_stack(
    "continuum-kv-precise-hashnew",
    KvStack("continuum-kv-precise-hashnew", "memory", "precise", "blocks", cost=(("place_new_prefixes", False),)),
)

# Requests too little of which is remembered: `offpath` go at once with approximate keys and are
# tokenized afterwards (the default); `onpath` ask /tokenize on their path first.
for _setting in ("off_path", "on_path"):
    _group_variant(_setting.replace("_", ""), (("tokenize_new_prompts", _setting),))

# Requests that ask /tokenize on their path wait at most this long for it (tokenize_wait_ms).
for _wait in (0, 5, 10, 20, 50):
    _group_variant(f"wait{_wait}", (("tokenize_new_prompts", "on_path"), ("tokenize_wait_ms", _wait)))

# With a local tokenizer (`--tokenizer hf`): prompts encoded only as far as some engine holds
# them before routing, the rest after the forward (`unheldoff`, the default), or whole first.
_group_variant("unheldoff", (("tokenize_unheld_text", "off_path"),))
_group_variant("unheldon", (("tokenize_unheld_text", "on_path"),))

# Learn from an off-path /tokenize per request (the default), or from the ids the engine returns
# with its answers (token_ids_from_answers).
_group_variant("tokenize", (("token_ids_from_answers", False),))
_group_variant("ids", (("token_ids_from_answers", True),))

# Placement demand: each routed request as `req<n>` new tokens, with the tolerance floor
# `tt<k>` thousand tokens (placement_tolerance_tokens): the defaults now, a lower floor, and the
# setting before.
for _req, _floor in ((3000, 80), (3000, 40), (256, 4)):
    _name = f"continuum-kv-precise-req{_req}-tt{_floor}k"
    _by_requests: tuple[tuple[str, float | bool], ...] = (
        ("placement_request_tokens", _req),
        ("placement_tolerance_tokens", _floor * 1000.0),
    )
    register_stack(_name, KvStack(_name, "memory", "precise", "blocks", cost=_by_requests))
