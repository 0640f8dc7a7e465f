"""GPU timing shared by ``deepfuse.patch`` (its per-M dispatch) and ``python -m deepfuse.bench``,
measured the way the C++ benchmarks measure (src/bench/timing.cpp, src/core/roofline.hpp): calls
captured back to back in one CUDA graph, at least 100 ms of warm-up, the median over replays; the
copy bandwidth from the same C++ function; every figure checked against the physical floor."""

import ctypes
import dataclasses
import statistics
import time
from typing import Callable, Sequence

import torch

from . import _lib

#: Seconds of warm-up before a timing, so clocks are up (core/warm_up.hpp's kWarmUpTime).
WARM_UP_SECONDS = 0.1


def graph_call_us(calls: Sequence[Callable[[], object]], replays: int = 15) -> float:
    """Median microseconds per call when `calls` run back to back in one CUDA graph.

    Each call should read its own weights (rotating copies or layers) so that together they are
    several times the L2 and every call streams from HBM, as in a decode step.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls[:3]:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_UP_SECONDS:
        graph.replay()
        torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1000.0 / len(calls))
    del graph
    return statistics.median(times)


def physically_possible(num_bytes: float, seconds: float, read_bytes_per_s: float, l2_bytes: int) -> bool:
    """Whether a call that must read `num_bytes` can take `seconds` (src/core/roofline.hpp, through the
    compiled library): what L2 could hold is free, the rest streams at most at `read_bytes_per_s`."""
    status = _lib.lib().df_physically_possible(float(num_bytes), float(seconds), float(read_bytes_per_s), int(l2_bytes))
    _lib.check(0 if status >= 0 else status, "physically_possible")
    return status == 1


@dataclasses.dataclass(frozen=True)
class DeviceFloor:
    """What this GPU's figures are measured against: the copy bandwidth (read + write, the roofline)
    and the floor no honest timing can beat (the DRAM's peak, never below the copy, and its L2)."""

    copy_bytes_per_s: float
    dram_peak_bytes_per_s: float
    read_ceiling_bytes_per_s: float
    l2_bytes: int

    def possible(self, num_bytes: float, us: float) -> bool:
        return physically_possible(num_bytes, us * 1e-6, self.read_ceiling_bytes_per_s, self.l2_bytes)


def measure_device_floor(copy_bytes: int = 1 << 30, repetitions: int = 20) -> DeviceFloor:
    """The current device's copy bandwidth measured by the C++ benchmarks' own function (a 1 GiB
    device-to-device copy, read + write counted, median of 20 after 100 ms of warm-up), on PyTorch's
    current stream, and the floor that goes with it."""
    lib = _lib.lib()
    copy_bw = ctypes.c_double()
    torch.cuda.synchronize()
    _lib.check(lib.df_measure_copy_bandwidth(copy_bytes, repetitions, torch.cuda.current_stream().cuda_stream,
                                             ctypes.byref(copy_bw)), "measure_copy_bandwidth")
    peak, ceiling, l2 = ctypes.c_double(), ctypes.c_double(), ctypes.c_int64()
    _lib.check(lib.df_read_ceiling(torch.cuda.current_device(), copy_bw.value, ctypes.byref(peak), ctypes.byref(ceiling),
                                   ctypes.byref(l2)), "read_ceiling")
    return DeviceFloor(copy_bw.value, peak.value, ceiling.value, l2.value)
