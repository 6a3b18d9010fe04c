"""``--include`` and ``--exclude``: regular expressions over canonical URLs.

As in Scrapy's LinkExtractor ``allow``/``deny`` and Heritrix's decide rules: a URL must match
one ``--include`` pattern when any is given, and must match no ``--exclude`` pattern;
exclusion wins. Patterns are searched anywhere in the canonical URL (``re.search``), so
``/blog/`` matches every URL with that path segment and ``^https://a\\.org/`` anchors.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["UrlPatterns", "compile_patterns"]

MAX_PATTERN_LENGTH = 1000


def compile_patterns(patterns: Sequence[str], flag: str) -> list[re.Pattern[str]]:
    """Compiled ``patterns``, or ValueError naming the flag and the pattern at fault."""
    out = []
    for p in patterns:
        if len(p) > MAX_PATTERN_LENGTH:
            raise ValueError(f"{flag} pattern longer than {MAX_PATTERN_LENGTH} characters")
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise ValueError(f"{flag} {p!r} is not a regular expression: {exc}") from None
    return out


class UrlPatterns:
    def __init__(
        self, include: Sequence[str] = (), exclude: Sequence[str] = (), where: str = "--"
    ) -> None:
        # ``where`` names the patterns' origin in messages: "--" for the flags, or a
        # config table ('[domains."example.org"] ').
        self.where = where
        self.include = compile_patterns(include, f"{where}include")
        self.exclude = compile_patterns(exclude, f"{where}exclude")

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    def refusal(self, url: str) -> str | None:
        """Why ``url`` is left out, or None when the patterns let it through."""
        for p in self.exclude:
            if p.search(url):
                return f"matches {self.where}exclude {p.pattern!r}"
        if self.include and not any(p.search(url) for p in self.include):
            return f"matches no {self.where}include pattern"
        return None

    def allows(self, url: str) -> bool:
        return self.refusal(url) is None
