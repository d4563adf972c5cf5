"""How far bf16 flash attention's gradients are from fp64, with PyTorch's own
kernels, on the inputs attention_check.cu uses (uniform in [-1, 1], causal,
grouped-query): the yardstick for attention_check's tolerances.

  python3 dev/cuda/attention_precision.py      (on the GPU machine)
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def rel_err(got, ref):
    # the metric of check_common.h's check_close with a floor at the rms
    floor = ref.pow(2).mean().sqrt()
    err = (got - ref).abs() / torch.maximum(ref.abs(), floor)
    worst = int(err.argmax())
    return float(err.max()), worst


def run(B, T, H, KV, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.rand(B, n, T, D, device="cuda", generator=g) * 2 - 1 for n in (H, KV, KV, H))
    q, k, v, do = (x.bfloat16() for x in (q, k, v, do))
    ref = []
    for x in (q, k, v):
        ref.append(x.double().requires_grad_())
    out = F.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=True)
    out.backward(do.double())
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        try:
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(*xs, is_causal=True, enable_gqa=True)
                o.backward(do)
        except RuntimeError as e:
            print(f"  {backend.name}: not available ({str(e).splitlines()[0][:80]})")
            continue
        parts = []
        for name, x, r in zip(("dq", "dk", "dv"), xs, ref):
            e, worst = rel_err(x.grad.double(), r.grad)
            t = worst // D % T
            parts.append(f"{name} {e:.2e} (t={t})")
        e_out, _ = rel_err(o.double(), out.detach())
        print(f"  {backend.name:20s} out {e_out:.2e}  " + "  ".join(parts))


for shape in [(2, 37, 4, 2, 16), (2, 37, 4, 2, 64), (1, 130, 8, 2, 128), (2, 64, 4, 4, 32)]:
    for seed in (1, 2):
        print(f"B={shape[0]} T={shape[1]} H={shape[2]} KV={shape[3]} D={shape[4]} seed {seed}")
        run(*shape, seed)
