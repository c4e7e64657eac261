"""Registration of buffers, tensors and device interfaces; alloc."""

import ctypes

import numpy as np
import pytest

import ferry


def test_register_buffer_protocol_objects(engine):
    for obj in (bytearray(4096), np.zeros((16, 16), np.float32), memoryview(bytearray(100))):
        memory = engine.register(obj)
        assert memory.nbytes == memoryview(obj).nbytes
        assert memory.location == "cpu" and not memory.is_device
        memory.close()
        assert memory.closed


def test_register_appears_in_own_segment(engine):
    array = np.zeros(1 << 16, np.uint8)
    memory = engine.register(array)
    buffers = engine.open(engine.segment_name).buffers
    assert (memory.addr, array.nbytes) in [(b.addr, b.length) for b in buffers]


def test_read_only_buffers_only_for_remote_read(engine):
    with pytest.raises(ferry.ArgumentError, match="read-only"):
        engine.register(b"constant bytes")
    memory = engine.register(b"constant bytes", flags=ferry.REMOTE_READ)
    assert memory.flags == ferry.REMOTE_READ


def test_bad_registrations_raise(engine):
    with pytest.raises(ferry.ArgumentError, match="contiguous"):
        engine.register(np.zeros((8, 8))[:, ::2])
    with pytest.raises(TypeError):
        engine.register(42)
    with pytest.raises(ferry.ArgumentError):
        engine.register(bytearray(0))
    with pytest.raises(ferry.ArgumentError):
        engine.register(bytearray(8), flags=1 << 10)
    with pytest.raises(ferry.ArgumentError):
        engine.register(bytearray(8), location="no such kind!")
    array = np.zeros(4096, np.uint8)
    memory = engine.register(array)  # lasts as long as the Memory
    with pytest.raises(ferry.ArgumentError) as raised:  # partial overlap
        engine.register(array[100:200])
    assert raised.value.status == ferry.Status.ERR_OVERLAP
    del memory
    engine.register(array[100:200]).close()  # collected: unregistered


def test_bytearray_under_registration_cannot_be_resized(engine):
    data = bytearray(64)
    memory = engine.register(data)
    with pytest.raises(BufferError):
        data.extend(b"more")
    memory.close()
    data.extend(b"more")


def test_alloc_returns_usable_arrays(engine):
    array = engine.alloc(1 << 20)
    assert isinstance(array, np.ndarray) and array.nbytes == 1 << 20
    array[:] = 0xAB
    assert int(array[12345]) == 0xAB
    floats = engine.alloc(4096, dtype=np.float32)
    assert floats.dtype == np.float32 and floats.size == 1024
    memory = engine.alloc_memory(4096)
    view = memoryview(memory)
    with pytest.raises(ferry.BusyError):
        memory.close()
    view.release()
    memory.close()
    with pytest.raises(ferry.ArgumentError):
        engine.alloc(0)


def test_torch_cpu_tensor_through_dlpack(engine):
    torch = pytest.importorskip("torch")
    tensor = torch.arange(1024, dtype=torch.float32)
    memory = engine.register(tensor)
    assert memory.nbytes == 4096 and memory.location == "cpu"
    assert memory.addr == tensor.data_ptr()
    target = torch.zeros(1024, dtype=torch.float32)
    target_memory = engine.register(target)
    segment = engine.open(engine.segment_name)
    engine.transfer(ferry.Request(ferry.WRITE, memory, segment, target_memory.addr), timeout=30)
    assert torch.equal(target, tensor)
    with pytest.raises(ValueError, match="contiguous"):
        engine.register(torch.zeros(8, 8).t())
    memory.close()
    target_memory.close()


class FakeCudaArray:
    """__cuda_array_interface__ over host memory: the device path's parsing runs,
    and the engine, asked to detect the location ("*"), finds host memory."""

    def __init__(self, array, strides=None, readonly=False):
        self.array = array
        self.__cuda_array_interface__ = {
            "data": (array.ctypes.data, readonly), "shape": array.shape,
            "typestr": array.dtype.str, "strides": strides, "version": 3}


def test_cuda_array_interface_path(engine):
    array = np.zeros((64, 32), np.float32)
    memory = engine.register(FakeCudaArray(array))
    assert memory.addr == array.ctypes.data and memory.nbytes == array.nbytes
    assert memory.location == "*"
    memory.close()
    with pytest.raises(ValueError, match="contiguous"):
        engine.register(FakeCudaArray(array, strides=(4, 256)))
    engine.register(FakeCudaArray(array, strides=(128, 4)))  # row-major strides are fine
    with pytest.raises(ferry.ArgumentError, match="read-only"):
        engine.register(FakeCudaArray(np.zeros(8), readonly=True))
    with pytest.raises(ferry.ArgumentError):  # host memory named as a device the engine lacks
        engine.register(FakeCudaArray(np.zeros(8)), location="cuda:0")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]


class FakeDLPack:
    """A DLPack producer for a device this machine lacks (host memory behind it)."""

    deleted = 0

    def __init__(self, device_type, array):
        self.array = array
        self.shape = (ctypes.c_int64 * 1)(array.size)
        self.deleter = _DELETER(self._deleted)
        self.managed = _DLManagedTensor(
            _DLTensor(array.ctypes.data, _DLDevice(device_type, 0), 1, _DLDataType(1, 8, 1),
                      self.shape, None, 0), None, self.deleter)

    def _deleted(self, _):
        FakeDLPack.deleted += 1

    def __dlpack__(self, stream=None):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self.managed), b"dltensor", None)


def test_dlpack_device_path(engine):
    before = FakeDLPack.deleted
    with pytest.raises(ferry.ArgumentError):  # kDLCUDA: no cuda module usable here
        engine.register(FakeDLPack(2, np.zeros(64, np.uint8)))
    with pytest.raises(ferry.ArgumentError, match="device type"):  # kDLOpenCL
        engine.register(FakeDLPack(4, np.zeros(64, np.uint8)))
    memory = engine.register(FakeDLPack(1, np.zeros(64, np.uint8)))  # kDLCPU
    assert memory.location == "cpu"
    memory.close()
    assert FakeDLPack.deleted == before + 3  # every consumed tensor was given back


def test_alloc_without_numpy_returns_a_memoryview(engine, monkeypatch):
    monkeypatch.setattr(ferry, "_np", None)
    view = engine.alloc(4096)
    assert isinstance(view, memoryview) and view.nbytes == 4096 and not view.readonly
    view[:4] = b"abcd"
    assert bytes(view[:4]) == b"abcd"
