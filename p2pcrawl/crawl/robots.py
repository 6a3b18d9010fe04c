"""robots.txt policies (RFC 9309), parsed by protego and cached per host.

We rely on protego rather than the stdlib's ``urllib.robotparser`` because protego implements
RFC 9309's longest-match rule (§2.2.2), the ``*`` and ``$`` wildcards, and tolerates the
misspellings found in real files; the stdlib parser applies the first matching rule instead.

This module never touches the network: the fetcher hands :func:`policy_from_response` the status
and body of ``/robots.txt`` and gets back a :class:`RobotsPolicy`, which :class:`RobotsCache`
keeps until it expires.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from protego import Protego

from p2pcrawl.settings import PolitenessSettings

__all__ = [
    "KEPT_ROBOTS_CHARS",
    "MAX_ROBOTS_BYTES",
    "RobotsCache",
    "RobotsPolicy",
    "policy_from_lent",
    "policy_from_response",
    "ua_token",
]

# RFC 9309 §2.5: crawlers SHOULD impose a parsing limit, and it MUST be at least 500 KiB.
MAX_ROBOTS_BYTES = 500 * 1024
# A robots.txt this short is kept beside its parsed rules, to be lent with its host; a few KiB
# a host at most, for the cache's 10,000 hosts.
KEPT_ROBOTS_CHARS = 2048

# RFC 9309 §2.2.1 allows only letters, "_" and "-" in a product token. We also accept digits:
# our own name, p2pcrawl, has one, as do real crawlers (360Spider), and site owners write
# such names in their User-agent lines all the same.
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")

PolicyKind = Literal["rules", "allow_all", "disallow_all"]


@lru_cache(maxsize=64)
def ua_token(user_agent: str) -> str:
    """The product token robots.txt groups are matched against (RFC 9309 §2.2.1).

    ``"p2pcrawl/0.1.0 (+http://x)"`` -> ``"p2pcrawl"``. The token is the leading run of
    letters, digits, ``_`` and ``-`` of the first word, lower-cased because matching is
    case-insensitive. An agent with no such token gets ``""``, which only the ``*`` group
    matches.
    """
    words = user_agent.split(maxsplit=1)
    if not words:
        return ""
    match = _TOKEN_RE.match(words[0])
    return match.group(0).lower() if match else ""


@dataclass(slots=True)
class RobotsPolicy:
    """What one origin's robots.txt lets us do, until ``expires_at`` (monotonic time).

    ``disallow_all`` only ever comes from an unreachable robots.txt (RFC 9309 §2.3.1.4), so it
    is temporary: callers should hold that host's URLs until the policy expires and robots.txt
    is fetched again, not drop them. A file that says ``Disallow: /`` is ``rules``.
    """

    kind: PolicyKind
    expires_at: float
    parser: Protego | None = field(default=None, repr=False, compare=False)
    # The file the parser read, kept when it is short enough to lend with a host
    # (``network.lender``): a borrower then need not fetch it again.
    body: bytes | None = field(default=None, repr=False, compare=False)

    def allowed(self, url: str, user_agent: str) -> bool:
        """Whether ``url`` may be fetched by ``user_agent`` (full UA string or its token)."""
        if self.kind == "allow_all":
            return True
        if self.kind == "disallow_all" or self.parser is None:
            return False
        return bool(self.parser.can_fetch(url, ua_token(user_agent)))

    def crawl_delay(self, user_agent: str) -> float | None:
        """Seconds to wait between requests, as the matching group asks, or None.

        Crawl-delay is not part of RFC 9309 (§2.2.4 lets parsers honour other records); we
        honour it, and the equally informal Request-rate, taking whichever asks for the longer
        gap.
        """
        if self.kind != "rules" or self.parser is None:
            return None
        token = ua_token(user_agent)
        delay = self.parser.crawl_delay(token)
        rate = self.parser.request_rate(token)
        if rate is not None and rate.requests > 0:
            rate_gap = rate.seconds / rate.requests
            delay = rate_gap if delay is None else max(delay, rate_gap)
        return None if delay is None else float(delay)

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def _decode(body: bytes) -> str:
    if len(body) > MAX_ROBOTS_BYTES:
        # Cut at the last complete line so a rule split by the limit is not read as a shorter,
        # and therefore broader, path.
        body = body[:MAX_ROBOTS_BYTES]
        newline = body.rfind(b"\n")
        if newline >= 0:
            body = body[: newline + 1]
    # RFC 9309 §2.3: the file is UTF-8. utf-8-sig also drops a leading BOM, which would
    # otherwise glue itself to the first directive and hide it.
    return body.decode("utf-8-sig", errors="replace")


def policy_from_response(
    status: int | None,
    body: bytes | None,
    now: float,
    settings: PolitenessSettings,
) -> RobotsPolicy:
    """Turn the outcome of fetching ``/robots.txt`` into a policy.

    ``status`` is the final HTTP status after redirects, or None when the file could not be
    reached at all (connection error, timeout, too many redirects). ``now`` is monotonic time.
    """
    if status is not None and 200 <= status < 300:
        # RFC 9309 §2.3.1.1: a successful response is parsed; §2.4: cache it (24 h by default).
        text = _decode(body or b"")
        kept = text.encode("utf-8") if len(text) <= KEPT_ROBOTS_CHARS else None
        return RobotsPolicy("rules", now + settings.robots_ttl, Protego.parse(text), kept)
    if status is not None and 400 <= status < 500 and status != 429:
        # RFC 9309 §2.3.1.3: "unavailable" (404, 403, 410, ...) means no rules apply.
        # 429 is excluded: a server asking us to slow down is treated as unreachable below,
        # as Google's crawlers do, rather than as licence to crawl all.
        return RobotsPolicy("allow_all", now + settings.robots_ttl)
    # RFC 9309 §2.3.1.4: server errors and network failures mean complete disallow. Too many
    # redirects take the same cautious path (§2.3.1.2 only says we MAY treat them as
    # unavailable), as does any other final status (1xx, 3xx). The short TTL retries soon.
    return RobotsPolicy("disallow_all", now + settings.robots_error_ttl)


def policy_from_lent(
    body: bytes | None, ttl: float, now: float, settings: PolitenessSettings
) -> RobotsPolicy:
    """The policy an owner lent with a host: "no rules" for ``body`` None, else the file's
    rules; it expires when the owner's does, and no later than one fetched here would."""
    expires = now + min(ttl, settings.robots_ttl)
    if body is None:
        return RobotsPolicy("allow_all", expires)
    text = _decode(body)
    return RobotsPolicy("rules", expires, Protego.parse(text), body)


class RobotsCache:
    """Policies by host, least recently used evicted first, expired entries never returned.

    Key by origin (scheme, host and port) rather than bare host name: RFC 9309 §2.3 scopes a
    robots.txt to the protocol, host and port it was fetched from.
    """

    def __init__(self, max_hosts: int = 10_000) -> None:
        if max_hosts < 1:
            raise ValueError(f"max_hosts must be at least 1, got {max_hosts}")
        self._max_hosts = max_hosts
        self._policies: OrderedDict[str, RobotsPolicy] = OrderedDict()

    def get(self, host: str, now: float) -> RobotsPolicy | None:
        """The cached policy for ``host``, or None when absent or expired (then refetch)."""
        policy = self._policies.get(host)
        if policy is None:
            return None
        if policy.expired(now):
            del self._policies[host]
            return None
        self._policies.move_to_end(host)
        return policy

    def take(self, host: str, now: float) -> RobotsPolicy | None:
        """``get``, and the entry is gone."""
        policy = self.get(host, now)
        if policy is not None:
            del self._policies[host]
        return policy

    def put(self, host: str, policy: RobotsPolicy) -> None:
        self._policies[host] = policy
        self._policies.move_to_end(host)
        while len(self._policies) > self._max_hosts:
            self._policies.popitem(last=False)

    def __len__(self) -> int:
        return len(self._policies)
