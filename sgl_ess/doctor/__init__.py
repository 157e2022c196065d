"""`python -m sgl_ess.doctor`: checks an operator runs on a serving machine before deploying.

One module per check family, each a plain function returning `Finding`s from values it is given
(a sysfs root, a meminfo path, limits), so tests drive them with fake trees:

  finding.py      Finding {check, status, detail, fix}; which statuses fail the run
  sysfs.py        reading /sys: NVIDIA GPUs on the PCI bus, their links and NUMA nodes, cpulists
  pcie.py         link speed / width now vs the maximum (downgraded links)
  host_memory.py  planned host-pool bytes vs MemAvailable, and vs RLIMIT_MEMLOCK
  numa.py         the GPU's node vs the nodes this process may allocate from, and who binds
  thp.py          transparent huge pages (informational)
  ipc.py          the directories SGLang's and sgl-ess's ipc:// sockets are made in
  pd_packages.py  Mooncake, libibverbs, the router (needed only for PD disaggregation)
  gpu.py          is there a GPU; gpu_probe.py: FlashTrans vs a bulk copy, torch imported only there
  runner.py       every check in order, one crash never stops the rest; cli.py: flags and output

No sglang, and torch only on a machine with /dev/nvidia*: the CPU path runs in well under 2 s.
"""
