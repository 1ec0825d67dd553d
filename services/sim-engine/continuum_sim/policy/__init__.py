"""Pure engine policy: the prefix-cache block pool, the scheduler and the timing model."""
