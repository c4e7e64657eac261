#!/usr/bin/env python3
"""Python's overhead over C, measured against one ferry_bench target.

Two targets of issue 22: a Python loop of 64 KiB writes in batches of 128
reaches >= 0.9x of ferry_bench with the same settings, and one 8 B write
submitted and waited from Python costs at most 3 us more than from C.

One `ferry_bench --mode=target` serves every run; rounds interleave
ferry_bench's initiator (C) with the same loop in Python (this process,
through ferry._core) and, for the 8 B write, through ctypes (to show why the
package is a C extension).  Medians over the rounds; say the load average.

    FERRY_MODULE_DIR=build/modules/.libs PYTHONPATH=build/python/lib \\
        python3 python/bench/bench_overhead.py --ferry-bench build/ferry_bench
"""

import argparse
import ctypes
import ctypes.util
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import ferry


def run_c(bench, segment, args):
    out = subprocess.run([bench, "--mode=initiator", f"--segment={segment}", *args],
                         capture_output=True, text=True, check=True).stdout
    return out


TRANSPORTS = {}  # which transport served each kind of run


def cpu_seconds(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def c_throughput(bench, segment, seconds, block, batch):
    """GB/s and CPU seconds per GB (the whole process: its start and setup too)."""
    before = cpu_seconds(resource.RUSAGE_CHILDREN)
    out = run_c(bench, segment, [f"-b{block}", f"-B{batch}", f"-d{seconds}"])
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - before
    TRANSPORTS["c_gbps"] = re.search(r"RESULT.*transport=(\S+)", out).group(1)
    gigabytes = float(re.search(r" bytes=([0-9]+)", out).group(1)) / 1e9
    return float(re.search(r"gbps=([0-9.]+)", out).group(1)), cpu / gigabytes


def c_latency(bench, segment, seconds):
    out = run_c(bench, segment, ["--latency", "-b8", f"-d{seconds}"])
    TRANSPORTS["c_lat"] = re.search(r"LATENCY.*transport=(\S+)", out).group(1)
    match = re.search(r"median_us=([0-9.]+) p99_us=([0-9.]+)", out)
    return float(match.group(1)), float(match.group(2))


def py_throughput(engine, local, segment, addr, seconds, block, batch_size):
    requests = [ferry.Request(ferry.WRITE, local, segment, addr + i * block, block, i * block)
                for i in range(batch_size)]
    batch = engine.batch(batch_size)
    batch.submit(requests)  # the first round opens connections
    batch.wait()
    rounds = 0
    cpu_before = cpu_seconds(resource.RUSAGE_SELF)  # every thread of this process
    start = time.perf_counter()
    end = start + seconds
    now = start
    while now < end:
        batch.submit(requests)
        batch.wait()
        rounds += 1
        now = time.perf_counter()
    cpu = cpu_seconds(resource.RUSAGE_SELF) - cpu_before
    TRANSPORTS["py_gbps"] = batch.status(0).transport
    batch.close()
    gigabytes = rounds * batch_size * block / 1e9
    return gigabytes / (now - start), cpu / gigabytes


def medians_of_32(one_write, seconds):
    """ferry_bench --latency's statistic: the median and 99th percentile of the
    mean of each 32 consecutive requests, in microseconds."""
    samples = []
    clock = time.perf_counter_ns
    end = clock() + int(seconds * 1e9)
    while True:
        start = clock()
        for _ in range(32):
            one_write()
        stop = clock()
        samples.append((stop - start) / 32 / 1000)
        if stop > end:
            break
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99)]


def py_latency(engine, local, segment, addr, seconds):
    request = ferry.Request(ferry.WRITE, local, segment, addr, 8)
    batch = engine.batch(1)
    submit, wait = batch.submit, batch.wait

    def one_write():
        submit(request)
        wait()

    one_write()
    result = medians_of_32(one_write, seconds)
    TRANSPORTS["py_lat"] = batch.status(0).transport
    batch.close()
    return result


class CtypesFerry:
    """The same 8 B loop through ctypes on libferry (no extension)."""

    class Request(ctypes.Structure):
        _fields_ = [("opcode", ctypes.c_int), ("local", ctypes.c_void_p),
                    ("target", ctypes.c_void_p), ("target_offset", ctypes.c_uint64),
                    ("length", ctypes.c_size_t), ("transport", ctypes.c_char_p)]

    def __init__(self, library):
        self.lib = ctypes.CDLL(library)
        self.lib.ferry_engine_segment_name.restype = ctypes.c_char_p
        self.lib.ferry_batch_submit.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                ctypes.c_size_t]
        self.lib.ferry_batch_wait.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.engine = ctypes.c_void_p()
        assert self.lib.ferry_engine_create(None, ctypes.byref(self.engine)) == 0

    def latency(self, segment_name, addr, seconds):
        lib = self.lib
        segment, batch, local = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        assert lib.ferry_segment_open(self.engine, segment_name.encode(),
                                      ctypes.byref(segment)) == 0
        assert lib.ferry_alloc(self.engine, ctypes.c_size_t(8), b"cpu", 0,
                               ctypes.byref(local)) == 0
        assert lib.ferry_batch_create(self.engine, ctypes.c_size_t(1), ctypes.byref(batch)) == 0
        request = self.Request(1, local, segment, addr, 8, None)
        submit, wait, pointer = lib.ferry_batch_submit, lib.ferry_batch_wait, ctypes.byref(request)

        def one_write():
            if submit(batch, pointer, 1) != 0 or wait(batch, -1) != 0:
                raise RuntimeError("ctypes write failed")

        one_write()
        result = medians_of_32(one_write, seconds)
        lib.ferry_batch_destroy(batch)
        return result

    def close(self):
        self.lib.ferry_engine_destroy(self.engine)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ferry-bench", default=os.environ.get("FERRY_BENCH", "ferry_bench"))
    parser.add_argument("--library", default=None,
                        help="libferry.so for the ctypes loop (default: next to ferry_bench)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--transports", default=None,
                        help="FERRY_TRANSPORTS for every side (default: as set, else all)")
    options = parser.parse_args()
    if options.transports:
        os.environ["FERRY_TRANSPORTS"] = options.transports
    library = options.library or os.path.join(os.path.dirname(os.path.abspath(
        options.ferry_bench)), ".libs", "libferry.so")
    target = subprocess.Popen([options.ferry_bench, "--mode=target"], stdout=subprocess.PIPE,
                              text=True)
    try:
        segment_name = target.stdout.readline().split()[1]
        addr = int(target.stdout.readline().split()[1], 16)
        results = {k: [] for k in ("c_gbps", "py_gbps", "c_lat", "py_lat", "ct_lat",
                                   "c_cpu_s_per_gb", "py_cpu_s_per_gb")}
        p99 = {k: [] for k in ("c_lat", "py_lat", "ct_lat")}
        with ferry.Engine() as engine:
            segment = engine.open(segment_name)
            seconds = options.seconds
            # both made once, as ferry_bench's initiator does
            block_buffer, word_buffer = engine.alloc(65536 * 128), engine.alloc(8)
            block_buffer[:] = 1
            for round_ in range(options.rounds):
                for side, run in (("c", lambda: c_throughput(options.ferry_bench, segment_name,
                                                              seconds, 65536, 128)),
                                  ("py", lambda: py_throughput(engine, block_buffer, segment,
                                                               addr, seconds, 65536, 128))):
                    gbps, cpu = run()
                    results[f"{side}_gbps"].append(gbps)
                    results[f"{side}_cpu_s_per_gb"].append(cpu)
                lat = c_latency(options.ferry_bench, segment_name, seconds)
                results["c_lat"].append(lat[0])
                p99["c_lat"].append(lat[1])
                lat = py_latency(engine, word_buffer, segment, addr, seconds)
                results["py_lat"].append(lat[0])
                p99["py_lat"].append(lat[1])
                if os.path.exists(library):  # its own engine only while it runs
                    via_ctypes = CtypesFerry(library)
                    lat = via_ctypes.latency(segment_name, addr, seconds)
                    via_ctypes.close()
                    results["ct_lat"].append(lat[0])
                    p99["ct_lat"].append(lat[1])
                print(f"round {round_}: " + " ".join(f"{k}={v[-1]:.3f}" for k, v in
                                                     results.items() if v), flush=True)
    finally:
        target.terminate()
        target.wait()
    med = {k: statistics.median(v) for k, v in results.items() if v}
    load = os.getloadavg()
    print(f"FERRY_TRANSPORTS={os.environ.get('FERRY_TRANSPORTS', '')!r}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {options.rounds} rounds "
          f"x {options.seconds} s, medians:")
    print(f"64 KiB writes, batches of 128: C {med['c_gbps']:.3f} GB/s, Python "
          f"{med['py_gbps']:.3f} GB/s, ratio {med['py_gbps'] / med['c_gbps']:.3f} "
          f"(target >= 0.9)")
    print(f"  CPU seconds per GB moved (load-robust): C {med['c_cpu_s_per_gb']:.4f} (whole "
          f"process), Python {med['py_cpu_s_per_gb']:.4f} (the loop), ratio C/Python "
          f"{med['c_cpu_s_per_gb'] / med['py_cpu_s_per_gb']:.3f}")
    print(f"8 B write submit+wait: C {med['c_lat']:.2f} us, Python {med['py_lat']:.2f} us, "
          f"overhead {med['py_lat'] - med['c_lat']:+.2f} us (target <= 3)")
    if "ct_lat" in med:
        print(f"8 B write through ctypes: {med['ct_lat']:.2f} us, overhead "
              f"{med['ct_lat'] - med['c_lat']:+.2f} us")
    print("transports: " + " ".join(f"{k}={v}" for k, v in TRANSPORTS.items()))
    print("p99 medians (us): " + " ".join(f"{k}={statistics.median(v):.2f}"
                                          for k, v in p99.items() if v))
    ok = med["py_gbps"] >= 0.9 * med["c_gbps"] and med["py_lat"] - med["c_lat"] <= 3.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
