"""speclocal: measure whether speculative decoding pays off on this machine, and use it where it does."""

__version__ = "0.1.0"
