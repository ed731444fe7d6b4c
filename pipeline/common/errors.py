"""Errors the CLI turns into one-line messages (exit code 1: the user must act)."""

from __future__ import annotations


class RooftraceError(Exception):
    """A problem the user must fix; the message is one line and names the file/field at fault."""


class SchemaError(RooftraceError):
    """A table does not match its declared schema."""


class ConfigError(RooftraceError):
    """A TOML config or catalog entry is invalid (unknown, missing or mistyped key)."""
