"""The package's exceptions: every one derives from SimhashDBError."""


class SimhashDBError(Exception):
    """Base class of every error simhashdb raises."""


class InvalidFingerprintError(SimhashDBError, ValueError, TypeError):
    """A fingerprint is not an integer in [0, 2**64)."""


class InvalidArgumentError(SimhashDBError, ValueError, TypeError):
    """An argument has the wrong type or an unsupported value."""
