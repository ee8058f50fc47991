"""Left padding under sdpa on a GPU: does a fully masked query row give NaN, and does
``trainers.core.logprobs.padding_sees_itself`` remove it? (bench/gpu/README.md, issue 18)

Two checks, each with and without the 4-D mask in which a padding position sees itself:

1. the kernel alone: ``scaled_dot_product_attention`` on rows whose first positions are
   left padding, per backend (math, memory-efficient, cuDNN, flash), bf16 and fp32: NaN in the
   output of the real positions, NaN anywhere in the gradients of q, k, v;
2. the policy-gradient forward: ``split_completion_logps`` on left-padded
   ``[prompt | completion]`` rows of a Qwen3-0.6B-shaped random model (bf16, sdpa), then backward:
   how many parameter gradients hold a NaN, and how far the real log-probs moved.

    python bench/gpu/padding_nan.py --out padding_nan.json [--device cpu --shape tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]


def kernel_check(device: str) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    batch, heads, width, dim = 4, 4, 64, 64
    keys = torch.ones(batch, width, dtype=torch.bool, device=device)
    keys[0, :10] = False  # rows 0 and 2 start with left padding
    keys[2, :37] = False
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    plain = (causal & keys[:, None, :])[:, None]
    fixed = plain | torch.eye(width, dtype=torch.bool, device=device)
    real = keys[:, None, :, None]
    out = []
    for backend in ("MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "FLASH_ATTENTION"):
        for dtype in (torch.bfloat16, torch.float32):
            for name, mask in (("2d-equivalent", plain), ("padding_sees_itself", fixed)):
                row = {"backend": backend, "dtype": str(dtype), "mask": name}
                q, k, v = (
                    torch.randn(
                        batch, heads, width, dim, device=device, dtype=dtype
                    ).requires_grad_()
                    for _ in range(3)
                )
                try:
                    with sdpa_kernel([getattr(SDPBackend, backend)]):
                        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                        (o * real).float().sum().backward()
                    row["out_nan_real"] = bool((o * real).isnan().any())
                    row["out_nan_padding"] = bool(o[~real.expand_as(o)].isnan().any())
                    row["grad_nan"] = {
                        n: bool(t.grad.isnan().any()) for n, t in zip("qkv", (q, k, v), strict=True)
                    }
                except Exception as err:  # a backend that refuses this input
                    row["error"] = f"{type(err).__name__}: {str(err)[:160]}"
                out.append(row)
                print(row, flush=True)
    return out


def model_check(device: str, shape: str, workdir: Path) -> dict:
    import torch
    from _mfu_setup import build_qwen3

    import trainers.core.logprobs as L
    from trainers.core.models import load_causal_lm
    from trainers.core.tiny import ensure_preset

    folder = build_qwen3(workdir / "m", device) if shape == "qwen3-0.6b" else ensure_preset(shape)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = load_causal_lm(str(folder), trainable=True, dtype=dtype, device=device)
    print("attention:", model.config._attn_implementation, flush=True)
    gen = torch.Generator().manual_seed(0)
    vocab = min(model.config.vocab_size, 30000)
    lengths = [17, 64, 33, 64, 5, 48, 64, 21]  # a GRPO micro-batch: 4 prompts x 2 rows
    prompts = [torch.randint(10, vocab, (n,), generator=gen).tolist() for n in lengths[::2]]
    prompts = [p for p in prompts for _ in range(2)]
    completions = [torch.randint(10, vocab, (n,), generator=gen).tolist() for n in (64, 40) * 4]
    ids, attn, cmask, width_p = L.split_rows(prompts, completions, 0)
    ids, attn, cmask = ids.to(device), attn.to(device), cmask.to(device)
    original = L.padding_sees_itself
    result = {"attention": model.config._attn_implementation, "rows": len(prompts)}
    sums = {}
    for name, fn in (("2d-mask", lambda module, mask: mask), ("padding_sees_itself", original)):
        L.padding_sees_itself = fn
        try:
            for shared in (True, False):  # the prompt-sharing path and the full-row path
                model.zero_grad(set_to_none=True)
                rows = (ids, attn, cmask) if shared else (ids[::2], attn[::2], cmask[::2])
                total, _ = L.split_completion_logps(model, rows[0], rows[1], width_p, rows[2])
                total.sum().backward()
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                key = f"{name}/{'shared' if shared else 'full-row'}"
                sums[key] = total.detach().float().cpu()
                result[key] = {
                    "logps_nan": bool(total.isnan().any()),
                    "params_with_nan_grad": sum(int(g.isnan().any()) for g in grads),
                    "params_with_grad": len(grads),
                    "grad_norm": float(
                        torch.linalg.vector_norm(
                            torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
                        )
                    ),
                }
                print(key, result[key], flush=True)
        finally:
            L.padding_sees_itself = original
    for part in ("shared", "full-row"):
        a, b = sums[f"2d-mask/{part}"], sums[f"padding_sees_itself/{part}"]
        result[f"max_abs_logps_diff/{part}"] = float((a - b).abs().max())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--out", type=Path, default=Path("padding_nan.json"))
    args = parser.parse_args()
    import torch

    results: dict = {"torch": torch.__version__}
    if args.device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    results["kernel"] = kernel_check(args.device)
    args.out.write_text(json.dumps(results, indent=1))
    with tempfile.TemporaryDirectory() as tmp:
        results["model"] = model_check(args.device, args.shape, Path(tmp))
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["model"], indent=1))


if __name__ == "__main__":
    main()
