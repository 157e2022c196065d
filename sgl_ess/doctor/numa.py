"""NUMA: is the host pool allocated on the GPU's node?

ESS reads the pool over PCIe from the GPU; pool pages on the other socket add an inter-socket hop
to every fetch. The pool is allocated by each scheduler process (one per GPU), so what matters is
that process's memory policy. SGLang 0.5.23 binds each scheduler to its GPU's node itself
(SGLANG_AUTO_NUMA_BIND, on by default) when the machine has several nodes, `numactl` is on PATH
and pynvml is importable, or to the nodes given with --numa-node (one per TP rank). This check
reads what the doctor's own process may use, which is what a server started the same way
inherits: /proc/self/status Mems_allowed_list (the cpuset) and the policy in /proc/self/numa_maps.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from sgl_ess.doctor.finding import Finding
from sgl_ess.doctor.sysfs import PciGpu, parse_cpulist, read_text

CHECK = "numa"
FALSE_WORDS = ("false", "0", "no", "n")


@dataclass(frozen=True)
class MemPolicy:
    mode: str                   # default | local | bind | prefer | interleave | ... (mpol_to_str)
    nodes: set[int] | None      # None: the mode names no nodes


def parse_numa_maps_policy(first_line: str | None) -> MemPolicy | None:
    """'55d0c8a00000 bind:0-1 file=...' -> MemPolicy('bind', {0, 1}); the first mapping of the
    process shows the task's policy when the mapping has none of its own."""
    if not first_line or " " not in first_line:
        return None
    rest = first_line.split(" ", 1)[1]
    for multiword in ("prefer (many)", "weighted interleave"):
        if rest.startswith(multiword):
            word, rest = multiword, rest[len(multiword):]
            break
    else:
        word, rest = "", rest
    token = word + rest.split(" ", 1)[0]
    mode, _, nodes = token.partition(":")
    return MemPolicy(mode.split("=")[0], parse_cpulist(nodes) if nodes else None)


def mems_allowed(proc_status_text: str | None) -> set[int] | None:
    for line in (proc_status_text or "").splitlines():
        if line.startswith("Mems_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1].strip())
    return None


def sglang_binds(environ, which, has_module) -> tuple[bool, str]:
    """Whether SGLang will bind its schedulers itself, and what stops it if not."""
    missing = []
    if environ.get("SGLANG_AUTO_NUMA_BIND", "true").lower() in FALSE_WORDS:
        missing.append("SGLANG_AUTO_NUMA_BIND is off")
    if not which("numactl"):
        missing.append("numactl is not on PATH")
    if not has_module("pynvml"):
        missing.append("pynvml is not importable")
    return not missing, "; ".join(missing)


def check_numa(gpus: list[PciGpu], sys_root: str, proc_status_text: str | None, numa_maps_first_line: str | None,
               environ, which, has_module) -> list[Finding]:
    node_root = os.path.join(sys_root, "devices", "system", "node")
    nodes = parse_cpulist(read_text(os.path.join(node_root, "online")))
    if not nodes:
        return [Finding(CHECK, "info", f"no NUMA information ({node_root}/online missing): nothing to check")]
    if len(nodes) == 1:
        return [Finding(CHECK, "ok", f"one NUMA node ({min(nodes)}): the pool is local to every GPU")]
    if not gpus:
        return [Finding(CHECK, "skip", f"no GPU: GPU locality skipped ({len(nodes)} NUMA nodes)")]
    allowed = mems_allowed(proc_status_text)
    policy = parse_numa_maps_policy(numa_maps_first_line)
    out = []
    for g in gpus:
        if g.numa_node is None:
            out.append(Finding(CHECK, "info", f"{g.bdf}: the firmware gives no NUMA node (numa_node -1): "
                                              f"locality unknown"))
        elif allowed is not None and g.numa_node not in allowed:
            out.append(Finding(CHECK, "warn", f"{g.bdf} is on node {g.numa_node}, but this process may allocate "
                                              f"only from nodes {sorted(allowed)} (cpuset): its pool would be remote",
                               f"allow node {g.numa_node} in the cpuset (docker --cpuset-mems, the cgroup's "
                               f"cpuset.mems) or run the server on that node's CPUs"))
        elif policy and policy.nodes is not None and g.numa_node not in policy.nodes:
            out.append(Finding(CHECK, "warn", f"{g.bdf} is on node {g.numa_node}, but the memory policy is "
                                              f"{policy.mode}:{sorted(policy.nodes)}: its pool would be remote",
                               f"bind to the GPU's node: numactl --cpunodebind={g.numa_node} "
                               f"--membind={g.numa_node}, or SGLang's --numa-node (one node per TP rank)"))
        elif policy and "interleave" in policy.mode and policy.nodes and len(policy.nodes) > 1:
            out.append(Finding(CHECK, "warn", f"{g.bdf} is on node {g.numa_node}; the memory policy interleaves "
                                              f"over nodes {sorted(policy.nodes)}: part of its pool would be remote",
                               f"bind to the GPU's node instead: numactl --cpunodebind={g.numa_node} "
                               f"--membind={g.numa_node}, or SGLang's --numa-node"))
    if out:
        return out
    where = ", ".join(f"{g.bdf} node {g.numa_node}" for g in gpus)
    if policy and policy.mode not in ("default", "local"):
        nodes_text = f":{sorted(policy.nodes)}" if policy.nodes else ""
        return [Finding(CHECK, "ok", f"{len(nodes)} NUMA nodes; memory policy {policy.mode}{nodes_text} "
                                     f"covers the GPUs ({where})")]
    binds, missing = sglang_binds(environ, which, has_module)
    if binds:
        return [Finding(CHECK, "ok", f"{len(nodes)} NUMA nodes ({where}); nothing binds this process, and SGLang "
                                     f"binds each scheduler (and the pool it allocates) to its GPU's node: numactl "
                                     f"and pynvml found, SGLANG_AUTO_NUMA_BIND on")]
    return [Finding(CHECK, "warn", f"{len(nodes)} NUMA nodes ({where}) and nothing binds: {missing}, so SGLang "
                                   f"will not bind its schedulers; pool pages land where they are first touched",
                    "install numactl (apt-get install numactl) and pynvml so SGLang binds each scheduler to its "
                    "GPU's node, or pass --numa-node (one node per TP rank), or for one GPU run the server "
                    "under numactl --cpunodebind=N --membind=N with N the GPU's node")]
