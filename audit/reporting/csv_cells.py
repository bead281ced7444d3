"""CSV cells a spreadsheet will not run as formulas ("CSV injection", OWASP).

Collaborator and metric names come from plans, and reasons quote them: a cell such as `=HYPERLINK(...)` or
`@SUM(...)` would be evaluated when the CSV is opened in a spreadsheet. OWASP's advice: prefix a cell that
starts with = + - @, tab or carriage return with a single quote (the csv module already quotes the cell and
doubles embedded quotes). Only text is escaped: a number written as a number (-0.5) stays a number.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["FORMULA_STARTS", "spreadsheet_safe", "spreadsheet_safe_row"]

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """`value` with a leading single quote if it is text that a spreadsheet would read as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def spreadsheet_safe_row(values: Iterable[Any]) -> list:
    return [spreadsheet_safe(v) for v in values]
