"""Ferry: a transfer engine for HPC and AI clusters, from Python.

A process registers memory; its :class:`Engine` publishes that memory as a
*segment* through a metadata store; any other engine opens the segment by name
and moves bytes with "READ/WRITE n bytes at address a of segment s", in
batches.  Example, the writer side::

    import ferry
    with ferry.Engine() as engine:           # settings from FERRY_* variables
        src = engine.alloc(1 << 20)          # numpy array (memoryview without numpy)
        peer = engine.open("10.0.0.7:41234") # p2p: the peer's RPC host:port
        dst = peer.buffers[0].addr           # an address in the peer's segment
        batch = engine.batch()
        batch.submit([ferry.Request(ferry.WRITE, src, peer, dst)])
        batch.wait()                         # or: await batch (asyncio)

Objects and lifetimes: :class:`Engine` hands out :class:`Memory` (register,
alloc), :class:`Segment` (open) and :class:`Batch` (batch); each holds its
engine.  ``Engine.close()`` (or the end of its ``with``) closes its batches
(waiting for requests in flight), segments and registrations, then the
engine; memory that an array or a :class:`Request` still uses stays valid
until they are gone.  Any use of a closed object raises :class:`ClosedError`.
Errors are :class:`Error` subclasses carrying Ferry's status code.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence, Union

from . import _core
from ._core import (DEFER_PUBLISH, NOTIFY_MAX, REMOTE, REMOTE_READ, REMOTE_WRITE,
                    STORAGE_BUFFERED, STORAGE_DIRECT, STORAGE_DURABLE, STORAGE_SHARED, Memory,
                    Request, TransferStatus)
from ._errors import (ArgumentError, BusyError, ClosedError, Error, LocalIOError, MetadataError,
                      PeerError, ResourceError, Status, TransferTimeout, error_class)

__all__ = [
    "Engine", "Memory", "Segment", "Batch", "Request", "TransferStatus", "Buffer", "Setting",
    "Op", "State", "Status", "Stats", "STORAGE_BUFFERED", "STORAGE_DIRECT", "STORAGE_DURABLE",
    "STORAGE_SHARED", "READ", "WRITE", "REMOTE_READ", "REMOTE_WRITE", "REMOTE",
    "DEFER_PUBLISH", "NOTIFY_MAX", "Error", "ArgumentError", "ClosedError", "BusyError",
    "ResourceError", "MetadataError", "PeerError", "TransferTimeout", "LocalIOError",
    "error_class", "settings", "info", "version", "status_string",
]

try:  # alloc() returns numpy arrays where numpy is installed
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None


class Op(enum.IntEnum):
    """A request's direction."""

    READ = _core.READ    #: remote segment -> local buffer
    WRITE = _core.WRITE  #: local buffer -> remote segment


READ = Op.READ
WRITE = Op.WRITE


class State(enum.IntEnum):
    """A request's state (``TransferStatus.state``)."""

    WAITING = 0    #: never submitted
    PENDING = 1
    COMPLETED = 2
    FAILED = 3
    CANCELLED = 4  #: Batch.cancel stopped it (error ERR_CANCELED); none of its bytes land later


class Buffer(NamedTuple):
    """One buffer of a segment's descriptor (``Segment.buffers``)."""

    addr: int       #: the address requests name (``Request(..., remote=addr)``)
    length: int
    location: str   #: "cpu", "cuda:0", ...
    access: str     #: "r", "w" or "rw": what peers may do


class Setting(NamedTuple):
    """One of the library's settings (``ferry.settings()``)."""

    name: str                 #: the FERRY_* variable
    value: str                #: its value in this process (the default when unset)
    default: str
    doc: str
    is_set: bool              #: set in the environment


class Stats(NamedTuple):
    """One entry of :meth:`Engine.stats`: a transport's or a peer's counters since
    the engine started or the last ``stats_reset()``."""

    name: str        #: the transport ("local" for copies to this engine) or the peer's segment
    requests: int    #: finished: completed + failed (cancelled ones count as failed)
    failures: int    #: of which failed
    bytes: int       #: moved by the completed ones
    latency: tuple   #: latency[i]: requests that took [2**i, 2**(i+1)) ns (STATS_BUCKETS)

    def latency_ns(self, q: float = 0.5) -> int:
        """The latency (ns) under which a fraction q (0..1) of the requests
        finished: the upper edge of the bucket holding that one; 0 when none
        was counted (``ferry_stats_latency_ns``)."""
        return _core.stats_latency_ns(self.latency, float(q))


def version() -> str:
    """The library's version string."""
    return _core.version()


def status_string(status: int) -> str:
    """Ferry's short text for a ``ferry_status_t`` value."""
    return _core.status_string(int(status))


def info(what: int = _core.INFO_VERSION | _core.INFO_PLUGINS) -> str:
    """What ``ferry_info`` prints: version, plugins, settings, devices, counters
    (``ferry._core.INFO_*`` bits)."""
    return _core.info(what)


def settings() -> list[Setting]:
    """Every setting of the library with its value here, default and meaning
    (``ferry_info -c``).  Settings are FERRY_* environment variables, read when
    an engine is created; ``Engine(settings={...})`` sets them first."""
    result = []
    doc = ""
    for line in _core.info(_core.INFO_SETTINGS).splitlines():
        if line.startswith("# ----") or not line.strip():
            continue
        if line.startswith("# "):
            doc = line[2:]
            continue
        name, _, rest = line.partition("=")
        value, marker, default = rest.partition("   # default: ")
        result.append(Setting(name, value, default if marker else value, doc, bool(marker)
                              or name in os.environ))
    return result


class Segment(_core.Segment):
    """A segment opened by name (``Engine.open``): the target of requests.

    ``buffers`` lists what its owner registered, with the addresses requests
    name; ``describe()`` gives the whole decoded descriptor."""

    __slots__ = ()

    def describe(self) -> dict[str, Any]:
        """The decoded descriptor (name, generation, host, transports, buffers)."""
        return json.loads(self.describe_json())

    @property
    def buffers(self) -> list[Buffer]:
        """The segment's buffers (fetched from its descriptor each time)."""
        return [Buffer(int(b["addr"], 0), int(b["length"], 0), b.get("location", "cpu"),
                       b.get("access", "rw")) for b in self.describe()["buffers"]]


class Batch(_core.Batch):
    """Requests submitted and waited together (``Engine.batch``).

    ``submit`` queues requests, ``wait`` blocks (GIL released) until all
    finished, ``status(i)`` tells one request's state.  For asyncio,
    ``await batch`` (or ``await batch.wait_async(timeout)``) waits on a worker
    thread, so the event loop goes on."""

    async def wait_async(self, timeout: Optional[float] = None) -> None:
        """``wait(timeout)`` without blocking the event loop."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.wait, timeout)

    def __await__(self):
        return self.wait_async().__await__()

    def statuses(self) -> list[TransferStatus]:
        """The status of every request of the round."""
        result = []
        while True:
            try:
                result.append(self.status(len(result)))
            except ArgumentError:
                return result


class Engine(_core.Engine):
    """A Ferry engine (use it as a context manager, or call close()).

    Args:
        name: the segment name peers open (FERRY_SEGMENT_NAME; p2p default: the
            RPC host:port; in an MPI job with the pmix store: ``rank:N``).
        metadata: the metadata store: "p2p", "pmix", "etcd://h:p",
            "redis://h:p", "http://h:p/metadata" (FERRY_METADATA).
        rpc_address: the RPC listen address "host[:port]" (FERRY_RPC_ADDRESS).
        transports: "tcp,shm" or "^ucx" (FERRY_TRANSPORTS).
        module_dir: where plugins are (FERRY_MODULE_DIR).
        host_id: host identity override (FERRY_HOST_ID).
        settings: other FERRY_* variables (``{"FERRY_LOG_LEVEL": "info"}``),
            set in this process's environment before the engine is made (the
            library reads its settings from there; they stay set).

    Each argument left None comes from its variable or default.
    """

    def __init__(self, *, name: Optional[str] = None, metadata: Optional[str] = None,
                 rpc_address: Optional[str] = None, transports: Optional[str] = None,
                 module_dir: Optional[str] = None, host_id: Optional[str] = None,
                 settings: Optional[Mapping[str, str]] = None) -> None:
        for key, value in (settings or {}).items():
            if not key.startswith("FERRY_"):
                raise ArgumentError(f"settings: {key!r} is not a FERRY_* variable",
                                    int(Status.ERR_INVALID_PARAM))
            os.environ[key] = str(value)
        super().__init__(name=name, metadata=metadata, rpc_address=rpc_address,
                         transports=transports, module_dir=module_dir, host_id=host_id)

    def register(self, obj: Any, location: Optional[str] = None, flags: int = 0) -> Memory:
        """Register obj's memory and publish it (unless flags has DEFER_PUBLISH).

        obj: anything with the buffer protocol (bytearray, numpy array,
        memoryview; contiguous), or device memory through
        ``__cuda_array_interface__`` (CuPy, numba) or ``__dlpack__`` (torch
        tensors, CPU or GPU).  flags: REMOTE_READ | REMOTE_WRITE (0 means
        both); a read-only buffer needs flags=REMOTE_READ.  location: None
        detects it ("cpu", or the device of a DLPack/CUDA tensor).

        Keep the returned Memory: the registration lasts as long as it does.
        It keeps obj alive (a bytearray cannot be resized meanwhile);
        close(), or its collection, unregisters.
        """
        return Memory._register(self, obj, location, flags)

    def alloc_memory(self, nbytes: int, location: str = "cpu", flags: int = 0) -> Memory:
        """Allocate and register nbytes that peers reach best (ferry_alloc):
        the Memory itself (device memory: its ``__cuda_array_interface__``)."""
        return Memory._alloc(self, nbytes, location, flags)

    def alloc(self, nbytes: int, location: str = "cpu", flags: int = 0,
              dtype: Any = None) -> Any:
        """Allocate and register nbytes (ferry_alloc) and return it usable:
        a numpy array of dtype (default uint8) where numpy is installed, else a
        memoryview; device memory comes back as its :class:`Memory`.  The
        memory is freed when the array and every view and Request on it are
        gone (or at the engine's close, if none is left)."""
        memory = Memory._alloc(self, nbytes, location, flags)
        if memory.is_device:
            return memory
        if _np is not None:
            return _np.frombuffer(memory, dtype=_np.uint8 if dtype is None else dtype)
        return memoryview(memory)

    def register_storage(self, path: Union[str, bytes, os.PathLike], offset: int = 0,
                         length: Optional[int] = None, access: int = 0,
                         direct: Optional[bool] = None, durable: bool = False,
                         shared: bool = False) -> Memory:
        """Register a range of a file or block device as a storage buffer that
        peers READ and WRITE like memory (ferry_register_storage).

        path: a regular file or block device; offset, length: the range (None:
        to the end; it must lie inside the file).  access: REMOTE_READ |
        REMOTE_WRITE (0 means both; DEFER_PUBLISH as for register).  direct:
        True only O_DIRECT (unaligned I/O fails), False never (page cache),
        None the engine's choice.  durable: a WRITE completes once on stable
        storage.  shared: other hosts attach it too (NVMe-oF).

        Returns a :class:`Memory` whose ``addr`` peers name in requests (a
        reserved address range, not memory: no buffer, no local buffer of a
        request).  Keep it: close() or its collection unregisters.
        """
        options = ((STORAGE_DIRECT if direct else 0) | (STORAGE_BUFFERED if direct is False else 0)
                   | (STORAGE_DURABLE if durable else 0) | (STORAGE_SHARED if shared else 0))
        return Memory._register_storage(self, os.fspath(path), int(offset),
                                        None if length is None else int(length), int(access),
                                        options)

    def open_blob(self, blob: Union[bytes, bytearray, memoryview]) -> Segment:
        """Open the segment a peer's :meth:`export_blob` describes, without the
        metadata store.  A cut or corrupted blob raises MetadataError
        (FERRY_ERR_DECODE).  The segment refreshes from its owner over RPC."""
        return Segment._open_blob(self, blob)

    def stats(self, by: str = "transport") -> list[Stats]:
        """Statistics of the requests this engine finished, one :class:`Stats`
        per transport (``by="transport"``, "local" first) or per peer segment
        ever opened (``by="peer"``)."""
        kinds = {"transport": _core.STATS_BY_TRANSPORT, "peer": _core.STATS_BY_PEER}
        if by not in kinds:
            raise ArgumentError(f"stats(by={by!r}): 'transport' or 'peer'",
                                int(Status.ERR_INVALID_PARAM))
        return [Stats(*entry) for entry in self._stats(kinds[by])]

    def open(self, name: str) -> Segment:
        """Open a segment by name (p2p: "host:port"; pmix: "rank:N").  Blocks
        (GIL released) while its descriptor is fetched."""
        return Segment(self, name)

    def batch(self, max_requests: int = 128) -> Batch:
        """A batch for up to max_requests requests in flight."""
        return Batch(self, max_requests)

    def transfer(self, requests: Union[Request, Sequence[Any]],
                 timeout: Optional[float] = None) -> None:
        """Submit requests on a new batch and wait for them (a one-off; loops
        keep a Batch and Requests and submit them again)."""
        count = 1 if isinstance(requests, Request) else len(requests)
        with self.batch(max(count, 1)) as batch:
            batch.submit(requests)
            batch.wait(timeout)
