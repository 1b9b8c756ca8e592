"""The run spec's ``system`` section: the background sampler of the machine (docs/system.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from expr_tracker.spec.fields import FORBID
from expr_tracker.spec.units import Duration

#: smallest ``system.interval``, seconds (50 ms: a test or a short job may sample often;
#: below it the sampler costs more than it tells)
SYSTEM_MIN_INTERVAL = 0.05


def _system_interval(value: float) -> float:
    if not value >= SYSTEM_MIN_INTERVAL:
        raise ValueError(
            f"must be at least {SYSTEM_MIN_INTERVAL:g} s (50ms), e.g. 10s or 1m: the sampler "
            "reads the machine's counters this often, and a shorter interval only costs CPU"
        )
    return value


class SystemSpec(BaseModel):
    """System metrics: a background thread samples CPU, memory, disk, network, open files
    and (through NVML) every GPU of the host, into the run's ``system`` stream
    (``metrics.system[.rankN].jsonl``, wall time as the step axis). One sampler per host:
    the local rank 0 of a ``torchrun`` launch samples, the other ranks do not."""

    model_config = FORBID

    enabled: bool = Field(True, description="sample the machine in the background")
    interval: Annotated[Duration, AfterValidator(_system_interval)] = Field(
        10.0, description="seconds between two samples (at least 50ms)"
    )
    gpu: bool = Field(
        True,
        description="sample the GPUs through NVML (the gpu extra: nvidia-ml-py) when the "
        "host has any; false: CPU, memory, disk and network only",
    )
