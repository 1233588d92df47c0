"""Device placement: CPU by default, CUDA when asked for and present."""

import torch

from auditlib.errors import AuditInputError


def resolve_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise AuditInputError(
                f"device {name!r} requested but no CUDA device is available here; choose the CPU device (cpu)"
            )
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise AuditInputError(
                f"device {name!r} does not exist; {torch.cuda.device_count()} CUDA devices present"
            )
        return device
    raise AuditInputError(f"unknown device {name!r}; expected cpu, cuda or cuda:N")
