"""The exception hierarchy: every error a user can cause says what is wrong and how to fix it.

Kept in one module so that the CLI can catch ``WeightCacheError`` once and turn it into a clean
message and a non-zero exit, while programming errors still surface as tracebacks.
"""


class WeightCacheError(Exception):
    """Base class for errors caused by input, configuration or environment, not by bugs."""


class CheckpointError(WeightCacheError):
    """The checkpoint directory is missing, incomplete, truncated or inconsistent."""


class UnsupportedArchitecture(WeightCacheError):
    """The checkpoint's architecture has no sharding table."""


class ShardingError(WeightCacheError):
    """The requested parallel layout does not divide the model evenly."""


class UnsupportedQuantization(WeightCacheError):
    """A quantization method outside the verified allowlist."""


class ProtocolError(WeightCacheError):
    """A peer broke the wire protocol (bad frame, bad message, wrong order, wrong version)."""


class CacheUnavailable(WeightCacheError):
    """No daemon answers for this cache and rank (no socket, refused, timed out)."""


class DaemonBusy(CacheUnavailable):
    """The daemon refused the connection: its slots, or the peer's process group's share, are taken."""


class FingerprintMismatch(WeightCacheError):
    """The daemon holds weights for something other than what the engine expects."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


class BindError(WeightCacheError):
    """The cached tensors do not fit the model: missing, extra, or wrong shape or dtype."""


class DaemonAlreadyRunning(WeightCacheError):
    """Another live daemon already serves this cache name and rank."""


class RankExited(WeightCacheError):
    """A rank under the launcher (``daemon --ranks``) exited; the launcher exits with its code and message."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
