"""Ferry's exceptions: one class per family of status codes.

Every exception raised for a Ferry status is an :class:`Error` (or a subclass)
carrying ``status`` (the negative ``ferry_status_t`` value), ``status_name``
(``"FERRY_ERR_TIMEOUT"``) and the message.  The family follows the C header's
grouping of codes, so ``except ferry.PeerError`` catches every failure of the
other side or of the link.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """The values of ``ferry_status_t`` (include/ferry/status.h)."""

    OK = 0
    INPROGRESS = 1
    ERR_INVALID_PARAM = -1
    ERR_INVALID_HANDLE = -2
    ERR_OVERLAP = -3
    ERR_NOT_REGISTERED = -4
    ERR_OUT_OF_RANGE = -5
    ERR_BUSY = -6
    ERR_UNSUPPORTED = -7
    ERR_TOO_MANY = -8
    ERR_NOT_FOUND = -9
    ERR_NO_MEMORY = -20
    ERR_NO_RESOURCE = -21
    ERR_PLUGIN_NOT_FOUND = -22
    ERR_METADATA = -40
    ERR_SEGMENT_NOT_FOUND = -41
    ERR_DECODE = -42
    ERR_STALE = -43
    ERR_TIMEOUT = -60
    ERR_CONNECT = -61
    ERR_PEER_FAILED = -62
    ERR_PROTOCOL = -63
    ERR_REMOTE_REFUSED = -64
    ERR_CANCELED = -65
    ERR_IO = -80


class Error(Exception):
    """A Ferry call failed.

    Attributes:
        status: the ``ferry_status_t`` value (negative), an int.
        status_name: its C name, e.g. ``"FERRY_ERR_SEGMENT_NOT_FOUND"``.
        message: what failed and why, as shown by ``str()``.
    """

    def __init__(self, message: str, status: int = -1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        try:
            self.status_name = "FERRY_" + Status(status).name
        except ValueError:
            self.status_name = f"FERRY_STATUS_{status}"

    def __str__(self) -> str:
        return self.message


class ArgumentError(Error, ValueError):
    """The caller passed something wrong (statuses -1 to -19): a bad value, an
    unknown or closed handle, an overlapping or unregistered range, a range out
    of bounds, an object in use, something unsupported here."""


class ClosedError(ArgumentError):
    """An object was used after ``close()`` (or after its engine closed)."""


class BusyError(ArgumentError):
    """The object is in use: requests in flight, views of its memory alive, or a
    call in progress on another thread (FERRY_ERR_BUSY)."""


class ResourceError(Error):
    """The machine said no (statuses -20 to -39): memory, descriptors, a plugin
    that is not installed."""


class MetadataError(Error):
    """The control plane said no (statuses -40 to -59): the metadata store failed,
    a segment was not found, a descriptor did not decode or is stale."""


class PeerError(Error):
    """The other side or the network failed (statuses -60 to -79): timeout,
    connect, peer failure, protocol error, refused, canceled."""


class TransferTimeout(PeerError, TimeoutError):
    """A wait or a control-plane step ran out of time (FERRY_ERR_TIMEOUT).  It is
    also a builtin :class:`TimeoutError`."""

    def __init__(self, message: str, status: int = -60) -> None:
        PeerError.__init__(self, message, status)


class LocalIOError(Error):
    """A local system call failed (statuses -80 and below)."""


def error_class(status: int) -> type[Error]:
    """The exception class raised for a ``ferry_status_t`` value."""
    if status == Status.ERR_BUSY:
        return BusyError
    if status == Status.ERR_TIMEOUT:
        return TransferTimeout
    if -20 < status < 0:
        return ArgumentError
    if -40 < status <= -20:
        return ResourceError
    if -60 < status <= -40:
        return MetadataError
    if -80 < status <= -60:
        return PeerError
    return LocalIOError


def make_error(status: int, message: str) -> Error:
    """Called by the C extension: the exception for ``status`` with ``message``
    (the status's C name is added to it)."""
    try:
        name = "FERRY_" + Status(status).name
    except ValueError:
        name = f"status {status}"
    return error_class(status)(f"{message} ({name})", status)


def make_closed(message: str) -> Error:
    """Called by the C extension: a :class:`ClosedError`."""
    return ClosedError(message, int(Status.ERR_INVALID_HANDLE))
