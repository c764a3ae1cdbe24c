"""The JSON Lines sink over streams that are not a plain file: compressors.

A compressing stream (gzip, bz2, lzma) answers ``fileno()`` with the
descriptor of the file underneath; what is written there skips the
compressor. The sink writes such a stream through its own ``write``.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import socket
import ssl
import threading
import zipfile

import pytest
from eventdb import make_db

from agentrt.events import Event
from agentrt.store import open_existing
from agentrt.trace import jsonl_record, jsonl_with_err
from agentrt_export import FileCursor, Follower, FollowError, JSONLSink

COMPRESSORS = [gzip, bz2, lzma]

EVENTS = [
    Event(1, "run-1", "", "2026-01-01T00:00:00Z", "run.created", b'{"goal":"a"}'),
    Event(2, "run-1", "s", "2026-01-01T00:00:01Z", "step.decided", b'{"a":"\xc3\xa9"}'),
]


def _export(db: str, cursor: str, stream) -> None:
    Follower(open_existing(db), cursor=FileCursor(cursor), once=True,
             page_size=7).follow(JSONLSink(stream))


@pytest.mark.parametrize("mode", ["wb", "wt"])
def test_an_export_into_a_gzip_file_decompresses_to_the_plain_export(tmp_path, mode):
    compressor = gzip
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=10).close()
    plain = tmp_path / "plain.jsonl"
    with open(plain, "wb") as f:
        _export(db, str(tmp_path / "plain.cursor"), f)
    packed = tmp_path / "events.jsonl.x"
    encoding = {"encoding": "utf-8"} if mode == "wt" else {}
    with compressor.open(packed, mode, **encoding) as f:
        _export(db, str(tmp_path / "packed.cursor"), f)
    assert compressor.decompress(packed.read_bytes()) == plain.read_bytes()
    assert FileCursor(str(tmp_path / "packed.cursor")).load() == 20


@pytest.mark.parametrize("mode", ["wb", "wt"])
@pytest.mark.parametrize("compressor", [bz2, lzma], ids=lambda m: m.__name__)
def test_a_bz2_or_lzma_file_is_refused_as_it_writes_nothing_until_closed(
        tmp_path, compressor, mode):
    """Their flush writes nothing: the cursor was saved (and synced) past events
    the file did not hold, and a kill lost every one since the last block."""
    with compressor.open(tmp_path / "events.x", mode) as f, pytest.raises(FollowError) as info:
        JSONLSink(f)
    assert str(info.value) == (
        f"export: JSONLSink: a {compressor.__name__} file keeps what it is given until it is "
        "closed, so the cursor would pass events it has not written: use gzip.open (its flush "
        "writes what it holds), or compress the plain output (agentrt-export jsonl | xz)")


@pytest.mark.parametrize("layers", [
    lambda: io.BufferedWriter(bz2.BZ2File(io.BytesIO(), "wb")),
    lambda: io.TextIOWrapper(io.BufferedWriter(lzma.LZMAFile(io.BytesIO(), "wb"))),  # noqa: SIM115
    lambda: zipfile.ZipFile(io.BytesIO(), "w").open("events.jsonl", "w"),  # noqa: SIM115
], ids=["buffered-bz2", "text-over-buffered-lzma", "zip-member"])
def test_a_holding_compressor_under_other_layers_is_refused_too(layers):
    """Only the outermost layer was looked at (review of the bz2/lzma refusal)."""
    with pytest.raises(FollowError, match="keeps what it is given until it is closed"):
        JSONLSink(layers())


@pytest.mark.parametrize("under", ["unbuffered", "non-blocking"])
def test_gzip_over_a_file_that_drops_short_writes_is_refused(tmp_path, under):
    """gzip ignores a short write of the file under it: over a non-blocking pipe
    with a slow reader the cursor was saved past events that never left (only
    the 10-byte header reached the pipe)."""
    read_end, write_end = os.pipe()
    try:
        if under == "non-blocking":
            os.set_blocking(write_end, False)
            file = os.fdopen(write_end, "wb")
        else:
            file = open(write_end, "wb", buffering=0)  # noqa: SIM115 - closed below
        with pytest.raises(FollowError, match="drops what a short write leaves"):
            JSONLSink(gzip.GzipFile(fileobj=file, mode="wb"))
        file.close()
    finally:
        os.close(read_end)


def test_a_gzip_stream_over_a_pipe_with_a_stop_writes_through_the_compressor():
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as reader, os.fdopen(write_end, "wb") as pipe:
        with gzip.GzipFile(fileobj=pipe, mode="wb") as packed:
            JSONLSink(packed, stop=threading.Event()).handle_page(EVENTS)
        pipe.close()
        data = reader.read()
    assert gzip.decompress(data) == b"".join(jsonl_record(e) for e in EVENTS)


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_text_stream_over_gzip_over_a_pipe_writes_through_the_compressor(encoding):
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as reader, os.fdopen(write_end, "wb") as pipe:
        with gzip.GzipFile(fileobj=pipe, mode="wb") as packed:
            text = io.TextIOWrapper(packed, encoding=encoding)
            JSONLSink(text, stop=threading.Event()).handle_page(EVENTS)
            text.flush()
            text.detach()
        pipe.close()
        data = reader.read()
    assert gzip.decompress(data) == b"".join(jsonl_record(e) for e in EVENTS)


@pytest.mark.parametrize("per_event", [False, True], ids=["page", "per event"])
def test_appending_to_a_gzip_export_mends_nothing_and_adds_no_blank_line(tmp_path, per_event):
    path = tmp_path / "events.jsonl.gz"
    earlier = jsonl_record(EVENTS[0])
    with gzip.open(path, "wb") as packed:
        packed.write(earlier)
    notes: list[str] = []
    with gzip.open(path, "ab") as packed:
        sink = JSONLSink(packed, on_mend=notes.append)
        if per_event:
            sink(EVENTS[1])
            sink.flush()
        else:
            sink.handle_page(EVENTS[1:])
    assert notes == []
    assert gzip.decompress(path.read_bytes()) == earlier + jsonl_record(EVENTS[1])


def test_a_live_jsonl_trace_into_gzip_over_a_non_blocking_pipe_is_compressed():
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with os.fdopen(read_end, "rb") as reader, os.fdopen(write_end, "wb") as pipe:
        with gzip.GzipFile(fileobj=pipe, mode="wb") as packed:
            observe, failure = jsonl_with_err(packed)
            for event in EVENTS:
                observe(event)
            assert failure() is None
        pipe.close()
        data = reader.read()
    assert gzip.decompress(data) == b"".join(jsonl_record(e) for e in EVENTS)


_TLS = os.path.join(os.path.dirname(__file__), "tls")


def _bytes_on_the_wire(use) -> bytes:
    """What a TLS server on 127.0.0.1 receives on its TCP socket, undecrypted,
    after the handshake, when ``use`` writes to a client TLS socket."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(os.path.join(_TLS, "server.pem"),
                               os.path.join(_TLS, "server.key"))
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(os.path.join(_TLS, "ca.pem"))
    wire: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                wire.append(socket.socket.recv(tls, 65536))  # the TCP bytes, as sent
        server = threading.Thread(target=serve)
        server.start()
        raw = socket.create_connection(listener.getsockname())
        with client_ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            use(tls)
            server.join(10)
    return wire[0]


def _observe(tls) -> None:
    observe, err = jsonl_with_err(tls.makefile("wb"))
    observe(EVENTS[0])
    assert err() is None


def _sink_with_a_timeout(tls) -> None:
    tls.settimeout(10)  # which makes the descriptor non-blocking
    JSONLSink(tls.makefile("wb")).handle_page(EVENTS[:1])


@pytest.mark.parametrize("use", [_observe, _sink_with_a_timeout], ids=["observer", "sink"])
def test_records_written_to_a_tls_socket_go_through_tls(use):
    """A TLS socket's file answers fileno() with the TCP socket's: records were
    written there directly, in clear text, and the peer saw a TLS error."""
    wire = _bytes_on_the_wire(use)
    assert wire[:1] == b"\x17"  # a TLS application-data record
    assert b"run.created" not in wire and b'"seq"' not in wire
