"""trainer.cpu_malloc_reuse: after reuse_freed_cpu_memory(), blocks come from the heap (reused after
free) instead of their own mmap: all of them for one worker, those under 16 MiB for several
(FSDP). Runs in a subprocess: the setting is process-wide."""

import subprocess
import sys
import textwrap

import pytest

PRELUDE = textwrap.dedent("""
    import ctypes, sys
    from hybridrl.controller.worker import release_freed_cpu_memory, reuse_freed_cpu_memory

    def in_heap(address):
        for line in open("/proc/self/maps"):
            if line.rstrip().endswith("[heap]"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= address < hi:
                    return True
        return False

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
""")

SCRIPT = PRELUDE + textwrap.dedent("""
    mode = sys.argv[1]
    tuned = None if mode == "plain" else reuse_freed_cpu_memory(world_size=int(mode))
    mid, large = libc.malloc(8 << 20), libc.malloc(64 << 20)
    print(tuned, in_heap(mid), in_heap(large))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_blocks_are_kept_for_reuse_all_on_one_worker_and_the_mid_sized_ones_on_several():
    def run(mode):
        out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert run("plain") == ["None", "False", "False"]  # glibc mmaps every block over 128 KiB at first
    assert run("1") == ["True", "True", "True"]  # one worker: every block from the heap, kept when freed
    assert run("2") == ["True", "True", "False"]  # FSDP workers: a 64 MB block keeps its own mapping


RELEASE = PRELUDE + textwrap.dedent("""
    tuned = release_freed_cpu_memory() if sys.argv[1] == "tuned" else None
    libc.free(libc.malloc(16 << 20))  # freeing an mmap'd block raises glibc's dynamic threshold
    print(tuned, in_heap(libc.malloc(4 << 20)))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_blocks_go_back_to_the_os_with_a_fixed_threshold():
    def run(mode):
        out = subprocess.run([sys.executable, "-c", RELEASE, mode], capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert run("plain") == ["None", "True"]  # after the free, glibc serves 4 MB from the heap (kept when freed)
    assert run("tuned") == ["True", "False"]  # a fixed 128 KiB threshold: its own mmap, unmapped on free
