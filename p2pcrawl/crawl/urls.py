"""URL canonicalisation: one spelling per resource, so every peer hashes a URL to the same owner.

Ownership (docs/architecture.md, "Ownership") needs the same URL to reach the same owner from
any peer, so canonicalisation is part of the wire contract, not a local detail: two peers that
canonicalise differently split one host's queue and crawl pages twice.

The general path is yarl (WHATWG-style host handling: UTS 46 IDNA, IPv6 compression,
default-port detection, dot-segment removal, percent-escape normalisation) plus the standard
library's ``parse_qsl``/``urlencode`` for sorting the query. We use yarl rather than
``w3lib.url.canonicalize_url`` because w3lib applies IDNA 2003 (``straße.de`` becomes
``strasse.de``, a different domain), keeps default ports and userinfo, and leaves ``%zz`` and
raw ``[``/``|`` in paths; aiohttp, our HTTP client, is built on yarl anyway.

The general path costs 5-10 µs per URL and a page carries ~50 links, so hrefs that are already
canonical take a fast path (~1 µs): regular expressions admit only inputs for which yarl
provably changes nothing but the default port, the query order and dot segments (removed by
string operations, as RFC 3986 §5.2.4 says; a relative href's are merged with the base's
directory first), and an href with spaces or newlines around it is tried again stripped. The
tests check fast == general on a table and on generated URLs. A bounded cache serves repeats
of the rest.

Canonical form (what ``canonicalize`` returns), in order of application:

- surrounding C0 controls and spaces stripped, tabs and newlines removed (WHATWG URL §4.4);
- ``\\`` read as ``/`` before the query (WHATWG treats it so for http and https);
- scheme ``http`` or ``https`` only, lowercase; a host is required;
- userinfo dropped (it is a credential, and it does not name a different resource);
- host lowercase, IDNA (UTS 46) punycode, only ``[a-z0-9_-]`` labels or a bracketed IPv6
  literal (compressed, RFC 5952); a trailing dot is kept (a distinct name to DNS);
- port kept only if not the scheme default (80/443); port 0 rejected;
- path: dot segments resolved (RFC 3986 §5.2.4), empty path becomes ``/``, escapes of
  unreserved characters, sub-delimiters other than ``+``, ``:`` and ``@`` decoded, every other
  escape uppercase ``%XX``, other characters UTF-8 percent-encoded (yarl's rules);
- query: split on ``&``, empty fields dropped, ``k`` becomes ``k=``, pairs sorted by decoded
  (name, value) bytes, re-encoded with only unreserved characters left bare and space as ``+``
  (the w3lib/Scrapy rule); an empty query drops the ``?``;
- fragment removed;
- result longer than ``max_length`` characters rejected.
"""

from __future__ import annotations

import re
import socket
from functools import lru_cache
from urllib.parse import parse_qsl, quote_plus, urlencode

from yarl import URL

from p2pcrawl.crawl.urlparts import (
    fingerprint,
    host_of,
    hostname_of,
    origin_of,
    partition_key,
    remove_dot_segments,
)
from protocol import MAX_URL_LENGTH as PROTOCOL_MAX_URL_LENGTH
from protocol import Memo

__all__ = [
    "MAX_URL_LENGTH",
    "LinkResolver",
    "canonicalize",
    "fingerprint",
    "host_of",
    "hostname_of",
    "origin_of",
    "partition_key",
    "resolve",
]

# The limit is the protocol's (the lowest layer): a URL this crawler keeps must fit a task.
MAX_URL_LENGTH = PROTOCOL_MAX_URL_LENGTH

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Inputs this many times the limit cannot plausibly shrink under it; refusing them early keeps
# a hostile megabyte-long href from costing megabytes of work.
_INPUT_SLACK = 4
# The general path is memoised because nav bars and footers repeat the same links on every
# page of a site. Only short inputs are cached so hostile long URLs cannot bloat the cache.
_CACHE_SIZE = 16384
_CACHEABLE_LENGTH = 256

# WHATWG URL: leading/trailing C0 control or space is stripped, tab and newline removed anywhere.
_C0_SPACE = "".join(chr(c) for c in range(0x21))
_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_HEX_DIGITS = frozenset("0123456789abcdef")
_HOST_RE = re.compile(r"[a-z0-9_\-]+(?:\.[a-z0-9_\-]+)*\.?")

# The fast path. Every character class below is one that yarl leaves untouched: unreserved,
# sub-delimiters, ":" and "@" in the path; unreserved and "+" in query names and values (where
# "+" stays "+" after decoding to space and re-encoding). "%" is excluded from the query
# because escapes there sort by their decoded byte, and from the path except for escapes of
# non-ASCII bytes, which yarl keeps as they are (the ASCII ones it may decode). Dot segments
# and lone "?" or "&&" fall through to the general path by construction of the patterns, and
# "/." is rejected separately so "/./", "/../" and a trailing "/." never take the fast path.
# Written as "class* (escape class*)*" rather than "(class|escape)*": Python's re runs a bare
# class repetition as one tight loop, and an alternation once per character (5x slower).
_FAST_HOST = r"[a-z0-9\-]+(?:\.[a-z0-9\-]+)*"
_PATH_CHAR = r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]"
_HIGH_ESCAPE = r"%[89A-F][0-9A-F]"
_FAST_PATH = rf"{_PATH_CHAR}*(?:{_HIGH_ESCAPE}{_PATH_CHAR}*)*"
_FAST_FIELD = r"[A-Za-z0-9\-._~+]*=[A-Za-z0-9\-._~+]*"
_FAST_QUERY = rf"{_FAST_FIELD}(?:&{_FAST_FIELD})*"
_FAST_ABSOLUTE = re.compile(
    rf"(https?)://({_FAST_HOST})(?::([1-9][0-9]{{0,4}}))?(/{_FAST_PATH})?(?:\?({_FAST_QUERY}))?"
)
_FAST_ROOT_RELATIVE = re.compile(rf"(/(?!/){_FAST_PATH})(?:\?({_FAST_QUERY}))?")
# A relative path whose first segment has no ":" (else it would read as a scheme) and that
# does not start with a dot segment.
_RELATIVE_CHAR = r"[A-Za-z0-9\-._~!$&'()*+,;=@/]"
_FAST_PATH_RELATIVE = re.compile(
    rf"((?:[A-Za-z0-9\-_~!$&'()*+,;=@]|{_HIGH_ESCAPE})"
    rf"{_RELATIVE_CHAR}*(?:{_HIGH_ESCAPE}{_RELATIVE_CHAR}*)*)(?:\?({_FAST_QUERY}))?"
)
_FAST_QUERY_ONLY = re.compile(_FAST_QUERY)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def canonicalize(url: str, *, max_length: int = MAX_URL_LENGTH) -> str | None:
    """Return the canonical form of absolute ``url``, or None if it is not a crawlable URL.

    None means: not http/https, no host, unparseable, or longer than ``max_length`` once
    canonical. See the module docstring for the rules. Never raises on any ``str``.
    """
    if len(url) <= max_length:
        fast = _canonicalize_fast(url)
        if fast is not None:
            return fast if len(fast) <= max_length else None
    if len(url) <= _CACHEABLE_LENGTH:
        return _canonicalize_cached(url, max_length)
    return _canonicalize_general(url, max_length)


def _canonicalize_fast(url: str) -> str | None:
    """Canonicalise ``url`` by string operations if it is in the already-safe shape, else None.

    None means "not decided here", never "invalid".
    """
    m = _FAST_ABSOLUTE.fullmatch(url)
    if m is None:
        return None
    scheme, host, port, path, query = m.groups()
    rebuild = path is None
    if not rebuild and "/." in path:
        path, rebuild = remove_dot_segments(path), True
    said = (scheme, host, port)
    verdict = _fast_authorities.get(said)
    if verdict is None:
        verdict = _fast_authorities.remember(said, _authority_verdict(scheme, host, port))
    if verdict is _GENERAL:
        return None
    if verdict is _DROP_PORT:
        port = None
        rebuild = True
    if rebuild:
        authority = host if port is None else f"{host}:{port}"
        return _join(f"{scheme}://{authority}{path or '/'}", query)
    if query is not None and "&" in query:
        return f"{url[: m.start(5)]}{_sort_fast_query(query)}"
    return url


# The fast path's verdict on a (scheme, host, port), remembered: a page's links name a few
# authorities many times, and deciding cost more than the rest of the path for an IP address.
_KEEP, _DROP_PORT, _GENERAL = "keep", "drop-port", "general"
_fast_authorities: Memo[tuple[str, str, str | None], str] = Memo(_CACHE_SIZE)


def _authority_verdict(scheme: str, host: str, port: str | None) -> str:
    if _ends_in_number(host) and _DOTTED_QUAD.fullmatch(host) is None:
        return _GENERAL
    if port is None:
        return _KEEP
    port_number = int(port)
    if port_number > 65535:
        return _GENERAL
    return _DROP_PORT if port_number == _DEFAULT_PORTS[scheme] else _KEEP


def _sort_fast_query(query: str) -> str:
    """Sort a query that matched ``_FAST_QUERY`` the way the general path would.

    Its characters are unreserved or "+"; the general path sorts them decoded ("+" as space),
    and mapping "+" to space preserves order against every unreserved character, so sorting
    the raw (name, value) pairs gives the same order.
    """
    fields = query.split("&")
    pairs = sorted(field.partition("=")[::2] for field in fields)
    return "&".join(f"{name}={value}" for name, value in pairs)


def _join(prefix: str, query: str | None) -> str:
    if query is None:
        return prefix
    if "&" in query:
        query = _sort_fast_query(query)
    return f"{prefix}?{query}"


@lru_cache(maxsize=_CACHE_SIZE)
def _canonicalize_cached(url: str, max_length: int) -> str | None:
    return _canonicalize_general(url, max_length)


def _canonicalize_general(url: str, max_length: int) -> str | None:
    """The general path: yarl for authority and path, the stdlib for query order."""
    if len(url) > _INPUT_SLACK * max_length:
        return None
    url = _clean(url)
    if _scheme(url) not in _DEFAULT_PORTS:
        return None
    try:
        parsed = URL(_fix_backslashes(url))
    except Exception:
        # Hostile hrefs reach yarl's parser, which raises more than ValueError on some of
        # them (IndexError on "http://[::1]@"); any failure means "not a crawlable URL".
        return None
    return _from_yarl(parsed, max_length)


def _from_yarl(parsed: URL, max_length: int) -> str | None:
    """Assemble the canonical string from yarl's normalised parts; None if not crawlable."""
    try:
        scheme = parsed.scheme
        host = parsed.raw_host
        port = parsed.explicit_port
        path = parsed.raw_path
        query = parsed.raw_query_string
    except Exception:
        return None
    default_port = _DEFAULT_PORTS.get(scheme)
    if default_port is None or not host:
        return None
    if ":" in host:
        # yarl has validated and compressed the IPv6 literal; a zone ID ("%25eth0") only
        # means something on the machine that wrote the link.
        if "%" in host:
            return None
        host = f"[{host}]"
    else:
        # "example.com." is the same server as "example.com": one host key, one politeness
        # queue, one owner.
        host = host.rstrip(".")
        if not host or _HOST_RE.fullmatch(host) is None:
            return None
        if _ends_in_number(host):
            host = _ipv4(host)
            if host is None:
                return None
    if port is None or port == default_port:
        authority = host
    elif port == 0:
        return None
    else:
        authority = f"{host}:{port}"
    result = f"{scheme}://{authority}{path or '/'}"
    if query:
        query = _sort_query(query)
        if query:
            result = f"{result}?{query}"
    if len(result) > max_length or not result.isascii():
        return None
    return result


def _scheme(url: str) -> str | None:
    m = _SCHEME_RE.match(url)
    return None if m is None else m.group(1).lower()


def _ends_in_number(host: str) -> bool:
    """WHATWG URL "ends in a number": such a host is an IPv4 address or invalid."""
    end = len(host) - 1 if host.endswith(".") else len(host)
    if not host[end - 1 : end].isdigit() and "0x" not in host:
        return False  # the common case, decided without slicing the last label
    last = host[host.rfind(".", 0, end) + 1 : end]
    return last.isdigit() or (last.startswith("0x") and _HEX_DIGITS.issuperset(last[2:]))


def _ipv4(host: str) -> str | None:
    """Dotted-quad form of a legacy IPv4 spelling ("0x7f.1", "127.1", "2130706433").

    Browsers and the C resolver both accept these spellings (WHATWG URL §3.5, inet_aton), so
    leaving them alone would give one machine several host keys and let "127.1" slip past a
    textual private-address check.
    """
    try:
        return socket.inet_ntoa(socket.inet_aton(host.removesuffix(".")))
    except OSError:
        return None


def _sort_query(query: str) -> str:
    # latin-1 maps each percent-decoded byte to one code point, so legacy non-UTF-8 values
    # (%FF) survive the round trip and str order equals byte order.
    pairs = parse_qsl(query, keep_blank_values=True, encoding="latin-1", errors="strict")
    pairs.sort()
    return urlencode(pairs, encoding="latin-1", quote_via=quote_plus)


def _clean(text: str) -> str:
    if text[:1] <= " " or text[-1:] <= " ":
        text = text.strip(_C0_SPACE)
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.translate(_TAB_NEWLINE)
    return text


def _fix_backslashes(url: str) -> str:
    """Read "\\" as "/" before the query, as browsers do for http(s) (WHATWG URL)."""
    if "\\" not in url:
        return url
    cut = len(url)
    for delimiter in "?#":
        at = url.find(delimiter)
        if at != -1 and at < cut:
            cut = at
    return url[:cut].replace("\\", "/") + url[cut:]


class LinkResolver:
    """Resolves hrefs against one canonical base URL; ``resolve`` for a whole page at once.

    It keeps the pieces of the base that relative references are joined onto, so a page's
    links each cost a regex match and a concatenation. ``LinkResolver(base).resolve(href)`` is
    ``resolve(base, href)``.
    """

    __slots__ = ("_parsed", "directory", "origin", "url", "without_query")

    def __init__(self, url: str) -> None:
        path_start = url.find("/", url.find("://") + 3)
        if path_start == -1:
            # Not canonical ("http://h"); tolerate it rather than join onto "http://".
            path_start = len(url)
            url += "/"
        self.url = url
        self.origin = url[:path_start]
        query_start = url.find("?")
        self.without_query = url if query_start == -1 else url[:query_start]
        self.directory = self.without_query[: self.without_query.rfind("/") + 1]
        self._parsed: URL | None = None

    def resolve(self, href: str, max_length: int = MAX_URL_LENGTH) -> str | None:
        """Join ``href`` onto this base and canonicalise; see the module-level ``resolve``."""
        hash_at = href.find("#")
        ref = href if hash_at == -1 else href[:hash_at]
        first = ref[:1]
        if first == "/":
            m = _FAST_ROOT_RELATIVE.fullmatch(ref)
            if m is not None:
                path = m.group(1)
                if "/." in path:
                    path = remove_dot_segments(path)
                return _fit(_join(self.origin + path, m.group(2)), max_length)
        elif first == "h":
            if ref.startswith(("http://", "https://")) and len(ref) <= max_length:
                fast = _canonicalize_fast(ref)
                if fast is not None:
                    return _fit(fast, max_length)
        elif first == "?":
            query = ref[1:]
            if _FAST_QUERY_ONLY.fullmatch(query) is not None:
                return _fit(_join(self.without_query, query), max_length)
        elif first == "":
            if hash_at != -1:
                # "#frag": the page itself.
                return _fit(self.url, max_length)
            return None
        elif first == "." and ":" not in ref.partition("/")[0]:
            # "./x", "../x", "." and "..": merged onto the directory (RFC 3986 §5.2.3),
            # then their dot segments removed as a root-relative path's are. (A ":" in the
            # first segment makes a reference the general path refuses.)
            return self._merged(ref, href, max_length)
        m = _FAST_PATH_RELATIVE.fullmatch(ref)
        if m is not None:
            if "/." in m.group(1):
                return self._merged(ref, href, max_length)
            return _fit(_join(self.directory + m.group(1), m.group(2)), max_length)
        if href[0] <= " " or href[-1] <= " ":
            # Markup indents hrefs and ends them with newlines, and the URL parser drops
            # both ends' C0 controls and spaces: the fast path decides what is left.
            # (Checked last, so the common spellings pay nothing for it.)
            stripped = href.strip(_C0_SPACE)
            if stripped:
                return self.resolve(stripped, max_length)
        return self.resolve_general(href, max_length)

    def _merged(self, ref: str, href: str, max_length: int) -> str | None:
        """Relative path ``ref`` merged onto this base's directory, its dot segments
        removed; ``href`` as written, for the general path if it must decide."""
        m = _FAST_ROOT_RELATIVE.fullmatch(self.directory[len(self.origin) :] + ref)
        if m is None:
            return self.resolve_general(href, max_length)
        return _fit(_join(self.origin + remove_dot_segments(m.group(1)), m.group(2)), max_length)

    def resolve_general(self, href: str, max_length: int = MAX_URL_LENGTH) -> str | None:
        """RFC 3986 §5.2 reference resolution by yarl, then the general canonicaliser."""
        if len(href) > _INPUT_SLACK * max_length:
            return None
        href = _clean(href)
        if not href:
            return None
        scheme = _scheme(href)
        if scheme is not None and scheme not in _DEFAULT_PORTS:
            return None
        href = _fix_backslashes(href)
        if scheme is not None and href.startswith("//", len(scheme) + 1):
            # With a scheme and an authority the base plays no part (RFC 3986 §5.2.2), and
            # canonicalize() caches: spellings like "HTTP://Example.com/" repeat across pages.
            return canonicalize(href, max_length=max_length)
        if href[0] == "?":
            # A query-only reference replaces the base's query even when empty (RFC 3986
            # §5.2.2); yarl and urljoin both keep the base query for a bare "?".
            return canonicalize(self.without_query + href, max_length=max_length)
        try:
            if self._parsed is None:
                self._parsed = URL(self.url)
            joined = self._parsed.join(URL(href))
        except Exception:
            return None
        return _from_yarl(joined, max_length)


def _fit(url: str, max_length: int) -> str | None:
    return url if len(url) <= max_length else None


@lru_cache(maxsize=256)
def _resolver_for(base: str) -> LinkResolver:
    return LinkResolver(base)


def resolve(base: str, href: str, *, max_length: int = MAX_URL_LENGTH) -> str | None:
    """Join ``href`` against canonical ``base`` and canonicalise it. None for empty hrefs,
    schemes other than http/https (``mailto:``, ``javascript:``…) and anything
    ``canonicalize`` refuses; a fragment-only href ("#top") resolves to ``base`` itself."""
    return _resolver_for(base).resolve(href, max_length)
