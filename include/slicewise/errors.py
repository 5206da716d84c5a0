"""The bases of the errors a person acts on; each message names what to change.

An error is defined in the module that raises it, on one of these bases, so that
callers (the CLI) can tell an expected operational failure, whose message already
says the safe action, from a bug, which deserves its traceback."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing or invalid; the message says which variable to change."""


class OperationalError(RuntimeError):
    """An expected failure of a run (data loss, a held LSO past its age, a failed gate, an
    interval not closed yet): the message says what happened and the safe action."""
