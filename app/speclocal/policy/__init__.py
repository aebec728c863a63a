"""Policy: the measured cost model of this machine and auto mode (speculate only where it pays)."""
