"""Engine.register_storage: a file on /tmp that a peer process writes into
with a request; the bytes are checked in the file."""

import os
import tempfile

import pytest

import ferry


@pytest.fixture
def storage_file():
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="ferry-py-storage-") as file:
        file.truncate(1 << 20)
        file.flush()
        yield file.name


def file_bytes(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read(length)


@pytest.mark.parametrize("options", [{}, {"durable": True}, {"direct": False}])
def test_peer_writes_into_a_registered_file(engine, peer, storage_file, options):
    storage = engine.register_storage(storage_file, offset=4096, length=65536, **options)
    assert storage.location == "file" and storage.nbytes == 65536 and storage.is_device
    answer = peer.ask(f"write {engine.segment_name} {storage.addr + 8192} 4096 9")
    assert answer == "ok"
    assert file_bytes(storage_file, 4096 + 8192, 4096) == b"\x09" * 4096
    assert file_bytes(storage_file, 4096, 8192) == bytes(8192)  # nothing else moved
    storage.close()
    assert storage.closed
    with pytest.raises(ferry.ClosedError):
        storage.addr


def test_whole_file_by_default_and_local_reads_of_it(engine, storage_file):
    storage = engine.register_storage(storage_file)
    assert storage.nbytes == 1 << 20
    with open(storage_file, "r+b") as file:
        file.write(b"stored bytes")
    own = engine.open(engine.segment_name)
    back = bytearray(12)
    engine.transfer(ferry.Request(ferry.READ, back, own, storage.addr), timeout=30)
    assert back == b"stored bytes"
    del own


def test_storage_bad_input(engine, storage_file):
    with pytest.raises(ferry.Error):
        engine.register_storage("/tmp/ferry-py-no-such-file")
    with pytest.raises(ferry.ArgumentError):  # past the end of the file
        engine.register_storage(storage_file, offset=0, length=2 << 20)
    with pytest.raises(ferry.ArgumentError):
        engine.register_storage(storage_file, direct=True, shared=False, access=1 << 20)
    with pytest.raises(TypeError):
        engine.register_storage(42)
    storage = engine.register_storage(storage_file, length=4096)
    with pytest.raises(BufferError):
        memoryview(storage)
    own = engine.open(engine.segment_name)
    with pytest.raises(ferry.ArgumentError):  # PROT_NONE: never a local buffer
        ferry.Request(ferry.WRITE, storage, own, storage.addr)
    storage.close()
    own.close()


def test_engine_close_unregisters_storage(storage_file):
    engine = ferry.Engine(rpc_address="127.0.0.1")
    storage = engine.register_storage(os.fsencode(storage_file), length=8192)
    engine.close()
    assert storage.closed
