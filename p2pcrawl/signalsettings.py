"""The site-signal settings (docs/signals.md): a part of :mod:`p2pcrawl.settings`.

They are ``CrawlSettings.signals``, flags and TOML keys like every other setting, written
with the same :func:`p2pcrawl.fields.option`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from p2pcrawl.fields import option, validate

__all__ = ["Requisites", "SignalSettings"]

Requisites = Literal["any", "scope", "off"]

_GROUP = "site signals (docs/signals.md)"
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class SignalSettings:
    """What sites say about themselves (sitemaps, robots meta tags and headers, link
    relations) and what a page needs to render (its requisites)."""

    sitemaps: bool = option(
        True,
        "do not read sitemaps (robots.txt Sitemap: lines, else /sitemap.xml)",
        flag="--no-sitemaps",
        group=_GROUP,
    )
    max_sitemap_urls: int = option(
        100_000,
        "URLs taken from one host's sitemaps",
        min=0,
        max=10**9,
        metavar="N",
        group=_GROUP,
    )
    max_sitemap_files: int = option(
        200, "sitemap files read per host", min=1, max=10**5, flag=False
    )
    sitemap_index_depth: int = option(2, "nested sitemap indexes", min=0, max=5, flag=False)
    robots_meta: bool = option(
        True,
        "follow the links of pages whose robots meta tag or X-Robots-Tag says nofollow or "
        "none (for archivists who must)",
        flag="--ignore-robots-meta",
        group=_GROUP,
    )
    obey_noarchive: bool = option(
        False, "archive only the headers of a response marked noarchive", group=_GROUP
    )
    follow_rel_nofollow: bool = option(
        True,
        "do not follow links marked rel=nofollow, ugc or sponsored",
        flag="--drop-rel-nofollow",
        group=_GROUP,
    )
    requisites: Requisites = option(
        "any",
        "fetch page requisites (images, stylesheets, scripts, fonts, media) from any host, "
        "from hosts in scope, or not at all",
        choices=("any", "scope", "off"),
        group=_GROUP,
    )
    max_requisites_per_page: int = option(
        200,
        "requisites taken per page or stylesheet",
        min=0,
        max=100_000,
        flag="--max-requisites",
        metavar="N",
        group=_GROUP,
    )
    max_requisite_bytes: int = option(
        10 * MIB,
        "truncate a requisite past this",
        min=1,
        max=1 << 30,
        flag="--max-requisite-body",
        metavar="BYTES",
        default_text="10 MiB",
        size=True,
        group=_GROUP,
    )

    def __post_init__(self) -> None:
        validate(self)
