"""System metrics (docs/system.md): the background sampler of the machine and its probes.

- :mod:`.probes`: what is read (psutil: CPU, memory, disk, network, open files; NVML: each
  GPU), each probe a callable returning ``{metric: number}``.
- :mod:`.sampler`: :class:`SystemSampler`, the thread that samples them into rows.

``expr_tracker.assemble.system`` makes one for a run from the spec's ``system`` section.
"""

from expr_tracker.system.sampler import SystemSampler

__all__ = ["SystemSampler"]
