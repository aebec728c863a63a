"""The one exception type front ends turn into a clean one-line error."""


class SpeclocalError(Exception):
    """A user-facing failure: the message is shown as is, without a traceback."""
