"""Wire encoding of crawl batches: round trip, chunking under rpcudp's 8 KiB, strict decoding."""

from __future__ import annotations

import secrets
import struct
import zlib
from collections import defaultdict
from typing import Any

import pytest
import umsgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import MessageError, key_for
from protocol.codec import MAX_DECOMPRESSED, MAX_ITEMS, MAX_KEYS
from protocol.messages import (
    FPS_PER_CHUNK,
    MAX_URL_LENGTH,
    REFRESH_TASK,
    RPC_REQUEST_LIMIT,
    STORE_TASK,
    KeyBatch,
    RefreshAnswer,
    StoreResult,
    TaskItem,
    decode_batches,
    decode_fps,
    encode_batches,
    encode_fps,
    refresh_answer,
    refresh_reply,
    store_reply,
    store_result,
)
from protocol.model import MAX_KNOWN
from protocol.procedures import parse_reply, reply_to_wire

ID = b"\x01" * 20


def merged(batches: list[KeyBatch]) -> dict[bytes, tuple[list[TaskItem], list[int]]]:
    out: dict[bytes, tuple[list[TaskItem], list[int]]] = defaultdict(lambda: ([], []))
    for b in batches:
        out[b.key][0].extend(b.tasks)
        out[b.key][1].extend(b.done)
    return dict(out)


def roundtrip(batches: list[KeyBatch], **kw: Any) -> list[KeyBatch]:
    return [b for chunk in encode_batches(batches, **kw) for b in decode_batches(chunk)]


def framed(method: str, *args: Any) -> int:
    """Size of the whole request as rpcudp checks it: msgpack of [name, args]."""
    return len(umsgpack.packb([method, list(args)]))


def test_roundtrip_keeps_everything() -> None:
    batches = [
        KeyBatch(
            key_for("a.example"),
            [TaskItem("https://a.example/", 0), TaskItem("http://a.example/x?y=1#z", 3, 2)],
            [1, 2**64 - 1],
        ),
        KeyBatch(key_for("b.example"), [], [7]),
        KeyBatch(key_for("c.example"), []),  # an empty batch survives too
    ]
    assert roundtrip(batches) == batches
    assert encode_batches([]) == []


def test_5000_long_urls_chunk_under_the_rpcudp_limit() -> None:
    # Random path segments compress poorly, so this needs many chunks.
    batches = [
        KeyBatch(
            key_for(f"host{h}.example"),
            [
                TaskItem(
                    f"https://host{h}.example/{secrets.token_urlsafe(140)}"[:200].ljust(200, "x"),
                    2,
                    1,
                )
                for _ in range(100)
            ],
            [secrets.randbits(64) for _ in range(50)],
        )
        for h in range(50)
    ]
    assert sum(len(b.tasks) for b in batches) == 5000
    chunks = encode_batches(batches)
    assert len(chunks) > 10
    for chunk in chunks:
        for method in ("store_task", "store_backup"):
            assert framed(method, ID, ID, chunk) < RPC_REQUEST_LIMIT
    assert merged([b for c in chunks for b in decode_batches(c)]) == merged(batches)


def test_one_batch_too_big_for_a_chunk_is_split_by_key() -> None:
    batch = KeyBatch(
        key_for("big"), [TaskItem(f"https://big/{secrets.token_hex(40)}", 1) for _ in range(2000)]
    )
    out = roundtrip([batch])
    assert len(out) > 1 and {b.key for b in out} == {batch.key}
    assert merged(out) == merged([batch])


def test_maximal_incompressible_urls_still_fit() -> None:
    urls = [("https://" + secrets.token_hex(MAX_URL_LENGTH))[:MAX_URL_LENGTH] for _ in range(20)]
    batches = [KeyBatch(secrets.token_bytes(20), [TaskItem(u, 65535, 65535)]) for u in urls]
    chunks = encode_batches(batches)
    assert all(framed("store_backup", ID, ID, c) < RPC_REQUEST_LIMIT for c in chunks)
    assert roundtrip(batches) == batches


def test_many_keys_per_chunk_are_capped() -> None:
    # Keys are incompressible; capping keys keeps the reply (refused keys) small.
    batches = [KeyBatch(secrets.token_bytes(20), [TaskItem("http://h/", 0)]) for _ in range(2000)]
    out = [decode_batches(c) for c in encode_batches(batches)]
    assert max(len(chunk) for chunk in out) <= 256


def test_highly_compressible_input_stays_under_the_inflate_cap() -> None:
    url = "https://a.example/" + "a" * 2000
    batches = [KeyBatch(key_for("a"), [TaskItem(url, 1)] * 3000)]
    chunks = encode_batches(batches)
    for c in chunks:
        assert len(zlib.decompress(c)) <= MAX_DECOMPRESSED
    assert sum(len(b.tasks) for b in roundtrip(batches)) == 3000


@pytest.mark.parametrize(
    "batch",
    [
        KeyBatch(b"\x00" * 19, []),
        KeyBatch(ID, [TaskItem("ftp://a/", 0)]),
        KeyBatch(ID, [TaskItem("https://", 0)]),
        KeyBatch(ID, [TaskItem("https:///path", 0)]),
        KeyBatch(ID, [TaskItem("https://a b/", 0)]),
        KeyBatch(ID, [TaskItem("https://a/\nhttps://b/", 0)]),
        KeyBatch(ID, [TaskItem("https://ä/", 0)]),
        KeyBatch(ID, [TaskItem("https://a/" + "x" * MAX_URL_LENGTH, 0)]),
        KeyBatch(ID, [TaskItem(b"https://a/", 0)]),  # type: ignore[arg-type]
        KeyBatch(ID, [TaskItem("https://a/", -1)]),
        KeyBatch(ID, [TaskItem("https://a/", 0, 65536)]),
        KeyBatch(ID, [TaskItem("https://a/", 1.5)]),  # type: ignore[arg-type]
        KeyBatch(ID, [], [2**64]),
        KeyBatch(ID, [], [-1]),
    ],
)
def test_encoder_refuses_what_the_receiver_would(batch: KeyBatch) -> None:
    with pytest.raises(MessageError):
        encode_batches([batch])


def z(obj: Any) -> bytes:
    return zlib.compress(umsgpack.packb(obj))


def cols(
    keys: list[bytes] | None = None,
    tasks: list[int] | None = None,
    fps: list[int] | None = None,
    urls: str = "https://a/",
    **override: Any,
) -> bytes:
    """A columnar payload, consistent unless told otherwise."""
    keys = [ID] if keys is None else keys
    n = len(urls.split("\n")) if urls else 0
    tasks = ([n] + [0] * (len(keys) - 1) if keys else []) if tasks is None else tasks
    fps = [0] * len(keys) if fps is None else fps
    body: dict[str, Any] = {
        "version": 1,
        "keys": b"".join(keys),
        "tasks": struct.pack(f">{len(tasks)}I", *tasks),
        "fps": struct.pack(f">{len(fps)}I", *fps),
        "urls": urls,
        "depths": b"\0\1" * n,
        "hops": b"\0\0" * n,
        "done": b"\0" * 8 * sum(fps),
    }
    if "key_column" in override:
        body["keys"] = override.pop("key_column")
    body.update(override)
    return z(list(body.values()))


def test_decoder_accepts_the_empty_payload() -> None:
    assert decode_batches(cols(keys=[], urls="")) == []
    assert decode_batches(cols(urls="https://a/\nhttp://b/x")) == [
        KeyBatch(ID, [TaskItem("https://a/", 1), TaskItem("http://b/x", 1)])
    ]


@pytest.mark.parametrize(
    "payload",
    [
        "not bytes",
        b"",
        b"not zlib",
        cols()[:-3],  # truncated
        cols() + b"junk",  # trailing data
        zlib.compress(b"\0" * 6_000_000, 9),  # decompression bomb
        zlib.compress(b"\xc1"),  # reserved msgpack code
        z({"a": 1}),
        z([1, "x"]),
        cols(version=2),
        cols(version=True),
        cols(keys=[b"\0" * 19]),  # key of 19 bytes
        cols(key_column="k" * 20),
        cols(tasks=[1, 0]),  # counts for two keys, one key
        cols(tasks=[2]),  # counts do not add up to the URLs
        cols(fps=[1], done=b""),
        cols(done=b"\0" * 7),
        cols(urls="ftp://a/"),
        cols(urls="https://a/ b"),
        cols(urls="https://"),
        cols(urls="https://" + "a" * MAX_URL_LENGTH),
        cols(urls="HTTPS://a/\nhttp://b/\u00e4"),
        cols(depths=b"\0"),  # depth column too short
        cols(depths=[1]),
        cols(
            keys=[secrets.token_bytes(20) for _ in range(MAX_KEYS + 1)],
            urls="",
            tasks=[0] * (MAX_KEYS + 1),
        ),
        cols(urls="\n".join(["https://a/"] * (MAX_ITEMS + 1))),
        b"\x00" * (RPC_REQUEST_LIMIT + 1),
    ],
)
def test_decoder_rejects(payload: Any) -> None:
    with pytest.raises(MessageError):
        decode_batches(payload)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_raise_only_message_error(data: bytes) -> None:
    try:
        decode_batches(data)
    except MessageError:
        pass


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.binary(max_size=30)
    | st.text(max_size=30)
    | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(msgpack_values)
def test_arbitrary_msgpack_raises_only_message_error(obj: Any) -> None:
    # Past the inflate step, so the structural checks get exercised.
    for payload in (z(obj), z([1, obj]), z([1, b"", b"", b"", "", b"", b"", obj])):
        try:
            decode_batches(payload)
        except MessageError:
            pass


urls = st.builds(
    lambda scheme, host, path: f"{scheme}{host}{path}",
    st.sampled_from(["http://", "https://", "HTTPS://"]),
    st.text("abcxyz019.-", min_size=1, max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40),
)
tasks = st.builds(TaskItem, urls, st.integers(0, 65535), st.integers(0, 65535))
batches = st.builds(
    KeyBatch,
    st.binary(min_size=20, max_size=20),
    st.lists(tasks, max_size=30),
    st.lists(st.integers(0, 2**64 - 1), max_size=10),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(batches, max_size=6))
def test_roundtrip_property(bs: list[KeyBatch]) -> None:
    assert merged(roundtrip(bs)) == merged(bs)


def test_fingerprints_chunk_and_roundtrip() -> None:
    fps = [secrets.randbits(64) for _ in range(2 * FPS_PER_CHUNK + 5)]
    chunks = encode_fps(fps)
    assert len(chunks) == 3
    assert all(framed("delete_backup", ID, ID, c) < RPC_REQUEST_LIMIT for c in chunks)
    assert [f for c in chunks for f in decode_fps(c)] == fps
    for bad in (b"\0" * 7, "x", b"\0" * 8 * (FPS_PER_CHUNK + 1)):
        with pytest.raises(MessageError):
            decode_fps(bad)
    with pytest.raises(MessageError):
        encode_fps([2**64])


def store_wire(result: StoreResult, asked: set[bytes]) -> dict[str, Any]:
    return reply_to_wire(store_reply(result, asked))


def store_back(raw: object, asked: set[bytes]) -> StoreResult:
    return store_result(parse_reply(STORE_TASK, raw), asked)


def test_store_result_reply_only_refuses_asked_keys() -> None:
    a, b, other = key_for("a"), key_for("b"), key_for("other")
    wire = store_wire(StoreResult(3, 1, [a, other, a]), {a, b})
    assert wire == {"new": 3, "dup": 1, "refused": [a]}
    back = store_back({**wire, "refused": [a, other], "id": a}, {a, b})  # unknown fields: fine
    assert back == StoreResult(3, 1, [a])
    bad: object
    for bad in (
        [],
        {"new": -1, "dup": 0, "refused": []},
        {"new": 1, "dup": 0, "refused": "x"},
        {"new": True, "dup": 0, "refused": []},
        {"new": 1, "dup": 0, "refused": [a, "junk"]},
        {"new": 1, "dup": 0, "refused": [a] * (MAX_KEYS + 1)},
        {"new": 1, "refused": []},
    ):
        with pytest.raises(MessageError):
            store_back(bad, {a})


def test_store_result_reply_carries_what_the_owner_holds_within_its_bound() -> None:
    a = key_for("a")
    fps = [0, 1, 2**64 - 1, 12345]
    wire = store_wire(StoreResult(1, 0, [], fps), {a})
    assert wire["known"] == struct.pack(">4Q", *fps)
    assert store_back(wire, {a}) == StoreResult(1, 0, [], fps)
    # More than the bound is cut to it; nothing at all leaves the field out.
    many = store_wire(StoreResult(0, 1, [], list(range(MAX_KNOWN + 7))), {a})
    assert store_back(many, {a}).known == list(range(MAX_KNOWN))
    assert "known" not in store_wire(StoreResult(0, 1, []), {a})
    base = {"new": 0, "dup": 1, "refused": []}
    for bad in (b"\0" * 7, b"\0" * 8 * (MAX_KNOWN + 1), [1, 2], "x" * 8, 5):
        with pytest.raises(MessageError):
            store_back({**base, "known": bad}, {a})


def test_a_refresh_reply_says_how_many_keys_follow_or_when_to_ask_again() -> None:
    def to_wire(answer: RefreshAnswer) -> dict[str, Any]:
        return reply_to_wire(refresh_reply(answer))

    def back(raw: object) -> RefreshAnswer:
        return refresh_answer(parse_reply(REFRESH_TASK, raw))

    assert to_wire(RefreshAnswer(7)) == {"n": 7}  # what peers without "later" read
    assert back({"n": 7}) == RefreshAnswer(7)
    later = to_wire(RefreshAnswer(0, retry_after=2.5))
    assert later == {"n": 0, "later_ms": 2500}
    assert back(later) == RefreshAnswer(0, retry_after=2.5)
    bad: object
    for bad in (
        {"n": 3, "later_ms": 100},  # promises keys and says "later"
        {"n": 0, "later_ms": -1},
        {"n": 0, "later_ms": 1.5},
        {"n": 0, "later_ms": 10**12},  # "come back in 31 years"
        {"later_ms": 100},
    ):
        with pytest.raises(MessageError):
            back(bad)
    with pytest.raises(ValueError):
        RefreshAnswer(2, retry_after=1.0)
