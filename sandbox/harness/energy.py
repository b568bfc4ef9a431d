"""NVML's total-energy counter (millijoules since driver load): energy per call in the harness, energy per
exclusive device turn in the controller's gate (sandbox/gate.py).

In the harness it is bound before the candidate is imported, like the timer: a candidate that patches pynvml later changes nothing.
Without pynvml, or on a GPU without the counter, energy is simply not reported (never invented).
"""

from __future__ import annotations

from typing import Callable


class EnergyMeter:
    """`index`: an NVML device index (the device gate, around exclusive turns); None: the GPU torch uses (the
    harness, inside the jail, where CUDA_VISIBLE_DEVICES shows one GPU)."""

    def __init__(self, index: int | None = None):
        self.unavailable: str | None = None
        self._read: Callable[[], int] | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            if index is not None:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            else:
                import torch

                props = torch.cuda.get_device_properties(0)
                # NVML ignores CUDA_VISIBLE_DEVICES: find the GPU torch sees by its PCI address.
                bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            read = pynvml.nvmlDeviceGetTotalEnergyConsumption
            read(handle)
            self._read = lambda: read(handle)
        except Exception as exc:  # noqa: BLE001 - no NVML, no counter, no GPU: report why, time anyway
            self.unavailable = f"{type(exc).__name__}: {exc}"[:200]

    def millijoules(self) -> int | None:
        return self._read() if self._read else None
