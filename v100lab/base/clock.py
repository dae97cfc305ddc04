"""Times a stored measurement carries: UTC stamps written and read back, and their age in words."""

from __future__ import annotations

import datetime as _dt
import time


def utc_stamp() -> str:
    """Now, as the stamps measurements store: ``2026-12-04T21:10:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def parse_utc(text) -> _dt.datetime | None:
    """A stored stamp (ISO 8601, ``Z`` or an offset; one without a zone is taken as UTC), or None."""
    if not isinstance(text, str) or not text:
        return None
    for parse in (lambda t: _dt.datetime.fromisoformat(t.replace("Z", "+00:00")),
                  lambda t: _dt.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S%z")):
        try:
            d = parse(text)
        except ValueError:
            continue
        return d if d.tzinfo else d.replace(tzinfo=_dt.timezone.utc)
    return None


def age_text(seconds: float) -> str:
    """How old a measurement is, in words: "5 min old", "3 h old", "4 days old"."""
    if seconds < 0:
        return "in the future: clock changed?"
    if seconds < 3600:
        return f"{max(1, round(seconds / 60))} min old"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h old"
    return f"{seconds / 86400:.0f} days old"
