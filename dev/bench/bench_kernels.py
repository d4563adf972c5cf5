#!/usr/bin/env python3
"""
Per-kernel benchmark: the project's CUDA kernels (llmc/*.h through
dev/bench/libllmc_kernels.so and ctypes) against Liger-Kernel's Triton kernels,
eager PyTorch (the HF-style math) and torch.compile of the eager code, at Liger's
Llama 3 8B benchmark shapes (hidden 4096, intermediate 14336, vocab 128256,
32 query / 8 KV heads of 128, B*T tokens from 4096 to 32768, T = 4096).

Kernels and implementations
  rmsnorm            [N, C] bf16, bf16 weight, eps 1e-5. llmc (dweight bf16, overwritten) / liger
                     (LigerRMSNormFunction, casting "llama", in_place=True: its default) / torch (HF
                     LlamaRMSNorm math)
  fused_add_rmsnorm  s = x + r, y = rmsnorm(s); outputs y and s, gradients dy and ds.
                     llmc (fused_residual_rmsnorm_forward; backward = rmsnorm_backward adding
                     into the residual gradient ds) / liger (LigerFusedAddRMSNormFunction,
                     in_place=False) / torch
  rope               q [B,H,T,D], k [B,KV,T,D] (stored [B,T,heads,D], as after q_proj/k_proj),
                     Llama 3.1 frequencies (theta 5e5, factor 8). llmc works in place on the fused
                     qkv [B,T,H+2KV,D] (v untouched); liger (LigerRopeFunction, in place on q, k)
                     and torch (HF rotate_half) get separate q and k and HF-style bf16 cos/sin.
  swiglu             gate_up [N, 2F] (gate first), out [N, F]. llmc / liger (LigerSiLUMulFunction on
                     separate contiguous gate and up [N, F], what LigerSwiGLUMLP runs) / liger_fused
                     (LigerFusedGateUpSiLUMulFunction on [N, 2F], in_place=False) / torch
                     (F.silu(g) * u on the halves of gate_up)
  flce               x [N, C] bf16, W [V, C] bf16, random targets, mean loss. llmc
                     (fused_classifier_forward_backward, logits chunk from --logits-budget-mb; dW bf16)
                     / liger (LigerFusedLinearCrossEntropyFunction, bf16 dW accumulation: its
                     default) / liger_fp32_accum (accum_dtype=torch.float32) / torch
                     (logits = x @ W.T, F.cross_entropy on logits.float())
  adamw              one flat tensor: grad-norm clip (1.0) + AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8,
                     wd 0.1) + the bf16 weights, from the same fp32 master and the same gradients
                     (bf16 values). llmc (global_norm_squared + clip_coefficient + adamw_update, one
                     decay run: the fp32 master as bf16 param + int16 master_lo, bf16 grad, fp32 m, v)
                     / torch (fp32 master and grad; clip_grad_norm_ foreach + AdamW foreach + copy_
                     to a bf16 copy) / torch_fused (AdamW fused=True) / torch_compile (the foreach
                     step under torch.compile).
                     Sizes: 8b_layer (4096 x 14336) and 1b_model (Llama 3.2 1B, 1.236e9 params).
  torch_compile: torch.compile(eager function, dynamic=False), by default at one token count
  (--compile one, --compile-tokens) because every shape compiles anew.

Directions
  forward   training forward (inputs require grad; autograd graph built). flce: loss only
            (no gradients: inputs detached / llmc_fused_classifier_forward), Liger's
            "no-grad-forward".
  backward  backward alone: torch/liger rerun the forward before each timed run, outside the
            events; llmc calls its backward launcher on saved activations.
  full      forward + backward.      step (adamw): one optimizer step.

Timing (do_bench-like): CUDA events around each call, a 256 MB L2 flush before each,
warm-up of --warmup-ms, then max(--min-runs, --rep-ms / estimate) runs (at most
--max-runs); median and 20%/80% quantiles. Inputs are fresh torch.randn (never zeros).
Memory: peak_mem_gib = torch.cuda.max_memory_allocated() during one call minus
memory_allocated() just before it (so inputs, weights, saved activations for backward are
excluded), plus the bytes of buffers llmc needs preallocated (its outputs and scratch, and
for flce the 32 MiB cuBLASLt workspace, which is cudaMalloc'd outside torch's allocator).
Bandwidth: gbps = minimum bytes of the op (each input read once, each output written once:
formulas in min_bytes below; per implementation for adamw, whose state's dtypes differ) /
median time; pct_of_copy against a device-to-device copy (bytes read + written) measured in
the same run. flce: tflops = 2*N*C*V per GEMM
(forward 1 GEMM, full 3) / time; pct_of_gemm against torch.matmul bf16 8192^3 in the same run.
Correctness: before timing, every impl runs once on clones of the same inputs and its
outputs (forward and gradients) are compared with the eager torch math run in fp32 on the
same (bf16-valued) inputs: check_rel_err = max over outputs of ||out - ref||_2 / ||ref||_2;
check_ok = rel_err <= the kernel's tolerance (TOL below). Failed checks are flagged in the
records and the table ("!").

Output: one JSON line per (kernel, impl, direction, size) appended to --out, and a table.
Usage: python3 dev/bench/bench_kernels.py [--quick] [--kernels rmsnorm,rope] [--tokens 4096,8192]
       python3 dev/bench/bench_kernels.py --dry-run     (the plan; needs no torch, no GPU)
"""
import argparse
import ctypes
import datetime
import gc
import importlib
import json
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB = os.path.join(HERE, "libllmc_kernels.so")
DEFAULT_OUT = os.path.join(HERE, "results", "kernels.jsonl")
CAPI_VERSION = 2

# Llama 3 8B (Liger's benchmark model) and the Llama 3.2 1B for the full-model AdamW.
HIDDEN, INTERMEDIATE, VOCAB = 4096, 14336, 128256
N_HEAD, N_KV_HEAD, HEAD_DIM, SEQ = 32, 8, 128, 4096
NORM_EPS = 1e-5
ROPE = dict(theta=500000.0, llama3_scaling=1, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_pos=8192)
ADAMW = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0)


def llama_1b_params():
    V, C, L, H, KV, D, F = 128256, 2048, 16, 32, 8, 64, 8192
    layer = 2 * C + C * H * D + 2 * C * KV * D + H * D * C + 3 * C * F
    return V * C + L * layer + C  # tied embeddings


ADAMW_SIZES = {"8b_layer": HIDDEN * INTERMEDIATE, "1b_model": llama_1b_params()}

KERNELS = ["rmsnorm", "fused_add_rmsnorm", "rope", "swiglu", "flce", "adamw"]
IMPLS = {
    "rmsnorm": ["llmc", "liger", "torch", "torch_compile"],
    "fused_add_rmsnorm": ["llmc", "liger", "torch", "torch_compile"],
    "rope": ["llmc", "liger", "torch", "torch_compile"],
    "swiglu": ["llmc", "liger", "liger_fused", "torch", "torch_compile"],
    "flce": ["llmc", "liger", "liger_fp32_accum", "torch", "torch_compile"],
    "adamw": ["llmc", "torch", "torch_fused", "torch_compile"],
}
DIRECTIONS = {k: ["forward", "backward", "full"] for k in ["rmsnorm", "fused_add_rmsnorm", "rope", "swiglu"]}
DIRECTIONS["flce"] = ["forward", "full"]
DIRECTIONS["adamw"] = ["step"]
# Relative-error tolerances (||out - ref|| / ||ref||) against the fp32 eager math: bf16 outputs
# carry ~1e-3 of rounding; Liger's bf16 dW accumulation in flce and its bf16 RoPE arithmetic a
# few times more. A real bug (wrong index, sign, scale) gives O(1).
TOL = {"rmsnorm": 2e-2, "fused_add_rmsnorm": 2e-2, "rope": 2e-2, "swiglu": 2e-2, "flce": 2e-2, "adamw": 1e-3}


def shape_of(kernel, size):
    """Shape fields of a record; size is tokens (B*T) or, for adamw, a size label."""
    if kernel == "adamw":
        return {"n_params": ADAMW_SIZES[size], "size": size}
    N = int(size)
    if kernel in ("rmsnorm", "fused_add_rmsnorm"):
        return {"N": N, "C": HIDDEN}
    if kernel == "rope":
        T = min(SEQ, N)
        if N % T:
            raise ValueError(f"rope: tokens {N} must be a multiple of T = {T}")
        return {"B": N // T, "T": T, "H": N_HEAD, "KV": N_KV_HEAD, "D": HEAD_DIM}
    if kernel == "swiglu":
        return {"N": N, "F": INTERMEDIATE}
    if kernel == "flce":
        return {"N": N, "C": HIDDEN, "V": VOCAB}
    raise ValueError(kernel)


def min_bytes(kernel, direction, s, impl=None):
    """Bytes that must move: each input read once, each output written once (bf16 = 2 bytes).
    Small terms (weights of size C, rstd, the RoPE table) are left out."""
    if kernel == "rmsnorm":  # fwd: x -> y; bwd: dy, x -> dx
        b = {"forward": 4, "backward": 6}
        nc = s["N"] * s["C"]
        return nc * (b["forward"] + b["backward"] if direction == "full" else b[direction])
    if kernel == "fused_add_rmsnorm":  # fwd: x, r -> y, s; bwd: dy, ds, s -> dx (= dr)
        nc = s["N"] * s["C"]
        return nc * (16 if direction == "full" else 8)
    if kernel == "rope":  # q and k read and written, each direction
        e = s["B"] * s["T"] * (s["H"] + s["KV"]) * s["D"]
        return e * (8 if direction == "full" else 4)
    if kernel == "swiglu":  # fwd: gate_up -> out; bwd: gate_up, dout -> dgate_up
        nf = s["N"] * s["F"]
        return nf * {"forward": 6, "backward": 10, "full": 16}[direction]
    if kernel == "adamw":
        # llmc: read param (bf16), master_lo (int16), grad (bf16), m, v (fp32); write param, master_lo, m, v: 26.
        # torch: read master, grad, m, v (fp32); write master, m, v (fp32), the bf16 copy: 30.
        return s["n_params"] * (26 if impl == "llmc" else 30)
    return None


def min_flops(kernel, direction, s):
    if kernel == "flce":
        gemm = 2.0 * s["N"] * s["C"] * s["V"]
        return gemm * (1 if direction == "forward" else 3)
    return None


# ----------------------------------------------------------------------------------------------
# the shared library


class Lib:
    """ctypes bindings of dev/bench/kernels_capi.cu. Pointers are ints (tensor.data_ptr())."""

    P, I, F, I64, SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64, ctypes.c_size_t
    SIGNATURES = {
        "llmc_capi_version": ([], I),
        "llmc_cuda_runtime_version": ([], I),
        "llmc_init": ([], None),
        "llmc_matmul_workspace_bytes": ([], SZ),
        "llmc_rmsnorm_forward": ([P, P, P, P, I, I, F, P], None),
        "llmc_fused_residual_rmsnorm_forward": ([P, P, P, P, P, P, I, I, F, P], None),
        "llmc_rmsnorm_backward_scratch_floats": ([I, I], SZ),
        "llmc_rmsnorm_backward": ([P, P, P, P, P, P, P, I, I, I, P], None),
        "llmc_rope_table": ([P, I, I, F, I, F, F, F, I], None),
        "llmc_rope_forward": ([P, P, I, I, I, I, I, P], None),
        "llmc_rope_backward": ([P, P, I, I, I, I, I, P], None),
        "llmc_swiglu_forward": ([P, P, I, I, P], None),
        "llmc_swiglu_backward": ([P, P, P, I, I, P], None),
        "llmc_fused_classifier_chunk_rows": ([I, I, SZ], I),
        "llmc_fused_classifier_forward_backward": ([P, P, P, P, P, P, P, I, I, I, I, F, I, P], None),
        "llmc_fused_classifier_forward": ([P, P, P, P, P, I, I, I, I, P], None),
        "llmc_loss_sum": ([P, P, I, P], None),
        "llmc_norm_scratch_floats": ([], I),
        "llmc_global_norm_squared": ([P, P, P, I64, P], None),
        "llmc_clip_coefficient": ([P, P, F, P], None),
        "llmc_master_split": ([P, P, P, I64, P], None),
        "llmc_master_join": ([P, P, P, I64, P], None),
        "llmc_adamw_runs_create": ([P, P, I], P),
        "llmc_adamw_runs_free": ([P], None),
        "llmc_adamw_update": ([P, P, P, P, P, I64, I64, P, F, F, F, F, F, P, I, P], None),
        "llmc_adamw_step": ([P, P, P, P, P, I64, P, F, F, F, F, F, F, I, P, P], None),
    }

    def __init__(self, path):
        self.path = path
        self.so = ctypes.CDLL(path)
        for name, (args, res) in self.SIGNATURES.items():
            fn = getattr(self.so, name)
            fn.argtypes = args
            fn.restype = res
            setattr(self, name[len("llmc_"):], fn)
        v = self.capi_version()
        if v != CAPI_VERSION:
            raise RuntimeError(f"{path}: C API version {v}, this script wants {CAPI_VERSION}: rebuild it")

    def rope_table_host(self, T, D):
        """[T, D/2, 2] fp32 (cos, sin) as a flat Python-owned ctypes array."""
        buf = (ctypes.c_float * (T * D))()
        self.rope_table(ctypes.cast(buf, ctypes.c_void_p), T, D, ROPE["theta"], ROPE["llama3_scaling"],
                        ROPE["factor"], ROPE["low_freq_factor"], ROPE["high_freq_factor"], ROPE["original_max_pos"])
        return buf


# ----------------------------------------------------------------------------------------------
# timing, memory, checks (torch imported in main)

torch = None
F = None
DEVICE = "cuda"


class Bench:
    def __init__(self, args):
        self.args = args
        self.flush_buf = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=DEVICE)
        self.stream_handle = None

    def stream(self):
        return torch.cuda.current_stream().cuda_stream

    def time(self, fn, prep=None):
        """(median, q20, q80, n) in ms of fn, each run after prep() and an L2 flush."""
        a = self.args
        if prep:
            prep()
        fn()
        torch.cuda.synchronize()
        est = []
        for _ in range(3):
            if prep:
                prep()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.flush_buf.zero_()
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            est.append(s.elapsed_time(e))
        estimate = max(sorted(est)[1], 1e-3)
        n_warm = max(1, min(100, int(a.warmup_ms / estimate)))
        n = max(a.min_runs, min(a.max_runs, int(a.rep_ms / estimate)))
        for _ in range(n_warm):
            if prep:
                prep()
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            if prep:
                prep()
            self.flush_buf.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        return quantile(t, 0.5), quantile(t, 0.2), quantile(t, 0.8), n

    def peak(self, fn, prep=None, prealloc_bytes=0):
        """GiB that one call of fn needs beyond what is allocated before it (see the module doc)."""
        if prep:
            prep()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base + prealloc_bytes) / 2**30


def quantile(sorted_vals, q):
    """Linear interpolation, as torch.quantile."""
    pos = (len(sorted_vals) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def rel_err(out, ref):
    """||out - ref||_2 / ||ref||_2, in float64 over chunks (no full-size float64 copies)."""
    o = out.detach().reshape(-1)
    r = ref.detach().reshape(-1)
    if o.numel() != r.numel():
        raise ValueError(f"check: {tuple(out.shape)} output against a {tuple(ref.shape)} reference")
    num = den = 0.0
    step = 1 << 25
    for i in range(0, r.numel(), step):
        rc = r[i:i + step].double()
        num += (o[i:i + step].double() - rc).square().sum().item()
        den += rc.square().sum().item()
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def compare(outs, refs):
    """max rel err over the names both dicts have, and the per-output errors."""
    errs = {k: rel_err(outs[k], refs[k]) for k in refs if k in outs}
    if not errs:
        return None, {}
    return max(errs.values()), errs


def rnd(*shape, dtype=None, scale=1.0, shift=0.0):
    """Fresh N(shift, scale^2) values, generated in the target dtype (no fp32 temporaries)."""
    t = torch.randn(*shape, device=DEVICE, dtype=dtype or torch.bfloat16)
    if scale != 1.0:
        t.mul_(scale)
    if shift != 0.0:
        t.add_(shift)
    return t


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def ptr(t):
    return t.data_ptr()


class Impl:
    """One implementation at one shape: check() -> dict of outputs (fwd and grads) on fresh
    clones; dirs: direction -> (fn, prep or None, prealloc_bytes)."""

    def __init__(self):
        self.dirs = {}
        self.notes = ""
        self.compile_s = None

    def check(self):
        raise NotImplementedError


def autograd_dirs(fwd, leaves, grads):
    """forward / backward / full directions of an autograd function fwd() -> tuple of outputs."""
    state = {}

    def clear():
        for t in leaves:
            t.grad = None

    def forward():
        state["fwd"] = fwd()  # kept until the next call: graph and outputs live as in training

    def prep_forward():
        state.pop("fwd", None)

    def prep_backward():
        clear()
        state["outs"] = fwd()

    def backward():
        torch.autograd.backward(state.pop("outs"), grads)

    def full():
        torch.autograd.backward(fwd(), grads)

    return {"forward": (forward, prep_forward, 0), "backward": (backward, prep_backward, 0),
            "full": (full, clear, 0)}


def run_autograd_check(fwd, leaves, grads, out_names, grad_names):
    outs = fwd()
    res = {n: o.detach().float().clone() for n, o in zip(out_names, outs)}
    torch.autograd.backward(outs, grads)
    for n, t in zip(grad_names, leaves):
        if n is not None:
            res[n] = t.grad.detach().float().clone()
    return res


_compiled = {}


def compiled(fn):
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn, dynamic=False)
    return _compiled[fn]


def timed_first_call(impl, fn):
    t0 = time.time()
    r = fn()
    torch.cuda.synchronize()
    impl.compile_s = time.time() - t0
    return r


def warm_compile(impl, f, leaves, grads):
    """First forward + backward of a torch.compile'd function (both graphs compile), timed."""
    t0 = time.time()
    torch.autograd.backward(f(), grads)
    torch.cuda.synchronize()
    impl.compile_s = time.time() - t0
    for t in leaves:
        t.grad = None


# ----------------------------------------------------------------------------------------------
# eager reference math (HF style); also run in fp32 for the checks


def rmsnorm_torch(x, w, eps=NORM_EPS):
    dt = x.dtype
    h = x.float()
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dt)


def fused_add_rmsnorm_torch(x, r, w, eps=NORM_EPS):
    s = x + r
    return rmsnorm_torch(s, w, eps), s


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_torch(q, k, cos, sin):
    """HF apply_rotary_pos_emb: q [B,H,T,D], cos/sin [1,T,D] (unsqueeze_dim=1)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def swiglu_torch(gate_up):
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def flce_torch(x, W, y):
    logits = x @ W.t()
    return F.cross_entropy(logits.float(), y)


# ----------------------------------------------------------------------------------------------
# kernels: inputs, fp32 reference, implementations


class RMSNorm:
    name = "rmsnorm"

    def __init__(self, ctx, s):
        self.ctx, self.s = ctx, s
        N, C = s["N"], s["C"]
        self.x = rnd(N, C)
        self.w = rnd(C, scale=0.1, shift=1.0)
        self.dy = rnd(N, C)

    def reference(self):
        x, w = leaf(self.x.float()), leaf(self.w.float())
        return run_autograd_check(lambda: (rmsnorm_torch(x, w),), [x, w], [self.dy.float()], ["y"], ["dx", "dw"])

    def make(self, impl):
        if impl == "llmc":
            return self.llmc()
        if impl == "liger":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            fn = lambda x, w: LigerRMSNormFunction.apply(x, w, NORM_EPS, 0.0, "llama", True)  # noqa: E731
            return self.autograd(fn, "LigerRMSNormFunction casting=llama in_place=True (dy is overwritten)")
        if impl == "torch":
            return self.autograd(rmsnorm_torch, "HF LlamaRMSNorm math")
        if impl == "torch_compile":
            return self.autograd(compiled(rmsnorm_torch), "torch.compile(HF math, dynamic=False)", compile_=True)
        raise ValueError(impl)

    def autograd(self, fn, notes, compile_=False):
        x, w, dy = leaf(self.x), leaf(self.w), self.dy.clone()
        im = Impl()
        im.notes = notes
        fwd = lambda: (fn(x, w),)  # noqa: E731

        def check():
            xc, wc = leaf(self.x), leaf(self.w)
            f = lambda: (fn(xc, wc),)  # noqa: E731
            if compile_:
                warm_compile(im, f, [xc, wc], [self.dy.clone()])
            return run_autograd_check(f, [xc, wc], [self.dy.clone()], ["y"], ["dx", "dw"])

        im.check = check
        im.dirs = autograd_dirs(fwd, [x, w], [dy])
        return im

    def llmc(self):
        lib, st = self.ctx.lib, self.ctx.bench.stream
        N, C = self.s["N"], self.s["C"]
        x, w, dy = self.x, self.w, self.dy
        y = torch.empty_like(x)
        rstd = torch.empty(N, device=DEVICE, dtype=torch.float32)
        dx = torch.zeros_like(x)
        dw = torch.empty(C, device=DEVICE, dtype=torch.bfloat16)  # overwritten: accumulate = 0
        scratch = torch.empty(lib.rmsnorm_backward_scratch_floats(N, C), device=DEVICE, dtype=torch.float32)

        def fwd():
            lib.rmsnorm_forward(ptr(y), ptr(rstd), ptr(x), ptr(w), N, C, NORM_EPS, st())

        def bwd():
            lib.rmsnorm_backward(ptr(dx), ptr(dw), ptr(scratch), ptr(dy), ptr(x), ptr(w), ptr(rstd), N, C, 0, st())

        def full():
            fwd()
            bwd()

        def check():
            dx.zero_()
            fwd()
            bwd()
            return {"y": y.float().clone(), "dx": dx.float().clone(), "dw": dw.float()}

        im = Impl()
        im.notes = ("backward adds into dinp (the trainer's residual-gradient accumulation), zeroed for the check; "
                    "dweight bf16, overwritten (accumulate=0)")
        im.check = check
        fb = y.numel() * 2 + N * 4
        bb = dx.numel() * 2 + C * 2 + scratch.numel() * 4
        im.dirs = {"forward": (fwd, None, fb), "backward": (bwd, None, bb), "full": (full, None, fb + bb)}
        fwd()
        return im


class FusedAddRMSNorm(RMSNorm):
    name = "fused_add_rmsnorm"

    def __init__(self, ctx, s):
        super().__init__(ctx, s)
        N, C = s["N"], s["C"]
        self.r = rnd(N, C)
        self.ds = rnd(N, C)

    def reference(self):
        x, r, w = leaf(self.x.float()), leaf(self.r.float()), leaf(self.w.float())
        return run_autograd_check(lambda: fused_add_rmsnorm_torch(x, r, w), [x, r, w],
                                  [self.dy.float(), self.ds.float()], ["y", "s"], ["dx", "dr", "dw"])

    def make(self, impl):
        if impl == "llmc":
            return self.llmc()
        if impl == "liger":
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
            fn = lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, NORM_EPS, 0.0, "llama", False)  # noqa
            return self.autograd(fn, "LigerFusedAddRMSNormFunction casting=llama in_place=False")
        if impl == "torch":
            return self.autograd(fused_add_rmsnorm_torch, "x + r, then HF LlamaRMSNorm math")
        if impl == "torch_compile":
            return self.autograd(compiled(fused_add_rmsnorm_torch), "torch.compile(eager, dynamic=False)",
                                 compile_=True)
        raise ValueError(impl)

    def autograd(self, fn, notes, compile_=False):
        x, r, w = leaf(self.x), leaf(self.r), leaf(self.w)
        grads = [self.dy.clone(), self.ds.clone()]
        im = Impl()
        im.notes = notes
        fwd = lambda: tuple(fn(x, r, w))  # noqa: E731

        def check():
            xc, rc, wc = leaf(self.x), leaf(self.r), leaf(self.w)
            f = lambda: tuple(fn(xc, rc, wc))  # noqa: E731
            if compile_:
                warm_compile(im, f, [xc, rc, wc], [self.dy.clone(), self.ds.clone()])
            return run_autograd_check(f, [xc, rc, wc], [self.dy.clone(), self.ds.clone()], ["y", "s"],
                                      ["dx", "dr", "dw"])

        im.check = check
        im.dirs = autograd_dirs(fwd, [x, r, w], grads)
        return im

    def llmc(self):
        lib, st = self.ctx.lib, self.ctx.bench.stream
        N, C = self.s["N"], self.s["C"]
        x, r, w, dy = self.x, self.r, self.w, self.dy
        y, s = torch.empty_like(x), torch.empty_like(x)
        rstd = torch.empty(N, device=DEVICE, dtype=torch.float32)
        dinp = self.ds.clone()  # the residual-stream gradient; backward adds the norm's dx into it
        dw = torch.empty(C, device=DEVICE, dtype=torch.bfloat16)  # overwritten: accumulate = 0
        scratch = torch.empty(lib.rmsnorm_backward_scratch_floats(N, C), device=DEVICE, dtype=torch.float32)

        def fwd():
            lib.fused_residual_rmsnorm_forward(ptr(s), ptr(y), ptr(rstd), ptr(x), ptr(r), ptr(w), N, C, NORM_EPS,
                                               st())

        def bwd():
            lib.rmsnorm_backward(ptr(dinp), ptr(dw), ptr(scratch), ptr(dy), ptr(s), ptr(w), ptr(rstd), N, C, 0, st())

        def full():
            fwd()
            bwd()

        def check():
            dinp.copy_(self.ds)
            fwd()
            bwd()
            d = dinp.float().clone()
            return {"y": y.float().clone(), "s": s.float().clone(), "dx": d, "dr": d, "dw": dw.float()}

        im = Impl()
        im.notes = ("fused_residual_rmsnorm_forward; backward = rmsnorm_backward adding dx into ds (dx = dr); "
                    "dweight bf16, overwritten (accumulate=0)")
        im.check = check
        fb = 2 * y.numel() * 2 + N * 4
        bb = dinp.numel() * 2 + C * 2 + scratch.numel() * 4
        im.dirs = {"forward": (fwd, None, fb), "backward": (bwd, None, bb), "full": (full, None, fb + bb)}
        fwd()
        return im


class Rope:
    name = "rope"

    def __init__(self, ctx, s):
        self.ctx, self.s = ctx, s
        B, T, H, KV, D = s["B"], s["T"], s["H"], s["KV"], s["D"]
        self.q = rnd(B, T, H, D)  # stored [B, T, heads, D]: the q_proj output layout
        self.k = rnd(B, T, KV, D)
        self.v = rnd(B, T, KV, D)
        self.dq = rnd(B, T, H, D)
        self.dk = rnd(B, T, KV, D)
        self.table = ctx.rope_table(T, D)  # [T, D/2, 2] fp32 on the device
        cos_half, sin_half = self.table[..., 0], self.table[..., 1]  # [T, D/2]
        self.cos32 = torch.cat([cos_half, cos_half], dim=-1).unsqueeze(0).contiguous()  # [1, T, D]
        self.sin32 = torch.cat([sin_half, sin_half], dim=-1).unsqueeze(0).contiguous()
        self.cos = self.cos32.to(torch.bfloat16)  # HF returns cos/sin in the activations' dtype
        self.sin = self.sin32.to(torch.bfloat16)

    def reference(self):
        q, k = leaf(self.q.float()), leaf(self.k.float())
        f = lambda: rope_torch(q.transpose(1, 2), k.transpose(1, 2), self.cos32, self.sin32)  # noqa: E731
        res = run_autograd_check(f, [q, k], [self.dq.float().transpose(1, 2), self.dk.float().transpose(1, 2)],
                                 ["q", "k"], ["dq", "dk"])
        res["q"] = res["q"].transpose(1, 2)  # to the stored [B, T, heads, D]
        res["k"] = res["k"].transpose(1, 2)
        return res

    def make(self, impl):
        if impl == "llmc":
            return self.llmc()
        if impl == "liger":
            from liger_kernel.ops.rope import LigerRopeFunction
            fn = lambda q, k, c, s: LigerRopeFunction.apply(q, k, c, s)  # noqa: E731
            return self.autograd(fn, "LigerRopeFunction, in place on q and k, bf16 cos/sin")
        if impl == "torch":
            return self.autograd(rope_torch, "HF apply_rotary_pos_emb (rotate_half), bf16 cos/sin")
        if impl == "torch_compile":
            return self.autograd(compiled(rope_torch), "torch.compile(HF rope, dynamic=False)", compile_=True)
        raise ValueError(impl)

    def autograd(self, fn, notes, compile_=False):
        q, k = leaf(self.q), leaf(self.k)
        grads = [self.dq.clone().transpose(1, 2), self.dk.clone().transpose(1, 2)]
        im = Impl()
        im.notes = notes
        fwd = lambda: tuple(fn(q.transpose(1, 2), k.transpose(1, 2), self.cos, self.sin))  # noqa: E731

        def check():
            qc, kc = leaf(self.q), leaf(self.k)
            f = lambda: tuple(fn(qc.transpose(1, 2), kc.transpose(1, 2), self.cos, self.sin))  # noqa: E731
            if compile_:
                warm_compile(im, f, [qc, kc], [self.dq.clone().transpose(1, 2), self.dk.clone().transpose(1, 2)])
            outs = f()
            res = {"q": outs[0].detach().transpose(1, 2).float().clone(),
                   "k": outs[1].detach().transpose(1, 2).float().clone()}
            torch.autograd.backward(outs, [self.dq.clone().transpose(1, 2), self.dk.clone().transpose(1, 2)])
            res["dq"] = qc.grad.float().clone()
            res["dk"] = kc.grad.float().clone()
            return res

        im.check = check
        im.dirs = autograd_dirs(fwd, [q, k], grads)
        return im

    def llmc(self):
        lib, st = self.ctx.lib, self.ctx.bench.stream
        B, T, H, KV, D = (self.s[k] for k in ("B", "T", "H", "KV", "D"))
        qkv = torch.cat([self.q, self.k, self.v], dim=2).contiguous()  # [B, T, H + 2KV, D]
        dqkv = torch.cat([self.dq, self.dk, self.v], dim=2).contiguous()
        tab = self.table

        def fwd():
            lib.rope_forward(ptr(qkv), ptr(tab), B, T, H, KV, D, st())

        def bwd():
            lib.rope_backward(ptr(dqkv), ptr(tab), B, T, H, KV, D, st())

        def full():
            fwd()
            bwd()

        def check():
            qkv.copy_(torch.cat([self.q, self.k, self.v], dim=2))
            dqkv.copy_(torch.cat([self.dq, self.dk, self.v], dim=2))
            fwd()
            bwd()
            return {"q": qkv[:, :, :H].float().clone(), "k": qkv[:, :, H:H + KV].float().clone(),
                    "dq": dqkv[:, :, :H].float().clone(), "dk": dqkv[:, :, H:H + KV].float().clone()}

        im = Impl()
        im.notes = "in place on the fused qkv [B,T,H+2KV,D] (v untouched), fp32 cos/sin table"
        im.check = check
        im.dirs = {"forward": (fwd, None, 0), "backward": (bwd, None, 0), "full": (full, None, 0)}
        return im


class SwiGLU:
    name = "swiglu"

    def __init__(self, ctx, s):
        self.ctx, self.s = ctx, s
        N, Fd = s["N"], s["F"]
        self.gu = rnd(N, 2 * Fd)
        self.dout = rnd(N, Fd)

    def reference(self):
        gu = leaf(self.gu.float())
        return run_autograd_check(lambda: (swiglu_torch(gu),), [gu], [self.dout.float()], ["out"], ["dgate_up"])

    def make(self, impl):
        if impl == "llmc":
            return self.llmc()
        if impl == "liger":
            return self.liger_split()
        if impl == "liger_fused":
            from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction
            fn = lambda gu: LigerFusedGateUpSiLUMulFunction.apply(gu, False)  # noqa: E731
            return self.autograd(fn, "LigerFusedGateUpSiLUMulFunction in_place=False on [N, 2F]")
        if impl == "torch":
            return self.autograd(swiglu_torch, "F.silu(g) * u on the halves of gate_up")
        if impl == "torch_compile":
            return self.autograd(compiled(swiglu_torch), "torch.compile(eager, dynamic=False)", compile_=True)
        raise ValueError(impl)

    def autograd(self, fn, notes, compile_=False):
        gu = leaf(self.gu)
        im = Impl()
        im.notes = notes
        fwd = lambda: (fn(gu),)  # noqa: E731

        def check():
            g = leaf(self.gu)
            f = lambda: (fn(g),)  # noqa: E731
            if compile_:
                warm_compile(im, f, [g], [self.dout.clone()])
            return run_autograd_check(f, [g], [self.dout.clone()], ["out"], ["dgate_up"])

        im.check = check
        im.dirs = autograd_dirs(fwd, [gu], [self.dout.clone()])
        return im

    def liger_split(self):
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        Fd = self.s["F"]
        a, b = leaf(self.gu[:, :Fd].contiguous()), leaf(self.gu[:, Fd:].contiguous())
        im = Impl()
        im.notes = "LigerSiLUMulFunction on separate contiguous gate/up [N, F]; its backward overwrites them"
        fwd = lambda: (LigerSiLUMulFunction.apply(a, b),)  # noqa: E731

        def check():
            ac, bc = leaf(self.gu[:, :Fd].contiguous()), leaf(self.gu[:, Fd:].contiguous())
            out = LigerSiLUMulFunction.apply(ac, bc)
            res = {"out": out.detach().float().clone()}
            out.backward(self.dout.clone())
            res["dgate_up"] = torch.cat([ac.grad, bc.grad], dim=-1).float()
            return res

        im.check = check
        im.dirs = autograd_dirs(fwd, [a, b], [self.dout.clone()])
        return im

    def llmc(self):
        lib, st = self.ctx.lib, self.ctx.bench.stream
        N, Fd = self.s["N"], self.s["F"]
        gu, dout = self.gu, self.dout
        out = torch.empty(N, Fd, device=DEVICE, dtype=torch.bfloat16)
        dgu = torch.empty_like(gu)

        def fwd():
            lib.swiglu_forward(ptr(out), ptr(gu), N, Fd, st())

        def bwd():
            lib.swiglu_backward(ptr(dgu), ptr(dout), ptr(gu), N, Fd, st())

        def full():
            fwd()
            bwd()

        def check():
            fwd()
            bwd()
            return {"out": out.float().clone(), "dgate_up": dgu.float().clone()}

        im = Impl()
        im.notes = "fused gate_up [N, 2F]; backward into a separate dgate_up"
        im.check = check
        fb, bb = out.numel() * 2, dgu.numel() * 2
        im.dirs = {"forward": (fwd, None, fb), "backward": (bwd, None, bb), "full": (full, None, fb + bb)}
        return im


class FLCE:
    name = "flce"

    def __init__(self, ctx, s):
        self.ctx, self.s = ctx, s
        N, C, V = s["N"], s["C"], s["V"]
        self.x = rnd(N, C)
        self.W = rnd(V, C, scale=C ** -0.5)  # logits ~ N(0, 1)
        self.y = torch.randint(0, V, (N,), device=DEVICE, dtype=torch.int64)
        self.y32 = self.y.to(torch.int32)

    def reference(self, chunk=2048):
        """fp32 mean cross-entropy of x @ W^T and its gradients, chunked (no [N, V] at once)."""
        N = self.s["N"]
        W = self.W.float()
        loss = torch.zeros((), device=DEVICE, dtype=torch.float64)
        dx = torch.empty(self.x.shape, device=DEVICE, dtype=torch.float32)
        dW = torch.zeros(W.shape, device=DEVICE, dtype=torch.float32)
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for r in range(0, N, chunk):
                xc = self.x[r:r + chunk].float()
                yc = self.y[r:r + chunk]
                logits = xc @ W.t()
                lse = torch.logsumexp(logits, dim=-1)
                loss += (lse - logits.gather(1, yc[:, None]).squeeze(1)).double().sum()
                p = torch.softmax(logits, dim=-1)
                del logits
                p[torch.arange(p.shape[0], device=DEVICE), yc] -= 1.0
                p /= N
                dx[r:r + chunk] = p @ W
                dW += p.t() @ xc
                del p
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        return {"loss": (loss / N).float(), "dx": dx, "dW": dW}

    def make(self, impl):
        if impl == "llmc":
            return self.llmc()
        if impl in ("liger", "liger_fp32_accum"):
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
            accum = torch.float32 if impl == "liger_fp32_accum" else None

            def fn(x, W, y):
                # (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing,
                #  reduction, softcap, return_z_loss, accum_dtype)
                return LigerFusedLinearCrossEntropyFunction.apply(x, W, y, None, None, -100, 0.0, 0.0, "mean", None,
                                                                  False, accum)[0]

            return self.autograd(fn, f"LigerFusedLinearCrossEntropyFunction accum_dtype={accum}; grads in forward")
        if impl == "torch":
            N, V = self.s["N"], self.s["V"]
            need = N * V * 16  # bf16 logits + fp32 copy + fp32 log-softmax + fp32 grad + bf16 grad
            free = torch.cuda.mem_get_info()[0]
            if need > 0.85 * free:
                raise MemoryError(f"skipped: eager logits need ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free")
            return self.autograd(flce_torch, "logits = x @ W.T (bf16), F.cross_entropy(logits.float())")
        if impl == "torch_compile":
            return self.autograd(compiled(flce_torch), "torch.compile(eager, dynamic=False)", compile_=True)
        raise ValueError(impl)

    def autograd(self, fn, notes, compile_=False):
        x, W, y = leaf(self.x), leaf(self.W), self.y
        xd, Wd = self.x, self.W  # no grad: the loss-only forward

        def forward():
            with torch.no_grad():
                fn(xd, Wd, y)

        def clear():
            x.grad = None
            W.grad = None

        def full():
            fn(x, W, y).backward()

        def check():
            if compile_:
                t0 = time.time()
                with torch.no_grad():
                    fn(xd, Wd, y)
                xc, Wc = leaf(self.x), leaf(self.W)
                fn(xc, Wc, y).backward()
                torch.cuda.synchronize()
                im.compile_s = time.time() - t0
            xc, Wc = leaf(self.x), leaf(self.W)
            loss = fn(xc, Wc, y)
            res = {"loss": loss.detach().float().clone()}
            loss.backward()
            res["dx"] = xc.grad.float()
            res["dW"] = Wc.grad.float()
            del xc, Wc
            with torch.no_grad():
                res["loss_forward_only"] = fn(xd, Wd, y).float()
            return res

        im = Impl()
        im.notes = notes
        im.check = check
        im.dirs = {"forward": (forward, None, 0), "full": (full, clear, 0)}
        return im

    def llmc(self):
        ctx = self.ctx
        lib, st = ctx.lib, ctx.bench.stream
        lib.init()
        N, C, V = self.s["N"], self.s["C"], self.s["V"]
        chunk = lib.fused_classifier_chunk_rows(N, V, int(ctx.args.logits_budget_mb * 2**20))
        x, W, y = self.x, self.W, self.y32
        scratch = torch.empty(chunk, V, device=DEVICE, dtype=torch.bfloat16)
        losses = torch.empty(N, device=DEVICE, dtype=torch.float32)
        total = torch.empty(1, device=DEVICE, dtype=torch.float32)
        dx = torch.empty_like(x)
        dW = torch.empty(V, C, device=DEVICE, dtype=torch.bfloat16)  # overwritten: accumulate = 0

        def forward():
            lib.fused_classifier_forward(ptr(losses), ptr(scratch), ptr(x), ptr(W), ptr(y), N, C, V, chunk, st())
            lib.loss_sum(ptr(total), ptr(losses), N, st())

        def full():
            lib.fused_classifier_forward_backward(ptr(losses), ptr(dx), ptr(dW), ptr(scratch), ptr(x), ptr(W), ptr(y),
                                                  N, C, V, chunk, 1.0 / N, 0, st())
            lib.loss_sum(ptr(total), ptr(losses), N, st())

        def check():
            full()
            res = {"loss": (total[0] / N).clone(), "dx": dx.float().clone(), "dW": dW.float()}
            forward()
            res["loss_forward_only"] = (total[0] / N).clone()
            return res

        im = Impl()
        im.notes = (f"chunk {chunk} rows ({ctx.args.logits_budget_mb:g} MiB logits budget), dW bf16: the first chunk "
                    "overwrites it (accumulate=0), later ones add (one bf16 rounding per chunk)")
        im.check = check
        ws = lib.matmul_workspace_bytes()
        fb = scratch.numel() * 2 + N * 4 + 4 + ws
        im.dirs = {"forward": (forward, None, fb),
                   "full": (full, None, fb + dx.numel() * 2 + dW.numel() * 2)}
        return im


class AdamW:
    name = "adamw"

    def __init__(self, ctx, s):
        self.ctx, self.s = ctx, s
        n = s["n_params"]
        self.master = rnd(n, dtype=torch.float32, scale=0.02)
        # grad norm ~1e-3 * sqrt(n) >> max_norm 1.0: the clip is active at both sizes. fp32 tensors of bf16
        # values: torch reads them as fp32, llmc as bf16 (its gradients' dtype), the same numbers.
        self.grads = [rnd(n, scale=1e-3).float()]
        self.checked = n <= ctx.args.adamw_check_max_params
        if self.checked:
            self.grads.append(self.grads[0].flip(0))  # a different gradient for the second step

    def reference(self):
        if not self.checked:
            return None
        h = ADAMW
        p = torch.nn.Parameter(self.master.clone())
        opt = torch.optim.AdamW([p], lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                                weight_decay=h["weight_decay"], foreach=False, fused=False)
        for g in self.grads:
            p.grad = g.clone()
            torch.nn.utils.clip_grad_norm_([p], h["max_norm"], foreach=False)
            opt.step()
        st = opt.state[p]
        res = {"delta": (p.detach() - self.master), "m": st["exp_avg"].clone(), "v": st["exp_avg_sq"].clone(),
               "param": p.detach().to(torch.bfloat16).float()}
        del opt, p
        return res

    def make(self, impl):
        if impl == "llmc":
            return self.llmc()
        if impl in ("torch", "torch_fused", "torch_compile"):
            return self.torch_impl(impl)
        raise ValueError(impl)

    def torch_impl(self, impl):
        h = ADAMW
        fused = impl == "torch_fused"

        def build():
            p = torch.nn.Parameter(self.master.clone())
            pb = torch.empty(p.shape, device=DEVICE, dtype=torch.bfloat16)
            kw = {"fused": True} if fused else {"foreach": True}
            opt = torch.optim.AdamW([p], lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                                    weight_decay=h["weight_decay"], **kw)

            def step():
                torch.nn.utils.clip_grad_norm_([p], h["max_norm"], foreach=True)
                opt.step()
                pb.copy_(p.detach())

            return p, pb, opt, step

        im = Impl()
        im.notes = ("clip_grad_norm_(foreach) + AdamW(" + ("fused=True" if fused else "foreach=True") + ")"
                    + (" under torch.compile" if impl == "torch_compile" else "") + " + bf16 copy")

        def check():
            p, pb, opt, step = build()
            if impl == "torch_compile":
                step = compiled_step(step)
            for i, g in enumerate(self.grads):
                p.grad = g.clone()
                if i == 0 and impl == "torch_compile":
                    timed_first_call(im, step)
                else:
                    step()
            st = opt.state[p]
            res = {"delta": (p.detach() - self.master), "m": st["exp_avg"].clone(), "v": st["exp_avg_sq"].clone(),
                   "param": pb.float()}
            del opt, p
            return res

        p, pb, opt, step = build()
        p.grad = self.grads[0].clone()
        if impl == "torch_compile":
            step = compiled_step(step)
        im.check = check
        im.dirs = {"step": (step, None, 0)}
        im.keep = (p, pb, opt)
        return im

    def llmc(self):
        lib, st = self.ctx.lib, self.ctx.bench.stream
        h = ADAMW
        n = self.s["n_params"]
        # the fp32 master as (param, master_lo): master_split of self.master, exact
        param = torch.empty(n, device=DEVICE, dtype=torch.bfloat16)
        master_lo = torch.empty(n, device=DEVICE, dtype=torch.int16)
        m = torch.zeros(n, device=DEVICE, dtype=torch.float32)
        v = torch.zeros(n, device=DEVICE, dtype=torch.float32)
        work = torch.empty(2 + lib.norm_scratch_floats(), device=DEVICE, dtype=torch.float32)
        grads = [g.to(torch.bfloat16) for g in self.grads]  # exact: the values are bf16; read only
        runs = self.ctx.adamw_runs()  # one run, decay on: torch's one tensor with weight_decay
        counter = [0]

        def reset_master():
            lib.master_split(ptr(param), ptr(master_lo), ptr(self.master), n, st())

        def step_with(g, t):
            lib.adamw_step(ptr(param), ptr(master_lo), ptr(g), ptr(m), ptr(v), n, runs, h["lr"], h["beta1"],
                           h["beta2"], h["eps"], h["weight_decay"], h["max_norm"], t, ptr(work), st())

        def step():
            counter[0] += 1
            step_with(grads[0], counter[0])

        def check():
            reset_master()
            m.zero_()
            v.zero_()
            for t, g in enumerate(grads, start=1):
                step_with(g, t)
            master = torch.empty(n, device=DEVICE, dtype=torch.float32)
            lib.master_join(ptr(master), ptr(param), ptr(master_lo), n, st())
            res = {"delta": master - self.master, "m": m.clone(), "v": v.clone(), "param": param.float()}
            del master
            reset_master()
            return res

        reset_master()
        im = Impl()
        im.notes = ("global_norm_squared + clip_coefficient + adamw_update (grad read twice: norm, update); fp32 "
                    "master as bf16 param + int16 master_lo, bf16 grad: 26 bytes/param")
        im.check = check
        im.dirs = {"step": (step, None, work.numel() * 4)}
        im.keep = grads
        return im


def compiled_step(step):
    return torch.compile(step, dynamic=False)


KERNEL_CLASSES = {"rmsnorm": RMSNorm, "fused_add_rmsnorm": FusedAddRMSNorm, "rope": Rope, "swiglu": SwiGLU,
                  "flce": FLCE, "adamw": AdamW}


# ----------------------------------------------------------------------------------------------
# driver


class Ctx:
    def __init__(self, args):
        self.args = args
        self.lib = None
        self.lib_error = None
        self._tables = {}
        self._adamw_runs = None

    def adamw_runs(self):
        """llmc's decay-run table for one tensor with weight decay (one run from 0): made once, outside
        any timing, and kept for the life of the process."""
        if self._adamw_runs is None:
            start = (ctypes.c_int64 * 1)(0)
            decay = (ctypes.c_ubyte * 1)(1)
            self._adamw_runs = self.lib.adamw_runs_create(ctypes.cast(start, ctypes.c_void_p),
                                                          ctypes.cast(decay, ctypes.c_void_p), 1)
        return self._adamw_runs

    def rope_table(self, T, D):
        key = (T, D)
        if key not in self._tables:
            if self.lib is not None:
                buf = self.lib.rope_table_host(T, D)
                host = torch.frombuffer(buf, dtype=torch.float32).clone()
            else:
                host = rope_table_python(T, D)
            self._tables[key] = host.view(T, D // 2, 2).to(DEVICE)
        return self._tables[key]


def rope_table_python(T, D):
    """The same table in Python (float32 HF inverse frequencies with Llama 3.1 scaling), used
    only when the library is missing."""
    import numpy as np
    half = D // 2
    inv = []
    for i in range(half):
        f = np.float32(1.0) / np.power(np.float32(ROPE["theta"]), np.float32(2 * i) / np.float32(D))
        old = np.float32(ROPE["original_max_pos"])
        low_w = old / np.float32(ROPE["low_freq_factor"])
        high_w = old / np.float32(ROPE["high_freq_factor"])
        wl = np.float32(2.0) * np.float32(math.pi) / f
        if wl > low_w:
            f = f / np.float32(ROPE["factor"])
        elif not wl < high_w:
            sm = (old / wl - np.float32(ROPE["low_freq_factor"])) / np.float32(
                ROPE["high_freq_factor"] - ROPE["low_freq_factor"])
            f = (np.float32(1) - sm) * f / np.float32(ROPE["factor"]) + sm * f
        inv.append(np.float32(f))
    inv = np.array(inv, dtype=np.float32)
    ang = np.arange(T, dtype=np.float32)[:, None] * inv[None, :]
    tab = np.stack([np.cos(ang.astype(np.float64)), np.sin(ang.astype(np.float64))], axis=-1).astype(np.float32)
    return torch.from_numpy(tab.reshape(-1).copy())


def versions(ctx):
    v = {"torch": torch.__version__, "cuda_torch": torch.version.cuda}
    try:
        import triton
        v["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        v["triton"] = f"unavailable: {e}"
    try:
        from importlib.metadata import version
        v["liger_kernel"] = version("liger_kernel")
    except Exception:  # noqa: BLE001
        try:
            import liger_kernel
            v["liger_kernel"] = getattr(liger_kernel, "__version__", "unknown")
        except Exception as e:  # noqa: BLE001
            v["liger_kernel"] = f"unavailable: {e}"
    if ctx.lib is not None:
        r = ctx.lib.cuda_runtime_version()
        v["cuda_llmc_runtime"] = f"{r // 1000}.{(r % 1000) // 10}"
    return v


def baselines(ctx):
    """Measured device-to-device copy bandwidth and bf16 GEMM rate, in this run."""
    n = 1 << 30  # 1 GiB each way

    def copy_timing():
        src = rnd(n // 2)
        dst = torch.empty_like(src)
        return ctx.bench.time(lambda: dst.copy_(src))

    def gemm_timing():
        a, b = rnd(8192, 8192), rnd(8192, 8192)
        return ctx.bench.time(lambda: torch.matmul(a, b))

    ms, q20, q80, runs = copy_timing()
    copy_gbps = 2 * n / (ms * 1e-3) / 1e9
    ms2, g20, g80, runs2 = gemm_timing()
    gemm_tflops = 2 * 8192 ** 3 / (ms2 * 1e-3) / 1e12
    free_memory()
    recs = [
        dict(kernel="copy", impl="torch", direction="d2d", tokens=None, bytes=2 * n, ms_median=ms, ms_q20=q20,
             ms_q80=q80, n_runs=runs, gbps=copy_gbps),
        dict(kernel="gemm", impl="torch", direction="bf16_8192^3", tokens=None, ms_median=ms2, ms_q20=g20,
             ms_q80=g80, n_runs=runs2, tflops=gemm_tflops),
    ]
    return copy_gbps, gemm_tflops, recs


# Outputs of the forward direction; the backward direction is checked on the others (the
# gradients), full and step on all of them.
FORWARD_OUTPUTS = {"rmsnorm": {"y"}, "fused_add_rmsnorm": {"y", "s"}, "rope": {"q", "k"}, "swiglu": {"out"},
                   "flce": {"loss_forward_only"}}


def checked_in(kernel, direction, name):
    fwd = FORWARD_OUTPUTS.get(kernel)
    if fwd is None or direction not in ("forward", "backward"):
        return kernel != "flce" or name != "loss_forward_only" or direction == "forward"
    return (name in fwd) == (direction == "forward")


def free_memory():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run_kernel_size(ctx, kernel, size, impls, out):
    args = ctx.args
    s = shape_of(kernel, size)
    tokens = None if kernel == "adamw" else int(size)
    case = KERNEL_CLASSES[kernel](ctx, s)
    ref = None
    check_this = not args.no_check and not (kernel == "flce" and tokens > args.flce_check_max_tokens)
    if check_this:
        try:
            ref = case.reference()
        except Exception as e:  # noqa: BLE001
            print(f"  reference for {kernel} {size} failed: {e!r}", file=sys.stderr)
            traceback.print_exc()
        free_memory()
    for impl in impls:
        if impl == "torch_compile" and not ctx.compile_here(kernel, size):
            continue
        if impl.startswith("liger") and ctx.liger_error:
            out(dict(kernel=kernel, impl=impl, tokens=tokens, **s, error=f"liger unavailable: {ctx.liger_error}"))
            continue
        if impl == "llmc" and ctx.lib is None:
            out(dict(kernel=kernel, impl=impl, tokens=tokens, **s, error=f"library unavailable: {ctx.lib_error}"))
            continue
        dtype = "bf16" if kernel != "adamw" else "bf16+int16 master, bf16 grad" if impl == "llmc" else "fp32+bf16"
        base = dict(kernel=kernel, impl=impl, tokens=tokens, **s, dtype=dtype)
        im = None
        try:
            im = case.make(impl)
            detail = None
            if ref is not None:
                outs = im.check()
                _, detail = compare(outs, ref)
                if kernel == "flce" and "loss_forward_only" in outs:
                    detail["loss_forward_only"] = rel_err(outs["loss_forward_only"], ref["loss"])
                del outs
            for direction in DIRECTIONS[kernel]:
                if direction not in im.dirs:
                    continue
                fn, prep, prealloc = im.dirs[direction]
                rec = dict(base, direction=direction)
                try:
                    ms, q20, q80, n = ctx.bench.time(fn, prep)
                    peak = ctx.bench.peak(fn, prep, prealloc)
                    rec.update(ms_median=ms, ms_q20=q20, ms_q80=q80, n_runs=n, peak_mem_gib=peak)
                    nb = min_bytes(kernel, direction, s, impl)
                    nf = min_flops(kernel, direction, s)
                    if nb:
                        rec["gbps"] = nb / (ms * 1e-3) / 1e9
                        rec["pct_of_copy"] = 100.0 * rec["gbps"] / ctx.copy_gbps
                    if nf:
                        rec["tflops"] = nf / (ms * 1e-3) / 1e12
                        rec["pct_of_gemm"] = 100.0 * rec["tflops"] / ctx.gemm_tflops
                except Exception as e:  # noqa: BLE001
                    rec["error"] = f"{type(e).__name__}: {e}"[:500]
                    traceback.print_exc()
                    free_memory()
                rel, ok = None, None
                if detail is not None:
                    errs = [e for k, e in detail.items() if checked_in(kernel, direction, k)]
                    rel = max(errs) if errs else None
                    ok = rel is not None and rel <= TOL[kernel]
                rec.update(check_rel_err=rel, check_ok=ok, check_tol=TOL[kernel] if ref is not None else None,
                           check_detail=detail, notes=im.notes, compile_s=im.compile_s)
                out(rec)
        except Exception as e:  # noqa: BLE001 - one failing impl must not stop the run
            msg = f"{type(e).__name__}: {e}"[:500]
            if not isinstance(e, MemoryError):
                traceback.print_exc()
            out(dict(base, error=msg))
        finally:
            del im
            free_memory()
    del case, ref
    free_memory()


def print_table(records):
    rows = {}
    order = []
    for r in records:
        if r["kernel"] in ("copy", "gemm") or "direction" not in r:
            continue
        size = r.get("tokens") or r.get("size")
        key = (r["kernel"], r["direction"], size)
        if key not in rows:
            rows[key] = {}
            order.append(key)
        rows[key][r["impl"]] = r
    impls = []
    for k in KERNELS:
        for i in IMPLS[k]:
            if i not in impls:
                impls.append(i)
    used = [i for i in impls if any(i in v for v in rows.values())]
    head = f"{'kernel':<18}{'dir':<9}{'size':>9} " + "".join(f"{i:>17}" for i in used) + f"{'llmc speedup':>22}"
    print("\nms (median; '!' = check failed, 'E' = error); speedup = best liger (torch_fused for adamw) / llmc")
    print(head)
    print("-" * len(head))
    for key in order:
        v = rows[key]
        cells = []
        for i in used:
            r = v.get(i)
            if r is None:
                cells.append(f"{'':>17}")
            elif "ms_median" not in r:
                cells.append(f"{'E':>17}")
            else:
                flag = "!" if r.get("check_ok") is False else ""
                extra = f" {r['gbps']:.0f}GB/s" if r.get("gbps") else (f" {r['tflops']:.0f}TF" if r.get("tflops") else "")
                cells.append(f"{r['ms_median']:.3f}{flag}{extra}".rjust(17))
        sp = ""
        ours = v.get("llmc", {}).get("ms_median")
        if key[0] == "adamw":
            cands = [v[i] for i in ("torch_fused",) if i in v and "ms_median" in v[i]]
        else:
            cands = [v[i] for i in v if i.startswith("liger") and "ms_median" in v[i]]
        if ours and cands:
            best = min(cands, key=lambda r: r["ms_median"])
            sp = f"{best['ms_median'] / ours:.2f}x vs {best['impl']}"
        print(f"{key[0]:<18}{key[1]:<9}{str(key[2]):>9} " + "".join(cells) + f"{sp:>22}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma list of " + ",".join(KERNELS))
    p.add_argument("--impls", default="", help="comma list to restrict implementations (default: all)")
    p.add_argument("--tokens", default="4096,8192,16384,32768", help="B*T values (T = 4096)")
    p.add_argument("--adamw-sizes", default="8b_layer,1b_model", help="comma list of " + ",".join(ADAMW_SIZES))
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tokens 4096, adamw 8b_layer, no torch.compile, shorter timing")
    p.add_argument("--compile", choices=["off", "one", "all"], default="one",
                   help="torch_compile impl at no size, at --compile-tokens only (default), or at every size")
    p.add_argument("--compile-tokens", type=int, default=8192)
    p.add_argument("--min-runs", type=int, default=50)
    p.add_argument("--max-runs", type=int, default=1000)
    p.add_argument("--rep-ms", type=float, default=200.0, help="target timed milliseconds per measurement")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--logits-budget-mb", type=float, default=512.0, help="llmc flce logits chunk (train_llama's)")
    p.add_argument("--flce-check-max-tokens", type=int, default=8192,
                   help="check flce against the fp32 reference up to this many tokens (fp32 GEMMs are slow)")
    p.add_argument("--adamw-check-max-params", type=int, default=200_000_000)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--lib", default=DEFAULT_LIB)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--dry-run", action="store_true", help="print the plan and check the library's symbols; no torch")
    a = p.parse_args(argv)
    a.kernels = [k for k in a.kernels.split(",") if k]
    for k in a.kernels:
        if k not in KERNELS:
            p.error(f"unknown kernel {k!r} (known: {', '.join(KERNELS)})")
    a.impls = [i for i in a.impls.split(",") if i]
    a.tokens = [int(t) for t in a.tokens.split(",") if t]
    a.adamw_sizes = [s for s in a.adamw_sizes.split(",") if s]
    for sz in a.adamw_sizes:
        if sz not in ADAMW_SIZES:
            p.error(f"unknown adamw size {sz!r} (known: {', '.join(ADAMW_SIZES)})")
    if a.quick:
        if "--tokens" not in (argv if argv is not None else sys.argv):
            a.tokens = [4096]
        if "--adamw-sizes" not in (argv if argv is not None else sys.argv):
            a.adamw_sizes = ["8b_layer"]
        if "--compile" not in (argv if argv is not None else sys.argv):
            a.compile = "off"
        a.rep_ms = min(a.rep_ms, 100.0)
    for t in a.tokens:
        if t <= 0 or (t > SEQ and t % SEQ):
            p.error(f"--tokens {t}: must be positive and, above {SEQ}, a multiple of it (T = {SEQ})")
    return a


def plan(args):
    items = []
    for k in args.kernels:
        sizes = args.adamw_sizes if k == "adamw" else args.tokens
        for size in sizes:
            s = shape_of(k, size)
            for impl in IMPLS[k]:
                if args.impls and impl not in args.impls:
                    continue
                if impl == "torch_compile" and not compile_here(args, k, size):
                    continue
                for d in DIRECTIONS[k]:
                    items.append((k, impl, d, size, s))
    return items


def compile_size(args):
    if args.compile_tokens in args.tokens:
        return args.compile_tokens
    return args.tokens[len(args.tokens) // 2]


def compile_here(args, kernel, size):
    """Whether the torch_compile impl runs at this size (each shape compiles anew)."""
    if args.compile == "off":
        return False
    if args.compile == "all":
        return True
    if kernel == "adamw":
        return size == args.adamw_sizes[0]
    return int(size) == compile_size(args)


def dry_run(args):
    items = plan(args)
    print(f"plan: {len(items)} measurements -> {args.out}")
    for k, impl, d, size, s in items:
        nb, nf = min_bytes(k, d, s, impl), min_flops(k, d, s)
        extra = (f"  bytes {nb / 1e9:.3f} GB" if nb else "") + (f"  flops {nf / 1e12:.1f} TF" if nf else "")
        print(f"  {k:<18} {impl:<17} {d:<9} {str(size):>9}  {json.dumps(s)}{extra}")
    if os.path.exists(args.lib):
        try:
            lib = Lib(args.lib)
            print(f"library {args.lib}: C API v{lib.capi_version()}, {len(Lib.SIGNATURES)} symbols bound")
            T, D = 8, HEAD_DIM
            tab = lib.rope_table_host(T, D)
            print(f"  rope table host check: pos 1, i 0: cos {tab[D + 0]:.6f} sin {tab[D + 1]:.6f} "
                  f"(expect {math.cos(1.0):.6f} {math.sin(1.0):.6f})")
            print(f"  flce chunk rows at N 32768, budget {args.logits_budget_mb:g} MiB: "
                  f"{lib.fused_classifier_chunk_rows(32768, VOCAB, int(args.logits_budget_mb * 2**20))}")
        except OSError as e:
            print(f"library {args.lib}: cannot load here ({e})")
    else:
        print(f"library {args.lib}: not built (dev/bench/run_kernels.sh builds it)")


def main(argv=None):
    global torch, F
    args = parse_args(argv)
    if args.dry_run:
        dry_run(args)
        return 0
    import torch as _torch
    import torch.nn.functional as _F
    torch, F = _torch, _F
    if not torch.cuda.is_available():
        print("error: no CUDA device visible to torch", file=sys.stderr)
        return 1
    try:
        import torch._dynamo
        for attr in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, attr):
                setattr(torch._dynamo.config, attr, 64)
    except Exception:  # noqa: BLE001
        pass
    torch.manual_seed(1234)
    ctx = Ctx(args)
    try:
        ctx.lib = Lib(args.lib)
    except Exception as e:  # noqa: BLE001
        ctx.lib_error = f"{type(e).__name__}: {e}"
        print(f"warning: llmc library unavailable ({ctx.lib_error}); llmc records will carry the error",
              file=sys.stderr)
    ctx.liger_error = None
    try:
        importlib.import_module("liger_kernel.ops")
    except Exception as e:  # noqa: BLE001
        ctx.liger_error = f"{type(e).__name__}: {e}"
        print(f"warning: liger_kernel unavailable ({ctx.liger_error})", file=sys.stderr)
    ctx.compile_here = lambda kernel, size: compile_here(args, kernel, size)
    ctx.bench = Bench(args)
    common = dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), versions=versions(ctx))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    records = []
    fout = open(args.out, "a")

    def out(rec):
        rec = {**rec, **common}
        records.append(rec)
        fout.write(json.dumps(rec) + "\n")
        fout.flush()
        if "ms_median" in rec:
            perf = ""
            if rec.get("gbps"):
                perf += f" {rec['gbps']:.0f} GB/s"
                if rec.get("pct_of_copy") is not None:
                    perf += f" ({rec['pct_of_copy']:.0f}% of copy)"
            if rec.get("tflops"):
                perf += f" {rec['tflops']:.0f} TFLOP/s"
                if rec.get("pct_of_gemm") is not None:
                    perf += f" ({rec['pct_of_gemm']:.0f}% of gemm)"
            chk = "" if rec.get("check_ok") is None else (" check ok" if rec["check_ok"] else " CHECK FAILED")
            if rec.get("check_rel_err") is not None:
                chk += f" (rel err {rec['check_rel_err']:.1e})"
            print(f"  {rec['kernel']:<18} {rec['impl']:<17} {rec.get('direction', ''):<9} "
                  f"{str(rec.get('tokens') or rec.get('size')):>9}  {rec['ms_median']:9.4f} ms"
                  f" [{rec.get('ms_q20', 0):.4f}, {rec.get('ms_q80', 0):.4f}] x{rec.get('n_runs')}{perf}"
                  f" peak {rec.get('peak_mem_gib', 0):.2f} GiB{chk}", flush=True)
        else:
            print(f"  {rec['kernel']:<18} {rec['impl']:<17} {rec.get('direction', ''):<9} "
                  f"{str(rec.get('tokens') or rec.get('size')):>9}  {rec.get('error')}", flush=True)

    t_start = time.time()
    print(f"gpu {common['gpu']}, versions {json.dumps(common['versions'])}")
    ctx.copy_gbps, ctx.gemm_tflops, base_recs = baselines(ctx)
    for r in base_recs:
        out(r)
    print(f"baselines: d2d copy {ctx.copy_gbps:.0f} GB/s (read + write), bf16 GEMM 8192^3 "
          f"{ctx.gemm_tflops:.0f} TFLOP/s")
    for kernel in args.kernels:
        t0 = time.time()
        impls = [i for i in IMPLS[kernel] if not args.impls or i in args.impls]
        sizes = args.adamw_sizes if kernel == "adamw" else args.tokens
        for size in sizes:
            run_kernel_size(ctx, kernel, size, impls, out)
        print(f"[{kernel}: {time.time() - t0:.0f} s]", flush=True)
    fout.close()
    print_table(records)
    failed = [r for r in records if r.get("check_ok") is False]
    errors = [r for r in records if "error" in r]
    for r in errors:
        print(f"error: {r['kernel']} {r['impl']} {r.get('direction', '')} {r.get('tokens') or r.get('size')}: "
              f"{r['error']}")
    for r in failed:
        print(f"check failed: {r['kernel']} {r['impl']} {r.get('direction')} {r.get('tokens') or r.get('size')}: "
              f"rel err {r['check_rel_err']:.2e} > {r['check_tol']:.0e} {json.dumps(r.get('check_detail'))}")
    print(f"\n{len(records)} records appended to {args.out} in {time.time() - t_start:.0f} s; "
          f"{len(failed)} with failed checks, {len(errors)} with errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
