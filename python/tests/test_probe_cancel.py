"""Segment.probe and Batch.cancel against a real peer process (alive,
stopped with SIGSTOP, killed)."""

import os
import signal
import time

import pytest

import ferry
from conftest import Peer


def stop(pid: int) -> None:
    """SIGSTOP pid and wait until it is stopped (the signal is delivered
    asynchronously: a probe sent at once may still be answered)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rpartition(")")[2].split()[0] in ("T", "t"):
                return
        time.sleep(0.001)
    raise RuntimeError(f"process {pid} did not stop")


def test_probe_alive_peer_returns_none(engine, peer):
    segment = engine.open(peer.name)
    assert segment.probe(timeout=5) is None
    assert segment.probe() is None  # FERRY_RPC_TIMEOUT


def test_probe_stopped_peer_times_out(engine, peer):
    segment = engine.open(peer.name)
    stop(peer.process.pid)
    try:
        started = time.monotonic()
        with pytest.raises(ferry.TransferTimeout) as raised:
            segment.probe(timeout=0.3)
        assert time.monotonic() - started < 10  # bounded: at most ~3x the timeout
        assert raised.value.status == ferry.Status.ERR_TIMEOUT
        assert isinstance(raised.value, TimeoutError)
    finally:
        os.kill(peer.process.pid, signal.SIGCONT)
    assert segment.probe(timeout=5) is None  # alive again


def test_probe_killed_peer_raises_peer_error(engine, peer):
    segment = engine.open(peer.name)
    peer.kill()
    with pytest.raises(ferry.PeerError) as raised:
        segment.probe(timeout=2)
    assert raised.value.status in (ferry.Status.ERR_CONNECT, ferry.Status.ERR_PEER_FAILED)


def test_probe_bad_timeout_and_closed_segment(engine, peer):
    segment = engine.open(peer.name)
    for bad in (0, -1, float("nan")):
        with pytest.raises(ferry.ArgumentError):
            segment.probe(timeout=bad)
    with pytest.raises(TypeError):
        segment.probe(timeout="1")
    segment.close()
    with pytest.raises(ferry.ClosedError):
        segment.probe()


def test_cancel_idle_batch_is_a_no_op_and_closed_batch_raises(engine):
    batch = engine.batch()
    assert batch.cancel() is None
    batch.close()
    with pytest.raises(ferry.ClosedError):
        batch.cancel()


def test_cancel_writes_queued_behind_a_stopped_peer():
    """tcp slices not yet on the socket end CANCELLED; the rest complete once
    the peer runs again.  Each request ends CANCELLED or COMPLETED."""
    block, count = 1 << 20, 32
    peer = Peer(block * count)
    try:
        with ferry.Engine(rpc_address="127.0.0.1") as engine:
            segment = engine.open(peer.name)
            src = engine.alloc(block * count)
            src[:] = 5
            batch = engine.batch(count)
            # the tcp connection first (its HELLO needs a running peer)
            engine.transfer(ferry.Request(ferry.WRITE, src, segment, peer.addr, 64,
                                          transport="tcp"), timeout=30)
            stop(peer.process.pid)
            try:
                batch.submit([(ferry.WRITE, src, segment, peer.addr + i * block, block,
                               i * block, "tcp") for i in range(count)])
                batch.cancel()
            finally:
                os.kill(peer.process.pid, signal.SIGCONT)
            try:
                batch.wait(timeout=60)
                outcome = None
            except ferry.PeerError as error:
                outcome = error
            states = [status.state for status in batch.statuses()]
            assert set(states) <= {ferry.State.CANCELLED, ferry.State.COMPLETED}
            assert ferry.State.CANCELLED in states
            assert outcome is not None and outcome.status == ferry.Status.ERR_CANCELED
            for status in batch.statuses():
                if status.state == ferry.State.CANCELLED:
                    assert status.error == ferry.Status.ERR_CANCELED
            batch.close()
    finally:
        peer.close()
