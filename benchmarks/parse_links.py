"""Link extraction against a bare selectolax + urljoin loop, on generated ~30 KB pages.

Every fetched page goes through ``p2pcrawl.crawl.parse.extract_links``, so its cost per page bounds
the engine's pages/s. The bare loop is what ``single_peer.py``'s bare crawler does with a
body: lexbor, ``a[href]``, ``urljoin`` + ``urldefrag``, a Python set. extract_links does more
(canonicalisation, robots meta, ``<base href>``, nofollow, dedup in document order), so the
target is a cost within ~1.3x the bare loop's.

The pages mix the spellings real sites use (the ``HREF_MIX`` table): absolute on the page's
host and on others, root-relative with and without queries, path-relative with and without
dot segments, query-only, fragments, unsorted queries, percent-escapes, surrounding
whitespace, nav links repeated on every page, mailto: and javascript:. Both loops see the
same pages; ``--repeat`` passes alternate between them and the best pass of each counts.

    python benchmarks/parse_links.py                  # 2,000 pages, 3 passes each
    python benchmarks/parse_links.py --pages 500 --repeat 1
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from urllib.parse import urldefrag, urljoin

from selectolax.lexbor import LexborHTMLParser

from p2pcrawl.crawl import extract_links, urls

PAGE_BYTES = 30_000
LINKS_PER_PAGE = 50
PAGE_URL = "http://127.0.0.3:8123/blog/2024/post-{n}.html"
NAV = ("/", "/about/", "/blog/", "/contact", "/tags/python", "/tags/web")

# (weight, template): {p} is a post number, {h} the page's origin.
HREF_MIX: tuple[tuple[int, str], ...] = (
    (14, "{h}/blog/2023/post-{p}.html"),  # absolute, same host
    (10, "https://www.example.org/articles/{p}/some-title"),  # absolute, other host
    (12, "/blog/2023/post-{p}.html"),  # root-relative
    (6, "/search?q=word{p}&lang=en"),  # root-relative, sorted query
    (4, "/search?lang=en&q=word{p}"),  # root-relative, unsorted query
    (10, "post-{p}.html"),  # path-relative
    (6, "../2023/post-{p}.html"),  # path-relative with a dot segment
    (8, "/blog/2023/post-{p}.html#comments"),  # fragment
    (4, "?page={p}"),  # query-only
    (6, "https://cdn.example.net/img/{p}.png"),  # absolute, other host
    (3, "HTTP://WWW.Example.ORG/Articles/{p}"),  # upper case scheme and host
    (3, "/tags/caf%c3%a9-{p}"),  # lower-case percent-escapes
    (2, "  /blog/2023/post-{p}.html\n"),  # surrounding whitespace
    (2, "https://www.example.org:443/a/./b/../c-{p}"),  # default port, dot segments
)
LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation"
)
WORDS = tuple(LOREM.split())


def make_page(n: int, rng: random.Random) -> tuple[str, bytes]:
    """One ~PAGE_BYTES page with ~LINKS_PER_PAGE links; returns (canonical URL, body)."""
    url = PAGE_URL.format(n=n)
    origin = urls.origin_of(url)
    templates = [t for _, t in HREF_MIX]
    weights = [w for w, _ in HREF_MIX]
    head = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Post {n}</title>"
        '<meta name="viewport" content="width=device-width">'
        '<link rel="stylesheet" href="/static/site.css">'
        '<script>var cfg = {a: 1, b: "<a href=not-a-link>"};</script></head><body><nav><ul>'
    )
    parts = [head]
    parts += [f'<li><a class="nav" href="{href}">{href}</a></li>' for href in NAV]
    parts.append("</ul></nav><main>")
    content_links = LINKS_PER_PAGE - len(NAV) - 3
    hrefs = rng.choices(templates, weights, k=content_links)
    words_per_paragraph = (PAGE_BYTES - 2000) // (content_links * 7)
    for template in hrefs:
        href = template.format(p=rng.randrange(5000), h=origin).replace("&", "&amp;")
        text = " ".join(rng.choices(WORDS, k=words_per_paragraph))
        parts.append(f'<p>{text} <a href="{href}" title="read more">read more</a></p>')
    parts.append(
        '</main><footer><a href="mailto:editor@example.org">mail</a>'
        '<a href="javascript:void(0)">menu</a><a href="/" rel="home">home</a>'
        "</footer></body></html>"
    )
    return url, "".join(parts).encode()


def bare_css(body: bytes, url: str) -> int:
    """single_peer.py's bare loop: ``css("a[href]")``."""
    seen: set[str] = set()
    for node in LexborHTMLParser(body).css("a[href]"):
        href = node.attributes.get("href")
        if href:
            seen.add(urldefrag(urljoin(url, href))[0])
    return len(seen)


def bare_tags(body: bytes, url: str) -> int:
    """The same with ``tags("a")``, the cheaper walk extract_links uses: the strict baseline."""
    seen: set[str] = set()
    for node in LexborHTMLParser(body).tags("a"):
        href = node.attributes.get("href")
        if href:
            seen.add(urldefrag(urljoin(url, href))[0])
    return len(seen)


def extract(body: bytes, url: str) -> int:
    return len(extract_links(body, url).links)


def best_pass(
    fn: Callable[[bytes, str], int], pages: list[tuple[str, bytes]], repeat: int
) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for url, body in pages:
            fn(body, url)
        best = min(best, time.perf_counter() - start)
    return best


def general_path_share(pages: list[tuple[str, bytes]]) -> float:
    """Share of distinct per-page hrefs that miss every fast path (an untimed pass)."""
    calls = 0
    original = urls.LinkResolver.resolve_general

    def counting(self: urls.LinkResolver, href: str, max_length: int = 2048) -> str | None:
        nonlocal calls
        calls += 1
        return original(self, href, max_length)

    distinct = 0
    urls.LinkResolver.resolve_general = counting  # type: ignore[method-assign]
    try:
        for url, body in pages:
            tree = LexborHTMLParser(body)
            distinct += len({n.attributes.get("href") for n in tree.tags("a")} - {None})
            extract_links(body, url)
    finally:
        urls.LinkResolver.resolve_general = original  # type: ignore[method-assign]
    return calls / max(distinct, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2000, help="pages per pass (2000)")
    parser.add_argument("--repeat", type=int, default=3, help="passes per loop; best counts")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    pages = [make_page(n, rng) for n in range(args.pages)]
    size = sum(len(body) for _, body in pages) / len(pages)
    links = sum(body.count(b"<a ") for _, body in pages) / len(pages)
    print(f"{len(pages)} pages, {size / 1000:.1f} KB and {links:.1f} <a> each")
    share = general_path_share(pages)
    # Fresh caches, so the timed passes start as a crawler starts.
    urls._canonicalize_cached.cache_clear()
    urls._resolver_for.cache_clear()

    loops = {"bare css": bare_css, "bare tags": bare_tags, "extract_links": extract}
    times = {name: float("inf") for name in loops}
    for _ in range(args.repeat):  # alternate, so a noisy neighbour hits all loops alike
        for name, fn in loops.items():
            times[name] = min(times[name], best_pass(fn, pages, 1))
    for name, seconds in times.items():
        print(
            f"{name:>14}: {len(pages) / seconds:8.0f} pages/s  "
            f"{seconds / len(pages) * 1e6:6.1f} us/page"
        )
    for name in ("bare css", "bare tags"):
        ratio = times["extract_links"] / times[name]
        print(f"extract_links cost / {name} cost: {ratio:.2f}x (target <= 1.3x)")
    print(f"hrefs on the general (yarl) path: {share:.1%} of distinct hrefs per page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
