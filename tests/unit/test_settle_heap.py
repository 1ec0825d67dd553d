"""`serve` settles its heap once started: what start-up allocated leaves the cyclic collector's
view (full collections stay short) and young collections run less often."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc
from continuum_common.runner import GC_YOUNG_THRESHOLD, settle_heap
before = gc.get_freeze_count()
young, middle, old = gc.get_threshold()
settle_heap()
assert before == 0, before
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, middle, old), gc.get_threshold()
print("ok")
"""


def test_settle_heap_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    # In a child process: freezing and thresholds are process-wide.
    out = subprocess.run([sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


FROZEN_IMPORTS = """
import gc
from continuum_common.runner import frozen_imports
with frozen_imports():
    assert not gc.isenabled()
    import json.decoder, email.parser  # noqa: F401
assert gc.isenabled()
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
gc.disable()
with frozen_imports():
    pass
assert not gc.isenabled()  # a collector that was off stays off
print("ok")
"""


def test_frozen_imports_pause_the_collector_and_freeze_what_they_loaded() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FROZEN_IMPORTS], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
