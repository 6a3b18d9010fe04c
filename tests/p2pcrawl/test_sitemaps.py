"""The sitemap parser fed as the network would feed it, hostile documents included."""

from __future__ import annotations

import gzip
import time
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pcrawl.crawl.sitemaps import (
    MAX_SITEMAP_URLS,
    SitemapDoc,
    SitemapParser,
    parse_lastmod,
)
from p2pcrawl.testing.hostilesignals import _huge_gzip, _laughs
from p2pcrawl.testing.signals import sitemap_index, urlset


def parse(body: bytes, chunk: int = 7, **kwargs: int) -> SitemapDoc:
    parser = SitemapParser(**kwargs)
    for i in range(0, len(body), chunk):
        if not parser.feed(body[i : i + chunk]):
            break
        while parser.pending:
            parser.feed(b"")
    return parser.close()


def test_urlset_with_lastmod_fed_a_few_bytes_at_a_time() -> None:
    body = urlset(["http://a.example/1", "http://a.example/2"], "2024-05-17T10:00:00Z")
    doc = parse(body)
    when = parse_lastmod("2024-05-17T10:00:00+00:00")
    assert doc == SitemapDoc("urlset", [("http://a.example/1", when), ("http://a.example/2", when)])


def test_sitemap_index_plain_and_gzip_and_text() -> None:
    index = sitemap_index(["http://a.example/s1.xml", "http://a.example/s2.xml.gz"])
    assert parse(index).sitemaps == ["http://a.example/s1.xml", "http://a.example/s2.xml.gz"]
    assert parse(gzip.compress(index)).sitemaps == parse(index).sitemaps
    text = b"http://a.example/1\r\n\nnot a url\nhttps://a.example/2"
    doc = parse(text, chunk=5)
    assert (doc.kind, [u for u, _ in doc.urls]) == (
        "text",
        ["http://a.example/1", "https://a.example/2"],
    )


def test_namespace_prefixes_and_other_elements_are_read_or_skipped() -> None:
    body = (
        b'<?xml version="1.0"?><s:urlset xmlns:s="http://www.sitemaps.org/schemas/sitemap/0.9" '
        b'xmlns:image="x"><s:url><s:loc> http://a.example/1 </s:loc><image:image><image:loc>'
        b"http://a.example/i.png</image:loc></image:image></s:url><s:url><s:lastmod>2024"
        b"</s:lastmod></s:url></s:urlset>"
    )
    assert parse(body) == SitemapDoc("urlset", [("http://a.example/1", None)])


def test_lastmod_is_parsed_and_bounded() -> None:
    now = time.time()
    assert parse_lastmod("2024") == parse_lastmod("2024-01-01T00:00:00Z")
    assert parse_lastmod("2024-05") == parse_lastmod("2024-05-01")
    assert parse_lastmod("2024-05-17T12:00:00+02:00") == parse_lastmod("2024-05-17T10:00:00Z")
    assert parse_lastmod("1970-01-01") is None  # before sitemaps existed
    assert parse_lastmod("2999-01-01", now) is None  # in the future
    assert parse_lastmod("yesterday") is None
    assert parse_lastmod("9" * 100) is None


def test_entity_bomb_and_external_entity_are_refused() -> None:
    doc = parse(_laughs(), chunk=1 << 16)
    assert (doc.bound, doc.urls) == ("entities", [])
    xxe = (
        b'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        b"<urlset><url><loc>&x;</loc></url></urlset>"
    )
    assert parse(xxe).bound == "entities"
    # A DOCTYPE without entities is harmless and read.
    plain = b"<!DOCTYPE urlset><urlset><url><loc>http://a.example/</loc></url></urlset>"
    assert parse(plain).urls == [("http://a.example/", None)]


def test_gzip_bomb_is_cut_at_the_protocol_size_inflating_a_step_at_a_time() -> None:
    bomb = _huge_gzip()
    assert len(bomb) < 200_000
    parser = SitemapParser()
    steps = 0
    assert parser.feed(bomb[:65536])
    while parser.pending:
        steps += 1
        parser.feed(b"")
    assert parser.doc.bound == "too_large"
    assert steps >= 160  # each step inflated at most 256 KiB
    small = SitemapParser(max_bytes=1000)
    small.feed(gzip.compress(b"<urlset>" + b" " * 5000 + b"</urlset>"))
    assert small.close().bound == "too_large"


def test_url_count_is_capped_per_file() -> None:
    many = urlset([f"http://a.example/{i}" for i in range(MAX_SITEMAP_URLS + 10)])
    doc = parse(many, chunk=1 << 16)
    assert (doc.bound, len(doc.urls)) == ("too_many_urls", MAX_SITEMAP_URLS)
    assert len(parse(many, chunk=1 << 16, max_urls=5).urls) == 5


def test_malformed_xml_keeps_what_came_before_the_error() -> None:
    body = b"<urlset><url><loc>http://a.example/1</loc></url><url><loc>http://a.example/x<</urlset"
    doc = parse(body)
    assert (doc.bound, doc.urls) == ("malformed", [("http://a.example/1", None)])
    assert parse(b"<urlset><url><loc>http://a.example/1</loc>").bound == "malformed"
    corrupt = bytearray(gzip.compress(urlset(["http://a.example/1"])))
    corrupt[20:30] = b"\x00" * 10
    assert parse(bytes(corrupt)).bound == "malformed"


def test_a_sitemap_that_is_something_else_says_so() -> None:
    doc = parse(b"<!DOCTYPE html><html><body><a href='/x'>x</a></body></html>")
    assert doc.kind == "" and doc.urls == [] and doc.sitemaps == []


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(min_value=1, max_value=64))
def test_any_bytes_parse_without_raising(body: bytes, chunk: int) -> None:
    doc = parse(body, chunk=chunk)
    assert len(doc.urls) <= MAX_SITEMAP_URLS


@pytest.mark.parametrize("wbits", [16 + zlib.MAX_WBITS])
def test_truncated_gzip_ends_quietly(wbits: int) -> None:
    z = zlib.compressobj(6, zlib.DEFLATED, wbits)
    body = z.compress(urlset(["http://a.example/1", "http://a.example/2"])) + z.flush()
    doc = parse(body[: len(body) - 12])
    assert doc.bound == "malformed" or doc.urls[:1] == [("http://a.example/1", None)]
