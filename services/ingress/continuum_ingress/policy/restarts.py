"""What the `serve` supervisor does when a worker exits, and how long it waits before starting
it again (pure; the supervisor is supervisor.py).

A worker that exits while the supervisor is stopping is done. One that exits before every
worker listened for the first time fails the whole `serve` (a bad secret, an unreadable
tokenizer: restarting would fail the same way, and the operator should see the error now). One
that dies later is restarted after a delay that doubles with each quick death (0.2 s, 0.4 s, ...
up to 30 s), so a crash loop does not spin the CPU; a worker that ran for 30 s before dying starts
the sequence again.
"""

from __future__ import annotations

from enum import Enum

from continuum_common.backoff import Backoff

INITIAL_DELAY_S = 0.2
MAX_DELAY_S = 30.0
STABLE_AFTER_S = 30.0


class ExitVerdict(Enum):
    DONE = "done"  # the supervisor is stopping
    FAIL = "fail"  # failed before the supervisor served: the whole serve fails
    RESTART = "restart"


def after_exit(*, stopping: bool, serving: bool) -> ExitVerdict:
    if stopping:
        return ExitVerdict.DONE
    if not serving:
        return ExitVerdict.FAIL
    return ExitVerdict.RESTART


class RestartBackoff:
    """One worker's restart delays: continuum_common.backoff, started again after a stable run."""

    def __init__(
        self, initial_s: float = INITIAL_DELAY_S, max_s: float = MAX_DELAY_S, stable_after_s: float = STABLE_AFTER_S
    ) -> None:
        self.stable_after_s = stable_after_s
        self._backoff = Backoff(initial_s, max_s)

    def next_delay(self, ran_for_s: float) -> float:
        """The wait before restarting a worker that ran for `ran_for_s` seconds."""
        if ran_for_s >= self.stable_after_s:
            self._backoff.reset()
        return self._backoff.next()
