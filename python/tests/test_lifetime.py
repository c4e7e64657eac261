"""Closing and collecting: safe order, closed objects raise, no crash."""

import gc
import socket
import threading
import time

import numpy as np
import pytest

import ferry


def test_closed_objects_raise_closed_error():
    engine = ferry.Engine(rpc_address="127.0.0.1")
    memory = engine.register(bytearray(64))
    segment = engine.open(engine.segment_name)
    batch = engine.batch()
    engine.close()
    engine.close()  # twice is fine
    assert engine.closed and memory.closed and segment.closed and batch.closed
    for call in (lambda: engine.alloc(8), lambda: engine.open("x"), lambda: engine.batch(),
                 lambda: engine.segment_name, lambda: batch.wait(),
                 lambda: batch.submit(ferry.Request(ferry.WRITE, bytearray(8), segment, 0)),
                 lambda: segment.describe(), lambda: memory.addr, lambda: engine.notify_recv()):
        with pytest.raises(ferry.ClosedError):
            call()
    with pytest.raises(ferry.ClosedError):
        ferry.Request(ferry.WRITE, memory, segment, 0)
    memory.close()
    segment.close()
    batch.close()


def test_each_object_closes_alone():
    with ferry.Engine(rpc_address="127.0.0.1") as engine:
        segment = engine.open(engine.segment_name)
        batch = engine.batch()
        segment.close()
        batch.close()
        with pytest.raises(ferry.ClosedError):
            batch.submit([])
        with pytest.raises(ferry.ClosedError):
            segment.buffers
        assert not engine.closed


def test_arrays_from_alloc_outlive_the_engine():
    with ferry.Engine(rpc_address="127.0.0.1") as engine:
        array = engine.alloc(1 << 16)
        plain = engine.alloc(4096)
        del plain
    array[:] = 1  # still valid memory
    assert int(array.sum()) == 1 << 16
    del array
    gc.collect()


def test_requests_keep_their_memory():
    engine = ferry.Engine(rpc_address="127.0.0.1")
    memory = engine.alloc_memory(4096)
    segment = engine.open(engine.segment_name)
    request = ferry.Request(ferry.WRITE, memory, segment, memory.addr)
    with pytest.raises(ferry.BusyError):
        memory.close()
    engine.close()
    with pytest.raises(ferry.ClosedError):
        engine.batch()
    del request, memory, segment
    gc.collect()


def test_collection_in_any_order_does_not_crash():
    for order in range(4):
        engine = ferry.Engine(rpc_address="127.0.0.1")
        array = engine.alloc(1 << 20)
        segment = engine.open(engine.segment_name)
        batch = engine.batch()
        batch.submit(ferry.Request(ferry.WRITE, array, segment, array.ctypes.data))
        objects = [engine, array, segment, batch]  # batch collected with a request in flight
        victim = objects.pop(order)
        del victim
        objects.clear()
        del engine, array, segment, batch
        gc.collect()


def test_close_during_a_blocking_call_on_another_thread_is_refused():
    # a "peer" that accepts the RPC connection and never answers: open()
    # blocks (GIL released) for the RPC timeout
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    engine = ferry.Engine(rpc_address="127.0.0.1", settings={"FERRY_RPC_TIMEOUT": "3000ms"})
    batch = engine.batch()
    outcome = []

    def open_silent_peer():
        try:
            engine.open(f"127.0.0.1:{port}")
        except ferry.Error as error:
            outcome.append(error)

    thread = threading.Thread(target=open_silent_peer)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()
    with pytest.raises(ferry.BusyError):
        engine.close()
    thread.join(60)
    assert outcome and isinstance(outcome[0], ferry.Error)
    engine.close()
    assert batch.closed
    listener.close()


def test_help_reads_well():
    text = ferry.__doc__
    assert "Engine" in text and "lifetimes" in text.lower()
    for obj in (ferry.Engine, ferry.Engine.register, ferry.Engine.alloc, ferry.Batch.submit,
                ferry.Batch.wait, ferry.Request, ferry.Memory.close, ferry.Segment.buffers,
                ferry.Error):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj


def test_settings_and_info():
    settings = {s.name: s for s in ferry.settings()}
    assert "FERRY_METADATA" in settings and settings["FERRY_METADATA"].doc
    assert "FERRY_LOG_LEVEL" in ferry.info(ferry._core.INFO_SETTINGS)
    assert ferry.version()
    assert ferry.status_string(-41)
    with pytest.raises(ferry.ArgumentError):
        ferry.Engine(settings={"NOT_FERRY": "1"})
    with ferry.Engine(rpc_address="127.0.0.1",
                      settings={"FERRY_RPC_TIMEOUT": "1500ms"}) as engine:
        assert engine.segment_name
    assert {s.name: s for s in ferry.settings()}["FERRY_RPC_TIMEOUT"].value == "1500ms"


def test_error_classes_follow_status_families():
    assert ferry.error_class(-1) is ferry.ArgumentError
    assert ferry.error_class(-6) is ferry.BusyError
    assert ferry.error_class(-20) is ferry.ResourceError
    assert ferry.error_class(-41) is ferry.MetadataError
    assert ferry.error_class(-61) is ferry.PeerError
    assert ferry.error_class(-60) is ferry.TransferTimeout
    assert issubclass(ferry.TransferTimeout, TimeoutError)
    assert ferry.error_class(-80) is ferry.LocalIOError
    assert issubclass(ferry.ArgumentError, ValueError)


def test_threads_transfer_at_once_on_one_engine():
    with ferry.Engine(rpc_address="127.0.0.1") as engine:
        target = engine.alloc(1 << 16)
        target[:] = 0
        own = engine.open(engine.segment_name)
        errors = []

        def writer(index):
            try:
                source = np.full(4096, index + 1, np.uint8)
                request = ferry.Request(ferry.WRITE, source, own,
                                        target.ctypes.data + index * 4096)
                with engine.batch(1) as batch:
                    for _ in range(200):
                        batch.submit(request)
                        batch.wait(30)
            except Exception as error:  # reported below, in the test's thread
                errors.append(error)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors
        for i in range(8):
            assert (target[i * 4096:(i + 1) * 4096] == i + 1).all()
