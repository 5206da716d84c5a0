"""Errors a person acts on; each message names what to change."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing or invalid; the message says which variable to change."""
