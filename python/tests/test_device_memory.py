"""Device memory through the engine, with the test suite's accelerator
"testgpu" (memfd memory the CPU cannot touch at its device address; built
for make check as module ferry_testgpu_ipc): alloc at a device location,
requests from and to it, and the refusal of host access."""

import os

import numpy as np
import pytest

import ferry


@pytest.fixture
def gpu_engine(monkeypatch):
    module_dir = os.environ.get("FERRY_MODULE_DIR", "")
    if not os.path.exists(os.path.join(module_dir, "ferry_testgpu_ipc.so")):
        pytest.skip("the testgpu module is not built here (make check builds it)")
    monkeypatch.setenv("FERRY_TESTGPU_DEVICES", "1")
    with ferry.Engine(rpc_address="127.0.0.1") as engine:
        yield engine


def test_device_alloc_is_a_memory_without_host_access(gpu_engine):
    memory = gpu_engine.alloc(1 << 16, location="testgpu:0")
    assert isinstance(memory, ferry.Memory) and memory.is_device
    assert memory.location == "testgpu:0"
    with pytest.raises(BufferError):
        memoryview(memory)
    with pytest.raises(AttributeError):  # CUDA's interface only for CUDA memory
        memory.__cuda_array_interface__
    memory.close()


def test_host_to_device_to_host_through_requests(gpu_engine):
    device = gpu_engine.alloc_memory(1 << 16, location="testgpu:0")
    host_in = np.arange(1 << 16, dtype=np.uint8)
    host_out = np.zeros(1 << 16, dtype=np.uint8)
    inbox = gpu_engine.register(host_out)
    own = gpu_engine.open(gpu_engine.segment_name)
    # host -> device memory (its segment address), then device -> host
    gpu_engine.transfer(ferry.Request(ferry.WRITE, host_in, own, device.addr), timeout=30)
    gpu_engine.transfer(ferry.Request(ferry.WRITE, device, own, inbox.addr), timeout=30)
    assert np.array_equal(host_in, host_out)
    device_buffers = [b for b in own.buffers if b.addr == device.addr]
    assert device_buffers and device_buffers[0].location == "testgpu:0"
