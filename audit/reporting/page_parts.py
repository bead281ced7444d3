"""What every report page shares: the page template (templates/page.html), escaping, relative links, the time."""

from __future__ import annotations

import datetime as _dt
import html
from typing import Any
from urllib.parse import quote

import jinja2
from markupsafe import Markup

__all__ = ["page", "escape", "href", "now"]

# One page style for every report page (the party's, the run index, the aggregator's): templates/page.html.
_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("audit.reporting", "templates"),
                                autoescape=jinja2.select_autoescape(["html"]), keep_trailing_newline=True)


def escape(text: Any) -> str:
    return html.escape(str(text), quote=True)


def href(*parts: str) -> str:
    return escape("/".join(quote(p) for p in parts))


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def page(title: str, body: list[str]) -> str:
    """A whole HTML page in the shared style; `body` is HTML already escaped by its builder."""
    return _TEMPLATES.get_template("page.html").render(title=title, body=Markup("\n".join(body)), updated=now())
