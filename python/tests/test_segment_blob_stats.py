"""Engine.export_blob / open_blob between two processes (the blob passes
through the peer's stdout pipe) and Engine.stats / stats_reset."""

import pytest

import ferry


def peer_blob(peer) -> bytes:
    return bytes.fromhex(peer.ask("blob"))


def test_blob_from_a_pipe_opens_the_peers_segment(peer):
    blob = peer_blob(peer)
    assert blob[:6] == b"FERRYB"
    # a store that cannot answer: only the blob can find the peer
    with ferry.Engine(rpc_address="127.0.0.1", metadata="http://127.0.0.1:9/metadata") as engine:
        with pytest.raises(ferry.Error):
            engine.open(peer.name)
        segment = engine.open_blob(blob)
        assert segment.name == peer.name
        assert [b.addr for b in segment.buffers] == [peer.addr]
        engine.transfer(ferry.Request(ferry.WRITE, b"\x07" * 4096, segment, peer.addr),
                        timeout=30)
        assert int(peer.ask("sum")) == 7 * 4096
        assert segment.probe(timeout=5) is None


def test_peer_opens_this_engines_blob(engine, peer):
    target = engine.alloc(4096)
    target[:] = 0
    blob = engine.export_blob()
    answer = peer.ask(f"write {engine.segment_name} {target.ctypes.data} 4096 3 blob "
                      f"{blob.hex()}")
    assert answer == "ok"
    assert int(target.sum()) == 3 * 4096


def test_corrupted_or_cut_blob_raises_decode_error(engine, peer):
    blob = bytearray(peer_blob(peer))
    for bad in (bytes(blob[: len(blob) // 2]), bytes(blob) + b"x", b"not a blob at all",
                bytes(blob[:-1]) + bytes([blob[-1] ^ 0xFF])):
        with pytest.raises(ferry.MetadataError) as raised:
            engine.open_blob(bad)
        assert raised.value.status == ferry.Status.ERR_DECODE
    with pytest.raises(TypeError):
        engine.open_blob("a str is not a blob")


def test_export_blob_grows_with_registrations(engine):
    before = engine.export_blob()
    memory = engine.alloc(8192)
    after = engine.export_blob()
    assert isinstance(after, bytes) and len(after) > len(before)
    del memory


def test_stats_by_transport_and_peer(engine, peer):
    segment = engine.open(peer.name)
    engine.stats_reset()
    src = engine.alloc(1 << 16)
    for _ in range(4):
        engine.transfer(ferry.Request(ferry.WRITE, src, segment, peer.addr, transport="tcp"),
                        timeout=30)
    by_transport = {s.name: s for s in engine.stats()}
    assert "local" in by_transport and "tcp" in by_transport
    tcp = by_transport["tcp"]
    assert isinstance(tcp, ferry.Stats)
    assert tcp.requests == 4 and tcp.failures == 0 and tcp.bytes == 4 << 16
    assert len(tcp.latency) == ferry._core.STATS_BUCKETS and sum(tcp.latency) == 4
    assert 0 < tcp.latency_ns(0.5) <= tcp.latency_ns(0.99) <= tcp.latency_ns(1)
    peers = {s.name: s for s in engine.stats(by="peer")}
    assert peers[peer.name].requests == 4
    engine.stats_reset()
    assert all(s.requests == 0 and s.latency_ns(0.5) == 0 for s in engine.stats())
    assert peer.name in {s.name for s in engine.stats(by="peer")}  # stays listed
    with pytest.raises(ferry.ArgumentError):
        engine.stats(by="host")
    with pytest.raises(ferry.ArgumentError):
        tcp.latency_ns(1.5)


def test_new_calls_on_a_closed_engine_raise():
    engine = ferry.Engine(rpc_address="127.0.0.1")
    engine.close()
    for call in (engine.export_blob, engine.stats, engine.stats_reset,
                 lambda: engine.open_blob(b"FERRYB"), lambda: engine.register_storage("/tmp")):
        with pytest.raises(ferry.ClosedError):
            call()
