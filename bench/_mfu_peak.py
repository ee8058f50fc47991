"""This machine's dense matmul peak, measured in the calling process (bench/mfu.py).

The peak is the best FLOP/s of square ``n x n @ n x n`` products (``2·n³`` FLOPs each) over a
few sizes and repetitions, after one warm-up product per size: what this process, with its
thread setting, can reach on the operation the model's FLOPs are made of. fp32 always; bf16
where the device runs it natively (CUDA with bf16 support; on the CPU bf16 is measured and
reported, and marked emulated when it is slower than fp32). On CUDA, fp32 is measured with
TF32 off (true fp32) and the bf16 figure is the one the bf16 training steps are compared with.
"""

from __future__ import annotations

import time
from typing import Any

# Known dense (no sparsity) bf16 peaks from the vendors' data sheets, TFLOP/s, by device name.
SPEC_BF16_TFLOPS = {
    "H100 80GB HBM3": 989.4,  # SXM
    "H100 SXM": 989.4,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.4,
    "A100": 312.0,
    "L40S": 362.0,
}


def spec_bf16_tflops(device_name: str) -> float | None:
    """The data-sheet dense bf16 peak of a GPU, matched on its name (None when unknown)."""
    for key, value in SPEC_BF16_TFLOPS.items():
        if key in device_name:
            return value
    return None


def _time_matmul(n: int, dtype: Any, device: str, reps: int) -> float:
    """Best seconds of one ``n x n`` product over ``reps`` (after a warm-up)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        inner = 10  # several products per event pair: launch gaps vanish
        for _ in range(reps):
            start.record()
            for _ in range(inner):
                torch.mm(a, b)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1000 / inner)
        return best
    for _ in range(reps):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return best


def measure_peak(device: str, dtype_name: str, sizes: list[int], reps: int) -> dict[str, Any]:
    """Best FLOP/s of square matmuls of ``sizes`` in ``dtype_name`` ("fp32" or "bf16")."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    tf32 = torch.backends.cuda.matmul.allow_tf32 if device == "cuda" else None
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        per_size = {}
        for n in sizes:
            seconds = _time_matmul(n, dtype, device, reps)
            per_size[n] = 2 * n**3 / seconds
    finally:
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
    best_n = max(per_size, key=per_size.get)
    return {
        "dtype": dtype_name,
        "flops_per_s": per_size[best_n],
        "best_size": best_n,
        "per_size_flops_per_s": {str(n): v for n, v in per_size.items()},
        "reps": reps,
        "torch_threads": torch.get_num_threads(),
    }


def machine_peaks(device: str, quick: bool) -> dict[str, Any]:
    """fp32 and bf16 peaks of ``device`` (module doc)."""
    import torch

    if device == "cuda":
        sizes, reps = ([4096] if quick else [4096, 8192]), 5
    else:
        sizes, reps = ([1024] if quick else [1024, 2048]), (2 if quick else 3)
    peaks = {"fp32": measure_peak(device, "fp32", sizes, reps)}
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        peaks["bf16"] = None
    else:
        bf16 = measure_peak(device, "bf16", sizes, reps)
        bf16["emulated"] = device == "cpu" and bf16["flops_per_s"] < peaks["fp32"]["flops_per_s"]
        peaks["bf16"] = bf16
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        peaks["device_name"] = name
        spec = spec_bf16_tflops(name)
        peaks["spec_bf16_flops_per_s"] = spec * 1e12 if spec else None
    return peaks
