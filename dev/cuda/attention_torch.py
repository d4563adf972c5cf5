#!/usr/bin/env python3
"""Causal grouped-query attention in PyTorch's SDPA backends, at the shapes of
attention_check --sweep, for comparison with the cuDNN graphs train_llama runs:

  flash      torch's FlashAttention-2 kernels (SDPBackend.FLASH_ATTENTION)
  efficient  the memory-efficient (xformers-derived) kernels
  cudnn      torch's own cuDNN SDPA graphs (the cuDNN beside torch)
  fa3        flash_attn_interface (FlashAttention-3), only if it is installed

Same conventions as attention_check: 32 query heads and 8 key/value heads, 16,384
tokens per call (B = 16384 / T), bf16, fresh random inputs per shape. Times are
CUDA-event medians of 20 runs after 5 warm-up runs; forward alone, then backward
alone (forward outside the timed region, gradients of q, k and v). TFLOP/s count
causal work as attention_check does: forward 2 * 2 * B * H * T * T / 2 * D,
backward 2.5 times that.

  python3 dev/cuda/attention_torch.py [--seq-lens 2048 8192 32768] [--head-dims 64 128]
Prints one BENCH line per backend and shape, and --out appends JSON lines.
"""
import argparse
import json
import statistics
import sys


def timed(fn, torch, runs=20, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def backends(torch):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return run

    found = {"flash": (sdpa(SDPBackend.FLASH_ATTENTION), "bhtd"),
             "efficient": (sdpa(SDPBackend.EFFICIENT_ATTENTION), "bhtd"),
             "cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), "bhtd")}
    try:
        import flash_attn_interface  # FlashAttention-3 (Hopper)

        def fa3(q, k, v):
            out = flash_attn_interface.flash_attn_func(q, k, v, causal=True)
            return out[0] if isinstance(out, tuple) else out
        found["fa3"] = (fa3, "bthd")
    except ImportError:
        print("fa3: flash_attn_interface is not installed here; skipped")
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[2048, 8192, 32768])
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--tokens", type=int, default=16384, help="B * T per call")
    p.add_argument("--out", default=None, help="append JSON lines here")
    args = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device (this benchmark runs on the GPU machine)")
    H, KV = 32, 8
    print("torch %s, cuDNN %s, %s" % (torch.__version__, torch.backends.cudnn.version(),
                                       torch.cuda.get_device_name()))
    found = backends(torch)
    torch.manual_seed(1234)
    for D in args.head_dims:
        for T in args.seq_lens:
            B = max(1, args.tokens // T)
            fwd_flops = 2.0 * 2.0 * B * H * T * T / 2 * D
            for name, (fn, layout) in found.items():
                shape_q = (B, H, T, D) if layout == "bhtd" else (B, T, H, D)
                shape_kv = (B, KV, T, D) if layout == "bhtd" else (B, T, KV, D)
                q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                rec = dict(system="torch_" + name, B=B, T=T, H=H, KV=KV, D=D, torch=torch.__version__)
                try:
                    with torch.no_grad():
                        fwd = timed(lambda: fn(q, k, v), torch)
                    out = fn(q, k, v)
                    dout = torch.randn_like(out)
                    bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), torch)
                    rec.update(fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=fwd_flops / fwd / 1e9,
                               bwd_tflops=2.5 * fwd_flops / bwd / 1e9)
                    print("BENCH %-16s D=%-3d B=%-2d T=%-6d forward %8.3f ms (%5.0f TFLOP/s)  backward %8.3f ms "
                          "(%5.0f TFLOP/s)  both %8.3f ms" % (rec["system"], D, B, T, fwd, rec["fwd_tflops"], bwd,
                                                              rec["bwd_tflops"], fwd + bwd))
                except RuntimeError as e:  # a backend that does not take this shape says so, the others go on
                    rec["error"] = str(e).splitlines()[0][:200]
                    print("BENCH %-16s D=%-3d B=%-2d T=%-6d not run: %s" % (rec["system"], D, B, T, rec["error"]))
                del q, k, v
                torch.cuda.empty_cache()
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
