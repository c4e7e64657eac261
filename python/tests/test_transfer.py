"""Real transfers between this process and a peer process (peer.py)."""

import asyncio
import time

import numpy as np
import pytest

import ferry


def test_write_numpy_array_to_peer(engine, peer):
    src = np.full(peer.length, 3, dtype=np.uint8)
    segment = engine.open(peer.name)
    batch = engine.batch()
    batch.submit([ferry.Request(ferry.WRITE, src, segment, peer.addr)])
    batch.wait(timeout=30)
    assert int(peer.ask("sum")) == 3 * peer.length
    status = batch.status(0)
    assert status.state == ferry.State.COMPLETED
    assert status.transferred == peer.length and status.error == 0
    assert isinstance(status.transport, str)


def test_read_from_peer_into_bytearray(engine, peer):
    assert peer.ask("fill 9") == "ok"
    dst = bytearray(4096)
    segment = engine.open(peer.name)
    engine.transfer(ferry.Request(ferry.READ, dst, segment, peer.addr + 4096), timeout=30)
    assert dst == bytes([9]) * 4096


def test_many_requests_as_tuples_and_resubmit(engine, peer):
    src = engine.alloc(peer.length)
    src[:] = 1
    segment = engine.open(peer.name)
    block = peer.length // 64
    with engine.batch(64) as batch:
        requests = [(ferry.WRITE, src, segment, peer.addr + i * block, block, i * block)
                    for i in range(64)]
        batch.submit(requests)
        batch.wait(30)
        assert [s.state for s in batch.statuses()] == [ferry.State.COMPLETED] * 64
        assert int(peer.ask("sum")) == peer.length
        src[:] = 2
        batch.submit(requests)  # the same round again
        batch.wait(30)
    assert int(peer.ask("sum")) == 2 * peer.length


def test_notify_after_data_and_alone(engine, peer):
    segment = engine.open(peer.name)
    batch = engine.batch()
    batch.submit(ferry.Request(ferry.WRITE, b"x" * 64, segment, peer.addr))
    batch.notify(segment, b"after the data")
    batch.wait(30)
    engine.notify_send(segment, "alone")
    got = peer.ask("notifies 2 20")
    assert '"after the data"' in got and '"alone"' in got
    assert engine.segment_name in got
    with pytest.raises(ferry.ArgumentError):
        engine.notify_send(segment, b"x" * (ferry.NOTIFY_MAX + 1))


def test_out_of_range_requests_raise(engine, peer):
    segment = engine.open(peer.name)
    batch = engine.batch(4)
    local = bytearray(4096)
    with pytest.raises(ferry.ArgumentError) as raised:  # past the peer's buffer
        batch.submit(ferry.Request(ferry.WRITE, local, segment, peer.addr + peer.length - 16))
    assert raised.value.status == ferry.Status.ERR_OUT_OF_RANGE
    with pytest.raises(ferry.ArgumentError) as raised:  # past the local buffer
        ferry.Request(ferry.WRITE, local, segment, peer.addr, length=8192)
    assert raised.value.status_name == "FERRY_ERR_OUT_OF_RANGE"
    with pytest.raises(ferry.ArgumentError):
        ferry.Request(ferry.WRITE, local, segment, peer.addr, offset=4096)
    with pytest.raises(ferry.ArgumentError) as raised:  # more than the batch holds
        batch.submit([(ferry.WRITE, local, segment, peer.addr)] * 5)
    assert raised.value.status == ferry.Status.ERR_TOO_MANY
    with pytest.raises(ferry.ArgumentError):
        batch.status(0)  # nothing was queued
    # the batch still works
    batch.submit(ferry.Request(ferry.WRITE, local, segment, peer.addr))
    batch.wait(30)


def test_read_into_read_only_buffer_is_refused(engine, peer):
    segment = engine.open(peer.name)
    with pytest.raises(ferry.ArgumentError, match="writable"):
        ferry.Request(ferry.READ, b"\0" * 64, segment, peer.addr)
    frozen = np.zeros(64, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ferry.ArgumentError):
        ferry.Request(ferry.READ, frozen, segment, peer.addr)
    ferry.Request(ferry.WRITE, frozen, segment, peer.addr)  # a source may be read-only


def test_wrong_types_raise_type_error(engine, peer):
    segment = engine.open(peer.name)
    batch = engine.batch()
    with pytest.raises(TypeError):
        batch.submit(42)
    with pytest.raises(TypeError):
        batch.submit(["not a request"])
    with pytest.raises(TypeError):
        ferry.Request(ferry.WRITE, object(), segment, peer.addr)
    with pytest.raises(TypeError):
        ferry.Request(ferry.WRITE, bytearray(8), "segment name", peer.addr)
    with pytest.raises(ferry.ArgumentError):
        ferry.Request(7, bytearray(8), segment, peer.addr)
    with pytest.raises(TypeError):
        engine.open(42)
    with pytest.raises(TypeError):
        ferry.Engine(metadata=3)
    with pytest.raises(ferry.ArgumentError):
        batch.wait(timeout=-1)


def test_segment_of_another_engine_is_refused(engine, peer):
    with ferry.Engine(rpc_address="127.0.0.1") as other:
        segment = other.open(peer.name)
        request = ferry.Request(ferry.WRITE, bytearray(8), segment, peer.addr)
        with pytest.raises(ferry.ArgumentError, match="another engine"):
            engine.batch().submit(request)


def test_unknown_segment_raises(engine):
    with pytest.raises(ferry.Error) as raised:
        engine.open("127.0.0.1:1")
    assert raised.value.status < 0 and "127.0.0.1:1" in str(raised.value)


def test_killed_peer_fails_the_transfer_not_the_process(engine, peer):
    segment = engine.open(peer.name)
    src = bytearray(b"k" * 65536)
    engine.transfer(ferry.Request(ferry.WRITE, src, segment, peer.addr), timeout=30)
    peer.kill()
    start = time.monotonic()
    with pytest.raises(ferry.Error) as raised:
        for _ in range(3):  # the first may still find the dead peer's connection open
            engine.transfer(ferry.Request(ferry.WRITE, src, segment, peer.addr, transport="tcp"),
                            timeout=30)
    assert isinstance(raised.value, (ferry.PeerError, ferry.MetadataError, ferry.ArgumentError))
    assert time.monotonic() - start < 60


def test_asyncio_wait_does_not_block_the_loop(engine, peer):
    segment = engine.open(peer.name)
    src = engine.alloc(peer.length)
    src[:] = 5

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        batches = [engine.batch(), engine.batch()]
        half = peer.length // 2
        for i, batch in enumerate(batches):
            batch.submit(ferry.Request(ferry.WRITE, src, segment, peer.addr + i * half, half,
                                       i * half))
        await asyncio.gather(batches[0], batches[1].wait_async(timeout=30))
        task.cancel()
        return ticks

    assert asyncio.run(main()) > 0
    assert int(peer.ask("sum")) == 5 * peer.length
