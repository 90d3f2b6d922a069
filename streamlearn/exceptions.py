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
