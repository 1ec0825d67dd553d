"""Where the workers of one `serve` meet: the supervisor's private directory and its sockets.

`serve` with `server.workers: N` (N > 1) runs a supervisor (supervisor.py) that creates a private
directory (mode 0700) and starts N copies of `serve` with the hidden options `--worker-dir DIR
--worker-index I --worker-count N`. Each worker binds the same host:port with SO_REUSEPORT and
meets its siblings through sockets in that directory:

    load-<i>.sock              worker i's load reports in (Unix datagram; adapters/load_local.py)
    metrics-<i>.sock           worker i's own metrics out (Unix stream; adapters/worker_metrics.py)
    handoff-<i>.sock           connection counts and handed-over connections in (Unix datagram;
                               adapters/handoff.py, continuum_ingress.rebalancer)
    metrics-supervisor.sock    the supervisor's metrics (worker restarts)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SUPERVISOR = "supervisor"


@dataclass(frozen=True, slots=True)
class WorkerSeat:
    """One worker's place: the shared directory, its index and how many workers there are."""

    directory: Path
    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"worker index {self.index} is not in 0..{self.count - 1}")

    def load_socket(self, index: int) -> Path:
        return self.directory / f"load-{index}.sock"

    def handoff_socket(self, index: int) -> Path:
        return self.directory / f"handoff-{index}.sock"

    def metrics_socket(self, index: int | str) -> Path:
        return self.directory / f"metrics-{index}.sock"

    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]

    def argv(self) -> list[str]:
        """The hidden `serve` options that make a process this worker."""
        return [
            "--worker-dir", str(self.directory),
            "--worker-index", str(self.index),
            "--worker-count", str(self.count),
        ]  # fmt: skip
