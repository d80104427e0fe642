"""What ``web_fetch`` shows of a page: its kind by content type, HTML as markdown, the result's bounds.

HTML is parsed with BeautifulSoup and turned into markdown with ``markdownify``:
scripts, styles and other markup no reader sees are left out, links and
images are made absolute against the page's final URL, and links that would
run code or inline megabytes (``javascript:``, ``data:``) are dropped. Text
and JSON are decoded by their charset and shown as they are. The result is
the page's header lines, then ``READ_MAX_BYTES`` of its text at a time, with
a note giving the ``offset`` to read on, as ``read`` pages through a file.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Literal

import httpx
from bs4 import BeautifulSoup
from markdownify import MarkdownConverter

from durable_agent.core.tool_args import READ_MAX_BYTES

PageKind = Literal["html", "text"]

# Markup whose text is no part of what a reader sees (``head``: its title is shown on its own).
_HIDDEN = ["script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "embed", "head"]
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# Besides ``text/*``, ``*+json`` and ``*+xml``: the types that are text to read.
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-ndjson",
    }
)
# Links a page's markdown should not carry: code to run, or megabytes of an inline image.
_UNSHOWN_LINK = re.compile(r"\s*(?:javascript|data|vbscript):", re.IGNORECASE)


@dataclass(frozen=True)
class Page:
    """A fetched response: where it came from, its status and type, and the body read."""

    first_url: str
    url: str
    status: int
    reason: str
    content_type: str
    kind: PageKind
    body: bytes
    charset: str | None
    cut: bool  # the body went on past ``max_bytes``


def media_type(content_type: str) -> str:
    """``text/html`` of ``text/html; charset=utf-8``, lower case."""
    return content_type.partition(";")[0].strip().lower()


def page_kind(media: str) -> PageKind | None:
    """How a body of media type ``media`` is shown: as HTML, as text, or not at all (None)."""
    if media in _HTML_TYPES:
        return "html"
    if media.startswith("text/") or media in _TEXT_TYPES or media.endswith(("+json", "+xml")):
        return "text"
    return None


def sniffed_kind(body: bytes) -> PageKind | None:
    """The kind of a body that came without a content type: text when it looks like text."""
    if b"\0" in body[:1024]:
        return None
    return "html" if body.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")) else "text"


def decode(body: bytes, charset: str | None) -> str:
    """``body`` as text, by ``charset`` (UTF-8 when none or unknown), bad bytes replaced."""
    try:
        codec = codecs.lookup(charset).name if charset else "utf-8"
    except LookupError:
        codec = "utf-8"
    return body.decode(codec, errors="replace")


def page_text(page: Page) -> tuple[str, str]:
    """The page's title (HTML only, else empty) and its text: HTML as markdown, else decoded."""
    if page.kind == "text":
        return "", decode(page.body, page.charset)
    # bs4 finds the encoding: the header's, else the page's <meta charset>, else a guess
    soup = BeautifulSoup(page.body, "html.parser", from_encoding=page.charset)
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup.find_all(_HIDDEN):
        tag.decompose()
    base = httpx.URL(page.url)
    for name, attribute in (("a", "href"), ("img", "src")):
        for tag in soup.find_all(name):
            value = tag.get(attribute)
            if not isinstance(value, str) or value.startswith("#"):
                continue
            try:
                if _UNSHOWN_LINK.match(value) is None:
                    tag[attribute] = str(base.join(value))
                    continue
            except httpx.InvalidURL:
                pass
            if name == "img":
                tag.decompose()
            else:
                del tag[attribute]
    markdown = MarkdownConverter(heading_style="ATX", bullets="-").convert_soup(soup)
    markdown = re.sub(r"[ \t]+\n", "\n", markdown)
    return title, re.sub(r"\n{3,}", "\n\n", markdown).strip()


def shown(page: Page, title: str, text: str, offset: int, max_bytes: int) -> str:
    """The result: the page's header lines, then its text from ``offset``, ``READ_MAX_BYTES`` at most.

    Args:
        page: the page fetched.
        title: its title, if it has one.
        text: its text (``page_text``).
        offset: the first character of ``text`` to show.
        max_bytes: the body's bound, named when the body was cut.

    Returns:
        The text the model reads.
    """
    lines = [f"URL: {page.url}"]
    if page.url != page.first_url:
        lines.append(f"Redirected from: {page.first_url}")
    lines += [f"Status: {page.status} {page.reason}".rstrip(), f"Content-Type: {page.content_type}"]
    if title:
        lines.append(f"Title: {title}")
    notes: list[str] = []
    if page.cut:
        notes.append(
            f"[the page is longer than {max_bytes} bytes: only its first {max_bytes} bytes were read]"
        )
    if offset > 0 and offset >= len(text):
        notes.append(f"[offset {offset} is past the end: the page's text has {len(text)} characters]")
        return "\n".join([*lines, "", *notes])
    part = cut_text(text[offset:], READ_MAX_BYTES)
    end = offset + len(part)
    if end < len(text):
        notes.append(
            f"[cut: characters {offset} to {end} of {len(text)} shown; call web_fetch with "
            f"offset={end} to read on]"
        )
    elif offset:
        notes.append(f"[characters {offset} to {end} of {len(text)} shown]")
    body = [part] if part else ["(no text)"]
    return "\n".join([*lines, "", *body, *(["", *notes] if notes else [])])


def cut_text(text: str, limit: int) -> str:
    """``text``'s start within ``limit`` UTF-8 bytes, ended at a line break where one is near."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    part = data[:limit].decode("utf-8", errors="ignore")
    newline = part.rfind("\n")
    return part[: newline + 1] if newline >= len(part) // 2 else part
