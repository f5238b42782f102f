"""The micro-batch memory model (horovod_cpp.adaptive.memory) against hand-computed limits."""
import pytest

from horovod_cpp.adaptive import memory
from horovod_cpp.adaptive.memory import MemoryModel


def test_nothing_known_means_no_limit():
    assert MemoryModel(10000, 1000).limit() is None


def test_exact_when_all_memory_is_per_sample_approached_from_below():
    # peak(b) = 1000 + 10 b, budget 10000 less 20 % of the 9000 of room: at most (8200 - 1000)
    # / 10 = 720. Past the highest peak measured a sample counts 1.5 times (15).
    m = MemoryModel(10000, base=1000, growth=None)
    m.record(32, 1000 + 10 * 32)
    assert m.limit() == 32 + (8200 - 1320) // 15  # 490
    m.record(64, 1000 + 10 * 64)
    assert m.limit() == 64 + (8200 - 1640) // 15  # 501
    seen = [32, 64]
    for _ in range(12):  # each measured limit closes two thirds of the remaining gap
        b = m.limit()
        m.record(b, 1000 + 10 * b)
        seen.append(b)
    assert seen == sorted(seen) and 715 <= seen[-1] <= 720, seen
    m.record(730, 1000 + 10 * 730)  # past the 80 %: back off on the measured slope alone
    assert m.limit() == 730 - (8300 - 8200) // 10 == 720


def test_fixed_memory_counts_per_sample_pessimistically():
    # peak(b) = 1500 + 10 b: a fixed 500 (gradient buffers) counted per sample, (peak - base)/b
    # at the highest point (25.6, then 17.8) outweighs the slope (10): below the truth (670)
    m = MemoryModel(10000, base=1000, growth=None)
    m.record(32, 1500 + 320)
    assert m.limit() == 32 + int((8200 - 1820) // (1.5 * 820 / 32))  # 197
    m.record(64, 1500 + 640)
    assert m.limit() == 64 + int((8200 - 2140) // (1.5 * 1140 / 64))  # 290
    assert m.limit() < 670


def test_a_monotone_mark_counts_only_when_it_rises_and_over_budget_backs_off():
    m = MemoryModel(10000, base=1000, growth=None, monotone=True)
    m.record(100, 2000)
    m.record(50, 1900)   # the high-water mark did not rise: no information
    assert m.peaks == {100: 2000.0}
    per_step = MemoryModel(10000, base=1000)  # marks reset every step: each one counts
    per_step.record(100, 2000)
    per_step.record(50, 1500)
    per_step.record(50, 1400)
    assert per_step.peaks == {100: 2000.0, 50: 1500.0}
    m.record(200, 9500)  # into the 20 % kept free: the limit falls below 200
    assert m.limit() < 200
    m.record(0, 5000)
    m.record(10, float("nan"))
    assert set(m.peaks) == {100, 200}


def test_state_round_trip():
    m = MemoryModel(10000, base=1000, growth=None)
    m.record(32, 1320)
    again = MemoryModel(1, 1)
    again.load_state_dict(m.state_dict())
    assert again.state_dict() == m.state_dict() and again.limit() == m.limit()


def test_default_budget(monkeypatch):
    monkeypatch.setenv("HOROVOD_ADAPTIVE_MEMORY_BUDGET", "5e9")
    assert memory.default_budget(4) == 5 * 10 ** 9
    monkeypatch.setenv("HOROVOD_ADAPTIVE_MEMORY_BUDGET", "lots")
    with pytest.raises(ValueError, match="HOROVOD_ADAPTIVE_MEMORY_BUDGET"):
        memory.default_budget(1)
    monkeypatch.delenv("HOROVOD_ADAPTIVE_MEMORY_BUDGET")
    monkeypatch.setattr(memory, "cgroup_limit_bytes", lambda: None)
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 24 << 30)
    assert memory.default_budget(2) == 12 << 30
    monkeypatch.setattr(memory, "cgroup_limit_bytes", lambda: 4 << 30)
    assert memory.default_budget(2) == 2 << 30


def test_growth_is_capped_near_what_was_measured_and_the_highest_peak_leads():
    m = MemoryModel(10000, base=1000)        # growth 2: at most twice the largest seen
    m.record(32, 1000 + 10 * 32)
    assert m.limit() == 64
    m.record(64, 1000 + 10 * 64)
    assert m.limit() == 128
    m.record(500, 1000 + 10 * 500)
    assert m.limit() == 500 + 2200 // 15     # the budget binds now (646, from below)
    # A smaller micro-batch that raised the peak higher (the allocator jumped) leads the fit.
    j = MemoryModel(10000, base=1000, growth=None)
    j.record(14, 3000)
    j.record(12, 3200)
    assert j._top()[-1] == 12 and j.limit() == 12 + int((8200 - 3200) // (1.5 * 2200 / 12))



def _resident():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def test_release_free_memory_hands_what_malloc_holds_free_back():
    # 256 blocks of 64 KiB (below glibc's mmap threshold: from the heap), written, then freed
    # under a guard block that keeps them from being trimmed at free(): still resident (16 MiB)
    # until released.
    import ctypes
    import ctypes.util
    import platform
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 << 10) for _ in range(256)]
    guard = libc.malloc(64 << 10)
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    written = _resident()
    for b in blocks:
        libc.free(b)
    freed = _resident()
    assert memory.release_free_memory()
    released = _resident()
    libc.free(guard)
    assert written - freed < 2 << 20, (written, freed)  # free() alone kept them
    assert freed - released > 14 << 20, (freed, released)
