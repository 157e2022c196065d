"""Read /proc/PID/smaps: the mapping entries (address range, name, sizes, VmFlags) of a process."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Mapping:
    start: int
    end: int
    name: str
    flags: set = field(default_factory=set)       # VmFlags: dd = not in core dumps, lo = mlocked
    kb: dict = field(default_factory=dict)        # Size, Rss, Locked, ... in kB


def mappings(pid: int | str = "self") -> list[Mapping]:
    out: list[Mapping] = []
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            head, _, rest = line.partition(" ")
            if "-" in head and ":" not in head:             # "start-end perms offset dev inode [name]"
                lo, hi = head.split("-")
                parts = rest.split(None, 4)
                out.append(Mapping(int(lo, 16), int(hi, 16), parts[4].strip() if len(parts) > 4 else ""))
            elif line.startswith("VmFlags:"):
                out[-1].flags = set(line.split()[1:])
            elif head.endswith(":") and rest.strip().endswith("kB"):
                out[-1].kb[head[:-1]] = int(rest.split()[0])
    return out


def mapping_at(addr: int, pid: int | str = "self") -> Mapping:
    """The smaps entry whose range holds `addr`."""
    for m in mappings(pid):
        if m.start <= addr < m.end:
            return m
    raise LookupError(f"no mapping holds {addr:#x} in /proc/{pid}/smaps")
