"""The crawler of one peer: fetch, parse, canonicalise, robots.txt, politeness, scheduling.

It knows nothing of the network. What it was given to crawl sits in its :class:`Ledger`
(the task store and the done record); every link it discovers leaves through a
:class:`Router`, which on a lone peer is its own ledger and on a networked peer is the
URL's owner. docs/architecture.md follows one URL through these modules.
"""

from __future__ import annotations

from p2pcrawl.crawl import urls
from p2pcrawl.crawl.engine import Engine, LocalRouter, Router
from p2pcrawl.crawl.fetcher import Fetcher, FetchResult, ForbiddenAddress
from p2pcrawl.crawl.frontier import Frontier, HostQueue, HostSlot, Task
from p2pcrawl.crawl.ledger import Ledger, from_stored, to_stored
from p2pcrawl.crawl.links import LinkFilter, make_task
from p2pcrawl.crawl.parse import ParsedPage, extract_links
from p2pcrawl.crawl.patterns import UrlPatterns
from p2pcrawl.crawl.robots import RobotsCache, RobotsPolicy, policy_from_response
from p2pcrawl.crawl.runner import CrawlSummary, crawl
from p2pcrawl.crawl.scope import Scope, is_forbidden_address, normalise_domain
from p2pcrawl.crawl.seeds import SeedVerdict, check_seed, scheme_hint
from p2pcrawl.crawl.seen import SeenCache
from p2pcrawl.crawl.stats import CrawlStats, EventLog, Histogram

__all__ = [
    "CrawlStats",
    "CrawlSummary",
    "Engine",
    "EventLog",
    "FetchResult",
    "Fetcher",
    "ForbiddenAddress",
    "Frontier",
    "Histogram",
    "HostQueue",
    "HostSlot",
    "Ledger",
    "LinkFilter",
    "LocalRouter",
    "ParsedPage",
    "RobotsCache",
    "RobotsPolicy",
    "Router",
    "Scope",
    "SeedVerdict",
    "SeenCache",
    "Task",
    "UrlPatterns",
    "check_seed",
    "crawl",
    "extract_links",
    "from_stored",
    "is_forbidden_address",
    "make_task",
    "normalise_domain",
    "policy_from_response",
    "scheme_hint",
    "to_stored",
    "urls",
]
