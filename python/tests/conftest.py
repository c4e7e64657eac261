"""Fixtures: an engine on loopback, and a peer process (peer.py) to move
bytes to and from."""

import json
import os
import subprocess
import sys

import pytest

import ferry

HERE = os.path.dirname(os.path.abspath(__file__))

# The test suite's accelerator (module ferry_testgpu_ipc) reads its device
# count once per process, when the first engine loads it: set it before any
# test makes one, so that test_device_memory.py finds its devices whatever
# ran first.  Other tests never name a testgpu location.
os.environ.setdefault("FERRY_TESTGPU_DEVICES", "1")


@pytest.fixture
def engine():
    with ferry.Engine(rpc_address="127.0.0.1") as engine:
        yield engine


class Peer:
    """peer.py in a second Python process."""

    def __init__(self, size: int = 1 << 20) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "peer.py"), str(size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            self.process.kill()
            raise RuntimeError("the peer process did not start")
        hello = json.loads(line)
        self.name, self.addr, self.length = hello["name"], hello["addr"], hello["length"]

    def ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process.stdout.close()


@pytest.fixture
def peer():
    peer = Peer()
    yield peer
    peer.close()
