"""Device placement: CUDA where asked for and present; ``auto`` (the command line's
default) is CUDA where this machine has a CUDA device, else the CPU."""

import torch

from auditlib.errors import AuditInputError

# The device a run takes where none is named: resolved before the run's spec is made, so a
# spec (and its identity) always names the device it ran on.
AUTO = "auto"


def chosen_device(name: str) -> str:
    """``name``, or for ``auto`` the device a GPU worker is expected to take: cuda where
    torch sees a CUDA device here, else cpu."""
    if name != AUTO:
        return name
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device_name(name: str) -> None:
    """Refuse a device name that is none of cpu, cuda or cuda:N (where the run is started:
    the machine that starts it need not have the GPU its worker has)."""
    index = name[len("cuda:") :] if name.startswith("cuda:") else "0"
    if name not in ("cpu", "cuda") and not (name.startswith("cuda:") and index.isdigit()):
        raise AuditInputError(f"unknown device {name!r}; expected cpu, cuda or cuda:N")


def resolve_device(name: str) -> torch.device:
    check_device_name(name)
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise AuditInputError(
            f"device {name!r} requested but no CUDA device is available here; choose the CPU device (cpu)"
        )
    full_float32()
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise AuditInputError(
            f"device {name!r} does not exist; {torch.cuda.device_count()} CUDA devices present"
        )
    return device


def full_float32() -> None:
    """Convolutions and matrix products in full float32 on CUDA, as on the CPU: gradient
    matching compares gradients to many digits, and TF32's 10-bit mantissa (cuDNN's default
    for convolutions) moved DLG's first objective by 1.2 % on an H200, where float32 moved it
    by 1e-5 (docs/ALGORITHMS.md, "CUDA in float32")."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
