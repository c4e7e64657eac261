"""A second process for the transfer tests: an engine with one buffer.

It prints one JSON line (its segment name, the buffer's address and length),
then answers commands read from stdin, one per line:
  sum          -> the sum of the buffer's bytes
  fill B       -> sets every byte to B, answers "ok"
  notifies N T -> waits up to T seconds for N notifies, answers them as JSON
  blob         -> Engine.export_blob() as hex
  write S A N B [blob HEX] -> writes N bytes of value B to address A of segment S
                  (opened by name, or from the blob), answers "ok" or the
                  exception's class and message
Closing stdin ends it.
"""

import json
import sys
import time

import ferry


def write(engine, segments, buffer, words) -> str:
    """The "write" command: a request from this process to a segment it opens."""
    name, addr, length, value = words[0], int(words[1]), int(words[2]), int(words[3])
    try:
        if name not in segments:
            segments[name] = (engine.open_blob(bytes.fromhex(words[5])) if len(words) > 5
                              else engine.open(name))
        buffer[:length] = value
        engine.transfer(ferry.Request(ferry.WRITE, buffer, segments[name], addr, length),
                        timeout=30)
        return "ok"
    except ferry.Error as error:
        return f"{type(error).__name__}: {error}"


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    with ferry.Engine(rpc_address="127.0.0.1") as engine:
        buffer = engine.alloc(size)
        buffer[:] = 0
        print(json.dumps({"name": engine.segment_name, "addr": buffer.ctypes.data,
                          "length": size}), flush=True)
        segments = {}
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "sum":
                print(int(buffer.sum(dtype="uint64")), flush=True)
            elif words[0] == "fill":
                buffer[:] = int(words[1])
                print("ok", flush=True)
            elif words[0] == "notifies":
                want, deadline = int(words[1]), time.monotonic() + float(words[2])
                got = []
                while len(got) < want and time.monotonic() < deadline:
                    got += [[sender, message.decode()] for sender, message
                            in engine.notify_recv()]
                    time.sleep(0.001)
                print(json.dumps(got), flush=True)
            elif words[0] == "blob":
                print(engine.export_blob().hex(), flush=True)
            elif words[0] == "write":
                print(write(engine, segments, buffer, words[1:]), flush=True)
        segments.clear()
        del buffer


if __name__ == "__main__":
    main()
