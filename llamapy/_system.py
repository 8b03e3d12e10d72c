"""Facts about the machine."""

from __future__ import annotations

import os


def physical_cores() -> int:
    """Physical core count (llama.cpp's default of 4 threads ignores the machine)."""
    try:
        pairs = set()
        phys = core = None
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip() and core is not None:
                    pairs.add((phys, core))
                    phys = core = None
        if core is not None:
            pairs.add((phys, core))
        if pairs:
            return len(pairs)
    except OSError:
        pass
    return max(1, os.cpu_count() or 1)
