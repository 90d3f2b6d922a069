"""The library's errors. Everything streamlearn raises on purpose derives from
:class:`StreamlearnError`, so callers can catch one type; third-party errors are
wrapped at the boundary (``raise ... from exc``) with a message that says what to change.
"""


class StreamlearnError(Exception):
    """Root of every error streamlearn raises on purpose."""


class ConfigError(StreamlearnError, ValueError):
    """A configuration value or override is unknown or invalid. ``key``: the dotted key
    whose value was refused, when the error is about one key's value."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class RecordError(StreamlearnError, ValueError):
    """A stream record cannot be decoded or fails validation (it goes to the DLQ)."""


class LabelCapacityError(RecordError):
    """A new label arrived with the label table full (``model.max_labels`` labels).

    The record is rejected (dead-lettered with reason ``label-capacity``); labels seen
    before keep training. Raise ``model.max_labels`` and retrain from scratch to admit
    more: the head's size is fixed when the model is built.
    """


class CheckpointError(StreamlearnError):
    """A learner checkpoint cannot be written or read (:mod:`streamlearn.checkpoint`)."""


class NoCheckpointError(CheckpointError):
    """The store holds no learner checkpoint yet: train into it first."""


class CheckpointMismatchError(CheckpointError):
    """The stored model does not fit the config it is read with: row tables of another
    shape, dense weights of other names or shapes, another row-optimizer rule, counts of
    an older format. ``misfits``: one phrase per difference; ``config_diff``: the config
    keys that differ from the stored config (``"model.layers 0 -> 1, ..."``, empty when
    the configs agree or the stored one is not compared)."""

    def __init__(self, message: str, misfits: tuple[str, ...] = (), config_diff: str = ""):
        super().__init__(message)
        self.misfits = tuple(misfits)
        self.config_diff = config_diff


class CorruptStateError(CheckpointError):
    """A checkpoint's stored bytes are missing or unreadable (a blob absent or not
    decodable, a namespace that does not match the counters): the state directory was
    damaged or altered; restore it from a good copy or train into a new one."""
