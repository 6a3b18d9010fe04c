"""Rules for one site: a domain's own delay, concurrency, page budget, patterns and User-Agent.

The crawl's settings are the same for every host; a ``[domains."example.org"]`` table of
the TOML config overrides some of them for that domain and its subdomains (a subdomain
with a table of its own takes its own, whole: tables are not merged). The peer that owns a
host applies its rules, so every peer must know them: rules configured on one peer are
published in the DHT with the network's scope and adopted by the others for the domains
they have no table of their own for (``p2pcrawl.network.scopesync``).

* ``delay``: the least gap between two requests to one host of the domain (replaces
  ``--delay``; robots.txt's Crawl-delay and the politeness factor still apply on top).
* ``concurrency``: requests in flight to the domain's hosts together (each host has at most
  one at a time anyway); so ``concurrency = 1`` fetches one page of the site at a time even
  when it has many host names.
* ``max-pages``: pages fetched from the domain's hosts, per peer (like ``--max-pages``, each
  peer counts its own; with the default host partition one domain's hosts may be on several
  peers).
* ``include`` / ``exclude``: regular expressions, as ``--include`` / ``--exclude``, for the
  domain's URLs only; the global ones apply too. Like those, they are applied where links
  are found and seeds checked; the peer that fetches a URL checks them again (a link found
  by a peer that had not yet read the network's rules) and drops a refused URL without
  recording it done, so widening the rules later crawls it.
* ``user-agent``: the User-Agent sent to the domain's hosts, and the one its robots.txt rules
  are matched against.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from p2pcrawl.crawl import urls
from p2pcrawl.crawl.patterns import UrlPatterns
from p2pcrawl.crawl.scope import normalise_domain
from p2pcrawl.settings import DomainRules, PolitenessSettings


class Parkable(Protocol):
    """What the gate needs of a frontier host (``p2pcrawl.crawl.frontier.HostQueue``),
    named here so that the frontier's module and this one do not import each other."""

    host: str
    queued: bool

    @property
    def startable(self) -> bool: ...


H = TypeVar("H", bound=Parkable)

__all__ = [
    "MAX_DOMAIN_RULES",
    "DomainGate",
    "DomainRules",
    "DomainTable",
    "decode_rules",
    "encode_rules",
    "parse_domain_tables",
    "politeness_for",
]

MAX_DOMAIN_RULES = 10_000  # tables in one config, and rules taken from the network
MAX_PATTERNS = 100
MAX_USER_AGENT = 256
_KEYS = ("delay", "concurrency", "max-pages", "include", "exclude", "user-agent")
_MEMO = 65_536  # hosts whose rules are remembered


def _rules(domain: str, table: Mapping[str, Any]) -> DomainRules:
    """One ``[domains."…"]`` table, checked (a config file's, or one from the network)."""
    where = f"domains.{domain!r}"
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    delay = table.get("delay")
    if delay is not None and (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or not 0 <= delay <= 86_400
    ):
        raise ValueError(f"{where}: delay must be a number of seconds from 0 to 86400")
    ints: dict[str, int | None] = {}
    for key, lo, hi in (("concurrency", 1, 4096), ("max-pages", 0, 10**15)):
        v = table.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
            raise ValueError(f"{where}: {key} must be a whole number from {lo} to {hi}")
        ints[key] = v
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("include", "exclude"):
        v = table.get(key, [])
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
            raise ValueError(f"{where}: {key} must be a list of regular expressions")
        if len(v) > MAX_PATTERNS:
            raise ValueError(f"{where}: {key} has more than {MAX_PATTERNS} patterns")
        lists[key] = tuple(v)
    ua = table.get("user-agent")
    if ua is not None and (
        not isinstance(ua, str)
        or not 0 < len(ua) <= MAX_USER_AGENT
        or not ua.isprintable()
        or not ua.isascii()
    ):
        raise ValueError(f"{where}: user-agent must be printable ASCII, 1 to 256 characters")
    UrlPatterns(lists["include"], lists["exclude"], _where(domain))
    return DomainRules(
        delay=None if delay is None else float(delay),
        concurrency=ints["concurrency"],
        max_pages=ints["max-pages"],
        include=lists["include"],
        exclude=lists["exclude"],
        user_agent=ua,
    )


def _where(domain: str) -> str:
    """How messages name a table's patterns: as the config file spells the table."""
    return f'[domains."{domain}"] '


def parse_domain_tables(doc: object) -> tuple[tuple[str, DomainRules], ...]:
    """The ``domains`` table of a config file: ``{domain: {key: value}}``; ValueError says
    what is wrong, in the file's own words."""
    if not isinstance(doc, Mapping):
        raise ValueError('domains must be tables: [domains."example.org"]')
    if len(doc) > MAX_DOMAIN_RULES:
        raise ValueError(f"domains: at most {MAX_DOMAIN_RULES} tables")
    out: dict[str, DomainRules] = {}
    for raw, table in doc.items():
        domain = normalise_domain(str(raw))
        if not domain or not isinstance(table, Mapping):
            raise ValueError(f'domains.{raw!r} must be a table: [domains."example.org"]')
        out[domain] = _rules(domain, table)
    return tuple(out.items())


def _as_doc(r: DomainRules) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "delay": r.delay,
        "concurrency": r.concurrency,
        "max-pages": r.max_pages,
        "include": list(r.include),
        "exclude": list(r.exclude),
        "user-agent": r.user_agent,
    }
    return {k: v for k, v in doc.items() if v not in (None, [])}


def encode_rules(rules: Iterable[tuple[str, DomainRules]]) -> str:
    return json.dumps({d: _as_doc(r) for d, r in rules}, separators=(",", ":"), sort_keys=True)


def decode_rules(raw: object) -> dict[str, DomainRules]:
    """Rules published by another peer, checked like a config file's; {} if not rules."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str) or len(raw) > 1 << 20:
        return {}
    try:
        return dict(parse_domain_tables(json.loads(raw)))
    except (ValueError, RecursionError):
        return {}


class DomainTable:
    """The rules that apply to a host: its own domain's, or its nearest parent's."""

    def __init__(self, own: Iterable[tuple[str, DomainRules]] = ()) -> None:
        self.own = dict(own)
        self._adopted: dict[str, DomainRules] = {}
        self._memo: dict[str, tuple[str, DomainRules] | None] = {}
        self._patterns: dict[tuple[str, DomainRules], UrlPatterns] = {}
        # Host key ("host[:port]") -> its table's include/exclude, or None: asked for every
        # link found, so one lookup per link.
        self._by_host_key: dict[str, UrlPatterns | None] = {}
        self._limits: dict[str, tuple[str, int] | None] = {}  # host key -> its concurrency
        self.pages: Counter[str] = Counter()  # pages fetched per domain with max-pages

    def patterns(self, domain: str, rules: DomainRules) -> UrlPatterns:
        """The domain's include/exclude patterns, compiled once."""
        compiled = self._patterns.get((domain, rules))
        if compiled is None:
            if len(self._patterns) >= MAX_DOMAIN_RULES * 2:
                self._patterns = {}
            compiled = UrlPatterns(rules.include, rules.exclude, _where(domain))
            self._patterns[(domain, rules)] = compiled
        return compiled

    def patterns_at(self, host: str, url: str) -> UrlPatterns | None:
        """The include/exclude of the table covering ``url`` (whose host key is ``host``),
        or None when no table with patterns covers it."""
        try:
            return self._by_host_key[host]
        except KeyError:
            pass
        ruled = self.for_host(urls.hostname_of(url))
        found = None
        if ruled is not None and (ruled[1].include or ruled[1].exclude):
            found = self.patterns(*ruled)
        if len(self._by_host_key) >= _MEMO:
            self._by_host_key = {}
        self._by_host_key[host] = found
        return found

    def limit_at(self, host: str) -> tuple[str, int] | None:
        """(domain, its concurrency) for a frontier host key, or None for no such limit."""
        if not self:
            return None
        try:
            return self._limits[host]
        except KeyError:
            pass
        name = host[1 : host.find("]")] if host.startswith("[") else host.partition(":")[0]
        ruled = self.for_host(name)
        found = None
        if ruled is not None and ruled[1].concurrency is not None:
            found = (ruled[0], ruled[1].concurrency)
        if len(self._limits) >= _MEMO:
            self._limits = {}
        self._limits[host] = found
        return found

    def refusal(self, url: str) -> str | None:
        """Why the include/exclude of the URL's domain table leave it out, or None."""
        found = self.patterns_at(urls.host_of(url), url) if self else None
        return found.refusal(url) if found is not None else None

    def __bool__(self) -> bool:
        return bool(self.own or self._adopted)

    def adopt(self, rules: Mapping[str, DomainRules]) -> bool:
        """Take the network's rules for the domains this peer has none of its own for."""
        taken = {d: r for d, r in rules.items() if d not in self.own}
        taken = dict(list(taken.items())[:MAX_DOMAIN_RULES])
        if taken == self._adopted:
            return False
        self._adopted = taken
        self._memo = {}
        self._by_host_key = {}
        self._limits = {}
        return True

    def for_host(self, host: str) -> tuple[str, DomainRules] | None:
        """(domain, rules) for a bare host name, or None when no table covers it."""
        if not self:
            return None
        if host in self._memo:
            return self._memo[host]
        found: tuple[str, DomainRules] | None = None
        name = host[:-1] if host.endswith(".") else host
        while name:
            rules = self.own.get(name) or self._adopted.get(name)
            if rules is not None:
                found = (name, rules)
                break
            _, dot, name = name.partition(".")
            if not dot:
                break
        if len(self._memo) >= _MEMO:
            self._memo = {}
        self._memo[host] = found
        return found


def politeness_for(base: PolitenessSettings, rules: DomainRules | None) -> PolitenessSettings:
    """The politeness settings for a host under ``rules``: its domain's delay, if it has one."""
    if rules is None or rules.delay is None or rules.delay == base.delay:
        return base
    return _with_delay(base, rules.delay)


@functools.lru_cache(maxsize=1024)
def _with_delay(base: PolitenessSettings, delay: float) -> PolitenessSettings:
    return dataclasses.replace(base, delay=delay)


class DomainGate(Generic[H]):
    """A domain's ``concurrency``, kept by the frontier: a ready host whose domain has all
    its requests under way is parked, out of the frontier's heaps, until one of them ends;
    then the first parked host that can start goes back. No host waits on a timer for a
    turn, and a host of another domain is never held up."""

    def __init__(self, limit_at: Callable[[str], tuple[str, int] | None]) -> None:
        self.limit_at = limit_at  # DomainTable.limit_at
        self._busy: Counter[str] = Counter()  # requests under way per domain
        self._counted: dict[H, str] = {}  # host under way -> the domain it counts in
        # Per domain, its parked hosts in the order they came (a dict as an ordered set:
        # a host re-ranked while parked is not parked twice).
        self._parked: dict[str, dict[H, None]] = {}

    def enter(self, hq: H) -> bool:
        """Whether a request to ``hq`` may start now (counted if so); parked if not."""
        limit = self.limit_at(hq.host)
        if limit is None:
            return True
        domain, most = limit
        if self._busy[domain] >= most:
            hq.queued = True  # kept off the heaps by the frontier while parked
            self._parked.setdefault(domain, {})[hq] = None
            return False
        self._busy[domain] += 1
        self._counted[hq] = domain
        return True

    def leave(self, hq: H) -> H | None:
        """``hq``'s request ended: the parked host of its domain to schedule now, if any."""
        domain = self._counted.pop(hq, None)
        if domain is None:
            return None
        self._busy[domain] -= 1
        if self._busy[domain] <= 0:
            del self._busy[domain]
        parked = self._parked.get(domain)
        while parked:
            nxt = next(iter(parked))
            del parked[nxt]
            nxt.queued = False
            # One that was handed away, emptied or taken meanwhile is passed over, or the
            # rest would wait for a request that never comes.
            if nxt.startable:
                return nxt
        self._parked.pop(domain, None)
        return None
