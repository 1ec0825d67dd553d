"""`continuum-sim-engine`: run one or many simulated vLLM engines in this process.

Port layout for `--count N`: engine i serves HTTP on `--base-port + i`, publishes KV events on
`--zmq-base-port + 2i` and answers replay requests on `--zmq-base-port + 2i + 1`. Port 0 picks
free ports (see `--info-file` to learn them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from continuum_common.logs import setup_logging
from continuum_common.runner import run
from continuum_sim.app import serve_fleet
from continuum_sim.config import DEFAULT_MODEL, EngineConfig, KvEventsConfig, config_from_dict
from continuum_sim.errors import SimConfigError, SimError
from continuum_sim.policy.timing import TimingConfig
from continuum_sim.protocol.kv_wire import ERAS


def build_parser() -> argparse.ArgumentParser:
    d = EngineConfig()
    t = TimingConfig()
    p = argparse.ArgumentParser(
        prog="continuum-sim-engine", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    fleet = p.add_argument_group("fleet and ports")
    fleet.add_argument("--count", type=int, default=1, help="engines to run in this process (default 1)")
    fleet.add_argument("--name-prefix", default="sim", help="engine i is named PREFIX-i (default sim)")
    fleet.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    fleet.add_argument("--base-port", type=int, default=8000, help="HTTP port of engine 0 (0 = free ports)")
    fleet.add_argument("--info-file", help="write the engines' endpoints as JSON here once they are up")
    fleet.add_argument("--configs-json", help="a JSON list of full engine configs (overrides the other flags)")

    kv = p.add_argument_group("KV events (vLLM --kv-events-config)")
    kv.add_argument("--no-kv-events", action="store_true", help="do not publish KV events")
    kv.add_argument("--zmq-host", default="127.0.0.1", help="PUB bind address, or the host to connect to")
    kv.add_argument(
        "--zmq-base-port", type=int, default=5557, help="PUB port of engine 0; replay = +1 (0 = free ports)"
    )
    kv.add_argument("--zmq-mode", choices=("bind", "connect"), default="bind", help="PUB binds (default) or connects")
    kv.add_argument("--no-replay", action="store_true", help="no ROUTER replay socket")
    kv.add_argument("--topic", default="", help="frame 0 of every event message (vLLM default: empty)")
    kv.add_argument("--kv-events-era", choices=ERAS, default="map", help="wire layout (default map = current vLLM)")
    kv.add_argument("--hash-wire", choices=("int", "bytes"), default="int", help="u64 hashes (default) or raw digests")
    kv.add_argument("--buffer-steps", type=int, default=10_000, help="batches kept for replay")

    eng = p.add_argument_group("engine")
    eng.add_argument("--model", default=DEFAULT_MODEL)
    eng.add_argument("--block-size", type=int, default=d.block_size)
    eng.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks)
    eng.add_argument("--max-model-len", type=int, default=d.max_model_len)
    eng.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    eng.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    eng.add_argument("--max-waiting", type=int, default=d.max_waiting)
    eng.add_argument("--no-prefix-caching", action="store_true")
    eng.add_argument(
        "--responses-store",
        type=int,
        default=d.responses_store,
        metavar="N",
        help="keep up to N finished /v1/responses answers per engine (least recently used forgotten first) "
        "so a request can continue one with previous_response_id; an id not kept gets 404 "
        f"(default {d.responses_store}; 0 = store nothing)",
    )
    eng.add_argument(
        "--no-token-ids",
        action="store_true",
        help="ignore return_token_ids on chat and completion requests, as vLLM releases before 0.10.2 do "
        "(default: answer it with the prompt's and the output's token ids, as later ones do)",
    )
    eng.add_argument(
        "--tokenizer",
        metavar="TOKENIZER_JSON",
        help="tokenize with this Hugging Face tokenizer.json instead of the built-in tokenizer",
    )
    eng.add_argument(
        "--chat-template",
        metavar="FILE",
        help="its Jinja2 chat template (a template file or a tokenizer_config.json; "
        "default: tokenizer_config.json beside the tokenizer, else ChatML)",
    )
    eng.add_argument(
        "--python-hash-seed",
        default=os.environ.get("PYTHONHASHSEED", "0"),
        help="NONE_HASH seed (default $PYTHONHASHSEED or 0)",
    )

    tm = p.add_argument_group("timing (simulated seconds)")
    tm.add_argument("--time-scale", type=float, default=t.time_scale, help="real seconds per simulated second")
    tm.add_argument("--request-overhead-s", type=float, default=t.request_overhead_s)
    tm.add_argument("--tokenize-s", type=float, default=t.tokenize_s, help="time /tokenize takes to answer")
    tm.add_argument("--prefill-s-per-token", type=float, default=t.prefill_s_per_token)
    tm.add_argument("--decode-base-s", type=float, default=t.decode_base_s)
    tm.add_argument("--decode-s-per-seq", type=float, default=t.decode_s_per_seq)
    tm.add_argument("--decode-s-per-context-token", type=float, default=t.decode_s_per_context_token)
    p.add_argument("--log-level", default=None)
    return p


def _port(base: int, offset: int) -> int:
    return 0 if base == 0 else base + offset


def configs_from_args(args: argparse.Namespace) -> list[EngineConfig]:
    if args.configs_json:
        with open(args.configs_json) as fh:
            return [config_from_dict(item) for item in json.load(fh)]
    if args.count < 1:
        raise SimConfigError("--count must be >= 1")
    if args.zmq_mode == "connect" and args.zmq_base_port == 0 and not args.no_kv_events:
        raise SimConfigError("--zmq-mode connect needs a real --zmq-base-port (the listener's bound ports)")
    timing = TimingConfig(
        time_scale=args.time_scale,
        request_overhead_s=args.request_overhead_s,
        tokenize_s=args.tokenize_s,
        prefill_s_per_token=args.prefill_s_per_token,
        decode_base_s=args.decode_base_s,
        decode_s_per_seq=args.decode_s_per_seq,
        decode_s_per_context_token=args.decode_s_per_context_token,
    )
    base = EngineConfig(
        model=args.model,
        host=args.host,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_waiting=args.max_waiting,
        enable_prefix_caching=not args.no_prefix_caching,
        responses_store=args.responses_store,
        return_token_ids=not args.no_token_ids,
        python_hash_seed=args.python_hash_seed,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        timing=timing,
    )
    configs = []
    for i in range(args.count):
        zhost = args.zmq_host
        kv = KvEventsConfig(
            enabled=not args.no_kv_events,
            endpoint=f"tcp://{zhost}:{_port(args.zmq_base_port, 2 * i)}",
            zmq_mode=args.zmq_mode,
            replay_endpoint=None if args.no_replay else f"tcp://{zhost}:{_port(args.zmq_base_port, 2 * i + 1)}",
            topic=args.topic,
            era=args.kv_events_era,
            hash_wire=args.hash_wire,
            buffer_steps=args.buffer_steps,
        )
        configs.append(replace(base, name=f"{args.name_prefix}-{i}", port=_port(args.base_port, i), kv_events=kv))
    return configs


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging("continuum-sim-engine", args.log_level)
    try:
        configs = configs_from_args(args)
    except (SimConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run(serve_fleet(configs, args.info_file))
    except (OSError, SimError) as exc:  # e.g. a port already in use
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
