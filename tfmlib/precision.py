"""Mixed precision: which dtype to compute in, autocast, and the gradient scaler.

Introduced in chapter 10 (scaling up); :func:`tfmlib.train.fit` uses it through its ``precision``
argument.

**What autocast does.** Inside ``torch.autocast(device_type, dtype)`` every eligible operation
picks its own compute dtype: operations that are fast and safe in low precision (matrix
multiplications: ``linear``, ``matmul``, ``bmm``, ``addmm``, ``baddbmm``, convolutions, the RNN
cells) cast their inputs to ``dtype`` (bfloat16 or float16) and return that dtype; operations that
need float32's range or precision are cast to float32; the rest run in whatever dtype their inputs
have (an addition of a bf16 and an fp32 tensor runs in fp32: the widest input wins). Nothing is
cast in place: the *parameters stay float32* (autocast casts a copy for each matmul, cached for
the forward pass), their gradients are float32, and the optimizer's state (Adam's moments) and
update are float32. These "master weights" matter: bf16 numbers near 1.0 are 2**-7 (about
0.008) apart, so an update ``lr * step`` of 1e-4 applied to a bf16 weight would be rounded away.

Which operations go to float32 depends on the device. PyTorch's "Autocast Op Reference"
(https://pytorch.org/docs/stable/amp.html#autocast-op-reference) lists them. On CUDA ("CUDA Ops
that can autocast to float32"): ``softmax``, ``log_softmax``, ``cross_entropy``, ``nll_loss``,
``layer_norm``, ``group_norm``, ``exp``, ``log``, ``pow``, ``sum``, ``prod``, ``cumsum``,
``norm``, ``mse_loss`` and the other losses. On the CPU ("CPU Ops that can autocast to
float32") the list is shorter: the losses (``cross_entropy``/``nll_loss``, ``mse_loss``,
``binary_cross_entropy``...), ``prod``, ``cdist``, ``quantile``, FFTs and a few others, but *not*
``softmax``, ``log_softmax`` or ``layer_norm``, which run in bf16 there (their CPU kernels
accumulate in float32 internally). Ops that are called with an explicit ``dtype=`` argument, ops on
float64 or integer tensors and in-place ops are not autocast.

**bf16 or fp16.** bfloat16 keeps float32's 8 exponent bits (range up to ~3.4e38, smallest normal
~1.2e-38) and drops mantissa bits (8 significant bits, 2 to 3 decimal digits). float16 has 11
significant bits but only 5 exponent bits: its largest value is 65504 and its smallest normal
about 6.1e-5, so small gradients underflow to zero. That is why fp16 training needs
``torch.amp.GradScaler``: it multiplies the loss by a large factor (65536 to start) before
``backward``, so that the gradients are representable, divides the gradients by it again
(``unscale_``) before clipping and the step, skips any step whose gradients hold an inf or a NaN
(the factor was too large) and then halves the factor; after 2000 steps without overflow it
doubles it. bf16 has float32's range and needs no scaling.

**TF32.** Since Ampere, NVIDIA GPUs can run float32 matrix products on the tensor cores in
TensorFloat-32: the inputs rounded to 10 mantissa bits (fp16's precision, float32's range), the
products summed in float32. An H100 SXM's datasheet gives 495 dense TFLOP/s in TF32 against 67 in
plain float32 (and 989 in bf16). PyTorch leaves it off for matrix products by default
(``torch.get_float32_matmul_precision() == "highest"``); ``torch.set_float32_matmul_precision("high")``
(or ``torch.backends.cuda.matmul.allow_tf32 = True``) turns it on, as nanoGPT's ``train.py`` does.
:func:`tf32_matmul` switches it for a block, :func:`fp32_matmul_is_tf32` says whether it is on;
:func:`tfmlib.throughput.peak_flops` follows it for fp32. cuDNN (convolutions and the fused RNNs
of ``nn.GRU``/``nn.LSTM``) has its own switch, and it is *on* by default
(``torch.backends.cudnn.allow_tf32``): a float32 GRU on an Ampere GPU computes in TF32 unless told
not to. The book keeps exact comparisons exact, so :func:`tfmlib.config.setup` turns both off on
CUDA (:func:`set_tf32`) and says so in its summary (``tf32=off``); chapter 10 turns TF32 on for a
block to show what it does. On a CPU the settings change nothing (there is no TF32 unit: the
float32 products are the same, bit for bit).
"""

from __future__ import annotations

import contextlib
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

INTRODUCED_IN = 10

PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _device(device: torch.device | str) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def supports_bf16(device: torch.device | str) -> bool:
    """Whether autocast can compute in bfloat16 on ``device``.

    CUDA: GPUs that compute in bf16 natively (Ampere, compute capability 8.0, and newer:
    ``torch.cuda.is_bf16_supported(including_emulation=False)``; without that argument PyTorch
    also says ``True`` on a V100 or a T4, where bf16 runs only emulated, slowly). CPU: always
    (torch's CPU autocast supports bf16; it is fast only on CPUs with bf16 instructions such as
    AVX512-BF16 or AMX, elsewhere it is emulated and often slower than fp32). MPS: macOS 14 or
    newer. Any other device: ``False``.
    """
    device = _device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return True
    if device.type == "mps":
        check = getattr(torch.backends.mps, "is_macos_or_newer", None)
        return bool(torch.backends.mps.is_available() and check is not None and check(14, 0))
    return False


def cpu_bf16_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The bf16 instructions this CPU advertises, read from the operating system.

    Linux: the ``flags`` (x86: ``avx512_bf16``, ``amx_bf16``) and ``Features`` (Arm: ``bf16``) lines
    of ``/proc/cpuinfo``; macOS: ``sysctl hw.optional.arm.FEAT_BF16`` (Apple M2 and later). An empty
    set elsewhere or when nothing can be read (then bf16 is taken to be emulated). ``cpuinfo`` is
    for tests.
    """
    found: set[str] = set()
    if cpuinfo.exists():
        try:
            text = cpuinfo.read_text(errors="replace")
        except OSError:
            return found
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):
                words = set(value.split())
                found |= words & {"avx512_bf16", "amx_bf16"}
                if "bf16" in words:
                    found.add("bf16")
        return found
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True,
                                 text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return found
        if out == "1":
            found.add("FEAT_BF16")
    return found


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (:func:`cpu_bf16_features` non-empty): x86's
    AVX512-BF16 or AMX-BF16, Arm's BF16 extension. Without them oneDNN emulates bf16 products by
    converting to float32, and a bf16 step is slower than an fp32 one."""
    return bool(cpu_bf16_features())


def supports_fp16(device: torch.device | str) -> bool:
    """Whether autocast can compute in float16 on ``device``: CUDA (when available), the CPU (torch's
    CPU autocast accepts fp16, checked with torch 2.13; it is slow there) and MPS."""
    device = _device(device)
    if device.type == "cuda":
        return torch.cuda.is_available()
    if device.type == "mps":
        return torch.backends.mps.is_available()
    return device.type == "cpu"


def pick_precision(device: torch.device | str, requested: str = "auto") -> str:
    """``requested`` (``"auto"``, ``"fp32"``, ``"bf16"`` or ``"fp16"``) resolved for ``device``.

    ``"auto"`` picks what is fast on the device, by its features (no timing):

    * CUDA: ``"bf16"`` on GPUs with native bf16 (:func:`supports_bf16`: Ampere and newer), else
      ``"fp16"`` (older GPUs such as the V100 and the T4, which need a gradient scaler);
    * CPU: ``"bf16"`` only when the processor has bf16 instructions (:func:`cpu_has_fast_bf16`:
      AVX512-BF16, AMX or Arm's BF16, read from ``/proc/cpuinfo`` or ``sysctl``), else ``"fp32"``:
      autocast still *accepts* bf16 there, but emulates it, more slowly than fp32;
    * MPS (macOS 14+): ``"bf16"``; anything else: ``"fp32"``.

    An explicit request is returned as it is if the device can do it (bf16 on a CPU without the
    instructions is allowed: it is correct, only slow).

    Raises ``ValueError`` for an unknown name, or for ``"bf16"``/``"fp16"`` on a device whose
    autocast cannot compute in that dtype (the message says what it can do).
    """
    if requested not in ("auto", *PRECISIONS):
        raise ValueError(f"pick_precision: requested must be 'auto', 'fp32', 'bf16' or 'fp16', "
                         f"got {requested!r}")
    device = _device(device)
    if requested == "auto":
        if device.type == "cpu":
            return "bf16" if cpu_has_fast_bf16() else "fp32"
        if supports_bf16(device):
            return "bf16"
        if device.type == "cuda" and supports_fp16(device):
            return "fp16"
        return "fp32"
    can = {"fp32": True, "bf16": supports_bf16(device), "fp16": supports_fp16(device)}
    if not can[requested]:
        possible = [p for p in PRECISIONS if can[p]]
        raise ValueError(f"pick_precision: the device {device} cannot compute in {requested} "
                         f"(it can: {', '.join(possible)}); ask for 'auto' to get the best it can do")
    return requested


def fp32_matmul_is_tf32() -> bool:
    """Whether float32 matrix products on CUDA may use TF32 (the module docstring): true after
    ``torch.set_float32_matmul_precision("high")`` or ``"medium"``, ``torch.backends.cuda.matmul.allow_tf32
    = True`` or ``torch.backends.cuda.matmul.fp32_precision = "tf32"``; false by default. Read from
    ``torch.backends.cuda.matmul.fp32_precision`` where torch has it (2.9 and later; "none" there
    means "follow ``torch.get_float32_matmul_precision()``")."""
    new = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if new == "tf32":
        return True
    if new == "ieee":
        return False
    return torch.get_float32_matmul_precision() in ("high", "medium")


def cudnn_is_tf32() -> bool:
    """Whether cuDNN's float32 convolutions and RNNs may use TF32 (``torch.backends.cudnn.allow_tf32``,
    true by default). Where a program set cuDNN's convolution and RNN precisions apart with torch's
    newer per-operator flags, the legacy flag cannot be read; then true if either may use TF32."""
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:  # torch >= 2.9: conv and rnn flags set apart through the new API
        cudnn = torch.backends.cudnn
        flags = (getattr(cudnn.conv, "fp32_precision", None), getattr(cudnn.rnn, "fp32_precision", None))
        return "tf32" in flags


def set_tf32(enabled: bool) -> None:
    """Let float32 work on CUDA use TF32 (``enabled=True``) or keep it IEEE float32 (``False``): both
    the matrix products (``torch.set_float32_matmul_precision("high" / "highest")``) and cuDNN's
    convolutions and RNNs (``torch.backends.cudnn.allow_tf32``). Process-wide; on a CPU it changes
    nothing measurable. (Set through the legacy cuDNN flag, which sets the convolution and RNN
    flags together: torch refuses to read the legacy flag once the two were set apart.)"""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_tf32: enabled must be a bool, got {enabled!r}")
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


@contextlib.contextmanager
def tf32_matmul(enabled: bool = True) -> Iterator[None]:
    """Run the block with float32 matrix products in TF32 (``enabled=True``) or in IEEE float32
    (``False``) on CUDA: ``torch.set_float32_matmul_precision("high" / "highest")``, the previous
    setting restored afterwards. On a CPU it changes nothing measurable (no TF32 unit)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"tf32_matmul: enabled must be a bool, got {enabled!r}")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager[Any]:
    """A context manager that runs its block at ``precision`` on ``device``:
    ``torch.autocast(device.type, dtype=torch.bfloat16 / torch.float16)``, or a ``nullcontext``
    (plain float32) for ``"fp32"``. Run the forward pass and the loss inside it, ``backward``
    outside (the backward ops run in the dtypes the forward chose). ``"auto"`` is resolved with
    :func:`pick_precision`; an unknown name or an unsupported one raises ``ValueError``."""
    device = _device(device)
    precision = pick_precision(device, precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def make_grad_scaler(device: torch.device | str, precision: str) -> torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` for ``device``, enabled only for ``"fp16"``.

    fp16's smallest normal number is about 6.1e-5: small gradients underflow to zero unless the
    loss is scaled up before ``backward`` (and the gradients scaled down before the step). bf16
    has float32's 8-bit exponent (the same range), so its gradients do not underflow where
    fp32's would not, and fp32 needs nothing: for both, the returned scaler is disabled, and
    ``scale``, ``unscale_``, ``step`` and ``update`` pass through (``scale(loss)`` returns
    ``loss`` itself, ``step`` calls ``optimizer.step()``)."""
    device = _device(device)
    precision = pick_precision(device, precision)
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
