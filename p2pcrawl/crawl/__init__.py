"""The crawler of one peer: fetch, parse, canonicalise, robots.txt, politeness, scheduling.

It knows nothing of the network. What it was given to crawl sits in its :class:`Ledger`
(the task store and the done record); every link it discovers leaves through a
:class:`Router`, which on a lone peer is its own ledger and on a networked peer is the
URL's owner. docs/architecture.md follows one URL through these modules.
"""

from __future__ import annotations

from p2pcrawl.crawl import hops, urls
from p2pcrawl.crawl.domains import DomainTable, decode_rules, encode_rules, parse_domain_tables
from p2pcrawl.crawl.engine import TAILS_PER_FETCH, Engine
from p2pcrawl.crawl.fetcher import Fetcher, FetchResult, ForbiddenAddress, page_digest
from p2pcrawl.crawl.frontier import Frontier, HostQueue, Task
from p2pcrawl.crawl.hostslot import HostSlot
from p2pcrawl.crawl.ledger import Ledger, from_stored, to_stored
from p2pcrawl.crawl.links import LinkFilter, make_task, repeats_a_segment, strip_session_ids
from p2pcrawl.crawl.parse import ParsedPage, extract_links
from p2pcrawl.crawl.parsebound import Flattened, flatten_deep_nesting
from p2pcrawl.crawl.parseproc import BoundedParse, ParseWorkers, needs_worker, parse_bounded
from p2pcrawl.crawl.patterns import UrlPatterns
from p2pcrawl.crawl.pipeline import PIPELINE_PAGES, Pipeline
from p2pcrawl.crawl.ports import NO_LOANS, FinishedHook, LoanPort, LocalRouter, Router
from p2pcrawl.crawl.revisit import Revisits
from p2pcrawl.crawl.robots import RobotsCache, RobotsPolicy, policy_from_lent, policy_from_response
from p2pcrawl.crawl.runner import CrawlSummary, crawl
from p2pcrawl.crawl.scope import Scope, is_forbidden_address, normalise_domain
from p2pcrawl.crawl.seeds import SeedVerdict, check_seed, scheme_hint
from p2pcrawl.crawl.seen import SeenCache
from p2pcrawl.crawl.signals import CANONICAL_FIELD, ROBOTS_FIELD
from p2pcrawl.crawl.stats import CrawlStats, EventLog, Histogram

__all__ = [
    "CANONICAL_FIELD",
    "NO_LOANS",
    "PIPELINE_PAGES",
    "ROBOTS_FIELD",
    "TAILS_PER_FETCH",
    "BoundedParse",
    "CrawlStats",
    "CrawlSummary",
    "DomainTable",
    "Engine",
    "EventLog",
    "FetchResult",
    "Fetcher",
    "FinishedHook",
    "Flattened",
    "ForbiddenAddress",
    "Frontier",
    "Histogram",
    "HostQueue",
    "HostSlot",
    "Ledger",
    "LinkFilter",
    "LoanPort",
    "LocalRouter",
    "ParseWorkers",
    "ParsedPage",
    "Pipeline",
    "Revisits",
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
    "decode_rules",
    "encode_rules",
    "extract_links",
    "flatten_deep_nesting",
    "from_stored",
    "hops",
    "is_forbidden_address",
    "make_task",
    "needs_worker",
    "normalise_domain",
    "page_digest",
    "parse_bounded",
    "parse_domain_tables",
    "policy_from_lent",
    "policy_from_response",
    "repeats_a_segment",
    "scheme_hint",
    "strip_session_ids",
    "to_stored",
    "urls",
]
