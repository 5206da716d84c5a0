"""The bases of the errors a person acts on; each message names what to change.

One rule for the error classes themselves: each is defined in the module that
raises it, on one of these bases, so that callers (the CLI) can tell an expected
operational failure, whose message already says the safe action, from a bug, which
deserves its traceback. An error that several steps raise lives with the model it
reports on, which they all import (`slices.DataLossError`).
`tests/unit/test_error_homes.py` holds the tree to this rule.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing or invalid; the message says which variable to change."""


class OperationalError(RuntimeError):
    """An expected failure of a run (data loss, a held LSO past its age, a failed gate, an
    interval not closed yet): the message says what happened and the safe action."""
