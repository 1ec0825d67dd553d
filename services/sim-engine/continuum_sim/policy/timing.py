"""How long a simulated scheduler step takes, in simulated seconds.

One forward pass costs a fixed part (reading the weights), a part per decoding sequence, a part
per context token the decoders attend to (reading their KV), and a part per prefilled prompt
token. A step that stands for `k` decode iterations pays the decode part `k` times and the
prefill part once. Defaults are loosely calibrated to an 8B model (Llama-3.1-8B class, bf16) on
one H100 80GB; docs/sim-engine.md shows the arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingConfig:
    time_scale: float = 1.0  # real seconds per simulated second (0.01 = 100x faster)
    request_overhead_s: float = 0.010  # API server, tokenization, detokenization
    # How long `/tokenize` takes to answer (a busy API server); 0 answers at once.
    tokenize_s: float = 0.0
    prefill_s_per_token: float = 4.0e-5  # ~25k prompt tokens/s
    decode_base_s: float = 0.006  # 16 GB of weights at ~3 TB/s per forward pass
    decode_s_per_seq: float = 2.5e-5  # per decoding sequence per iteration
    decode_s_per_context_token: float = 4.0e-8  # 128 KiB of KV per token read per iteration
    min_step_real_s: float = 0.002  # below this, one step covers several decode iterations
    max_decode_tokens_per_step: int = 64

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError("time_scale must be > 0")
        for name in ("request_overhead_s", "tokenize_s", "prefill_s_per_token", "decode_base_s", "decode_s_per_seq"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def decode_iteration_s(self, num_decode_seqs: int, context_tokens: int) -> float:
        return (
            self.decode_base_s
            + self.decode_s_per_seq * num_decode_seqs
            + self.decode_s_per_context_token * context_tokens
        )

    def step_s(self, num_prefill_tokens: int, num_decode_seqs: int, context_tokens: int, decode_tokens: int) -> float:
        """Simulated duration of one step."""
        prefill = self.prefill_s_per_token * num_prefill_tokens
        if num_decode_seqs == 0:
            return self.decode_base_s + prefill
        return prefill + decode_tokens * self.decode_iteration_s(num_decode_seqs, context_tokens)

    def decode_tokens_per_step(self, num_decode_seqs: int, context_tokens: int) -> int:
        """How many decode iterations one step should cover so it lasts >= min_step_real_s."""
        real = self.decode_iteration_s(num_decode_seqs, context_tokens) * self.time_scale
        if real <= 0:
            return self.max_decode_tokens_per_step
        wanted = math.ceil(self.min_step_real_s / real)
        return max(1, min(wanted, self.max_decode_tokens_per_step))
