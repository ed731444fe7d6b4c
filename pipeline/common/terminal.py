"""Text for a terminal: the one escaping function every value from a log goes through before it
is printed (``sql``'s tables, ``ingest``'s file names, every warning and error line of the CLI,
``nightly``'s summary). Only the standard library: the CLI imports it before any stage."""

from __future__ import annotations

import re

#: Characters a terminal acts on rather than shows: C0 and C1 controls (ESC starts colour,
#: title-setting and clipboard sequences) and the bidirectional overrides that reorder text.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as an escape ('\\x1b', '\\n', '\\u202e')."""

    def one(m: re.Match[str]) -> str:
        c = m.group(0)
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
            f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
        )

    return _CONTROL_RE.sub(one, text)


def escape_lines(text: str) -> str:
    """``text`` escaped line by line: the line breaks a message of several lines is written with
    stay, every other control character is shown as an escape."""
    return "\n".join(escape_controls(line) for line in text.split("\n"))
