"""The site-signal settings (docs/signals.md): a part of :mod:`p2pcrawl.settings`.

They are ``CrawlSettings.signals``, flags and TOML keys like every other setting; their fields
carry the same metadata :func:`p2pcrawl.settings.option` writes, spelt out, because that
module imports this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Requisites", "SignalSettings"]

Requisites = Literal["any", "scope", "off"]

_GROUP = "site signals (docs/signals.md)"
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class SignalSettings:
    """What sites say about themselves (sitemaps, robots meta tags and headers, link
    relations) and what a page needs to render (its requisites)."""

    sitemaps: bool = field(
        default=True,
        metadata={
            "help": "do not read sitemaps (robots.txt Sitemap: lines, else /sitemap.xml)",
            "flag": "--no-sitemaps",
            "group": _GROUP,
        },
    )
    max_sitemap_urls: int = field(
        default=100_000,
        metadata={
            "help": "URLs taken from one host's sitemaps",
            "min": 0,
            "max": 10**9,
            "metavar": "N",
            "group": _GROUP,
        },
    )
    max_sitemap_files: int = field(
        default=200,
        metadata={"help": "sitemap files read per host", "min": 1, "max": 10**5, "flag": False},
    )
    sitemap_index_depth: int = field(
        default=2,
        metadata={"help": "nested sitemap indexes", "min": 0, "max": 5, "flag": False},
    )
    robots_meta: bool = field(
        default=True,
        metadata={
            "help": "follow the links of pages whose robots meta tag or X-Robots-Tag says "
            "nofollow or none (for archivists who must)",
            "flag": "--ignore-robots-meta",
            "group": _GROUP,
        },
    )
    obey_noarchive: bool = field(
        default=False,
        metadata={
            "help": "archive only the headers of a response marked noarchive",
            "group": _GROUP,
        },
    )
    follow_rel_nofollow: bool = field(
        default=True,
        metadata={
            "help": "do not follow links marked rel=nofollow, ugc or sponsored",
            "flag": "--drop-rel-nofollow",
            "group": _GROUP,
        },
    )
    requisites: Requisites = field(
        default="any",
        metadata={
            "help": "fetch page requisites (images, stylesheets, scripts, fonts, media) from "
            "any host, from hosts in scope, or not at all",
            "choices": ("any", "scope", "off"),
            "group": _GROUP,
        },
    )
    max_requisites_per_page: int = field(
        default=200,
        metadata={
            "help": "requisites taken per page or stylesheet",
            "min": 0,
            "max": 100_000,
            "flag": "--max-requisites",
            "metavar": "N",
            "group": _GROUP,
        },
    )
    max_requisite_bytes: int = field(
        default=10 * MIB,
        metadata={
            "help": "truncate a requisite past this",
            "min": 1,
            "max": 1 << 30,
            "flag": "--max-requisite-body",
            "metavar": "BYTES",
            "default_text": "10 MiB",
            "size": True,
            "group": _GROUP,
        },
    )

    def __post_init__(self) -> None:
        from p2pcrawl.settings import validate  # that module imports this one

        validate(self)
