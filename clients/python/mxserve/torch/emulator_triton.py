"""Fused CUDA kernels (Triton) behind mxserve.torch.emulator: the same bits, fewer launches.

The plain torch formulation in `emulator.py` is the definition; these kernels are a
second path for CUDA tensors that `emulator` takes when Triton imports and
`MXSERVE_EMULATOR_TRITON` is not "0". `bench/gpu_check.py` checks them against the
plain path (and the CPU) bit for bit. What each does exactly:

- `quantize_mx`: one program per 32-element block of BR rows; the scale from the
  block's largest magnitude (compared as bits), the elements rounded in FP64 (ties
  to even by adding and subtracting 2^52, ties away by floor(u + 1/2)) — the
  floor scale rule, which is what layer calls use.
- `mx_linear`: per output tile, the blocks in ascending order: a 32-deep BF16
  tensor-core dot with FP32 accumulation (exact: every element is an integer of
  at most 8 significant bits and the pair's bound 32·max|x|·max|w| is below 2^24),
  scaled in FP64 by the two blocks' 2^(e - F) (exact) and rounded once to FP32,
  then added in FP32. MXFP8 E4M3 elements (up to 2^17.8 in units) are split into
  two BF16-exact limbs (v = h·512 + l), so a pair takes up to four dots whose
  FP64 combination is exact; E5M2 pairs stay on the plain path.
- `fma_linear`: the float path, one FP32 fma per k, k ascending (tl.fma).
- `column_sums`: grad_bias, rows in ascending order, FP32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["column_sums", "fma_linear", "mx_linear", "mx_plan", "quantize_mx"]

_TWO52 = 4503599627370496.0


@triton.jit
def _pow2(e):
    """2^e in FP64 from its bits (e an int64 tensor in [-1022, 1023])."""
    return ((e + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _round(u, AWAY: tl.constexpr):
    """Non-negative FP64 u below 2^52 to an integer: ties away, or ties to even
    (adding 2^52 leaves no fraction bits, so the FPU's rounding does it)."""
    if AWAY:
        r = tl.floor(u + 0.5)
    else:
        r = (u + 4503599627370496.0) - 4503599627370496.0
    return r


@triton.jit
def _quantize_mx_kernel(x_ptr, fixed_ptr, exp_ptr, nan_ptr, R, K, NB, x_stride,
                        EMAX: tl.constexpr, EMIN: tl.constexpr, P: tl.constexpr,
                        MAXN: tl.constexpr, FSCALE: tl.constexpr, IS_INT: tl.constexpr,
                        AWAY: tl.constexpr, BR: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.program_id(1)
    rows = pid * BR + tl.arange(0, BR)
    cols = b * 32 + tl.arange(0, 32)
    rmask = rows < R
    mask = rmask[:, None] & (cols[None, :] < K)
    v = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0)
    bits = v.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    max_bits = tl.max(bits, axis=1)
    nan = max_bits >= 0x7F800000
    amax = tl.where(nan, 0, max_bits).to(tl.float32, bitcast=True).to(tl.float64)
    floor_log2 = ((amax.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    e = tl.minimum(tl.maximum(floor_log2 - EMAX, -127), 127)
    e = tl.where(amax > 0, e, -127)
    t = v.to(tl.float64) * _pow2(-e)[:, None]
    t = tl.where(nan[:, None], 0.0, t)
    a = tl.abs(t)
    if IS_INT:
        magnitude = tl.minimum(_round(a * 64.0, AWAY), 127.0) * 0.015625
    else:
        top = ((a.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
        step = tl.maximum(top, EMIN) - P
        magnitude = tl.minimum(_round(a * _pow2(-step), AWAY) * _pow2(step), MAXN)
        magnitude = tl.where(a > 0, magnitude, 0.0)
    fixed = magnitude * FSCALE
    fixed = tl.where(t < 0, -fixed, fixed)
    tl.store(fixed_ptr + rows[:, None] * (NB * 32) + cols[None, :], fixed.to(tl.float32),
             mask=rmask[:, None])
    tl.store(exp_ptr + rows * NB + b, e.to(tl.int32), mask=rmask)
    tl.store(nan_ptr + rows * NB + b, nan.to(tl.int8), mask=rmask)


def quantize_mx(x: torch.Tensor, spec, rounding: str):
    """(fixed [R, NB, 32] fp32, exponent [R, NB] int32, nan [R, NB] bool) of an FP32
    CUDA tensor [R, K], the floor scale rule."""
    rows, cols = x.shape
    blocks = -(-cols // 32)
    fixed = torch.empty(rows, blocks, 32, dtype=torch.float32, device=x.device)
    exponent = torch.empty(rows, blocks, dtype=torch.int32, device=x.device)
    nan = torch.empty(rows, blocks, dtype=torch.int8, device=x.device)
    if rows and blocks:
        x = x.contiguous()
        is_int = spec.kind == "mx_int"
        block_rows = 16
        grid = (triton.cdiv(rows, block_rows), blocks)
        _quantize_mx_kernel[grid](
            x, fixed, exponent, nan, rows, cols, blocks, x.stride(0),
            EMAX=spec.emax, EMIN=1 - spec.bias, P=spec.mantissa_bits,
            MAXN=float(spec.max_normal), FSCALE=float(2.0 ** spec.fraction_bits),
            IS_INT=is_int, AWAY=rounding == "away", BR=block_rows, num_warps=4)
    return fixed, exponent, nan.view(torch.bool)


@triton.jit
def _split(v, SPLIT: tl.constexpr):
    """(high, low) with v = high·512 + low, both exact in BF16 for MXFP8 E4M3
    elements (at most 4 significant bits each); (v, 0) without SPLIT."""
    if SPLIT:
        high = (v * 0.001953125).to(tl.int32).to(tl.float32)  # truncates toward zero
        low = v - high * 512.0
    else:
        high = v
        low = v * 0.0
    return high.to(tl.bfloat16), low.to(tl.bfloat16)


@triton.jit
def _mx_linear_kernel(x_ptr, fx_ptr, w_ptr, fw_ptr, b_ptr, y_ptr, M, N, NB,
                      HAS_BIAS: tl.constexpr, SX: tl.constexpr, SW: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, 32)
    mm = rm < M
    nm = rn < N
    kp = NB * 32
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nm, other=0.0)
        acc = tl.broadcast_to(bias[None, :], (BM, BN))
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for b in range(0, NB):
        x = tl.load(x_ptr + rm[:, None] * kp + b * 32 + rk[None, :], mask=mm[:, None], other=0.0)
        w = tl.load(w_ptr + rn[:, None] * kp + b * 32 + rk[None, :], mask=nm[:, None], other=0.0)
        xh, xl = _split(x, SX)
        wh, wl = _split(w, SW)
        wh = tl.trans(wh)
        wl = tl.trans(wl)
        # Each partial dot is exact in FP32 (bound below 2^24); their sum (below
        # 2^41) is exact in FP64.
        d = tl.dot(xh, wh, out_dtype=tl.float32).to(tl.float64)
        if SX and SW:
            d = d * 262144.0 + (tl.dot(xh, wl, out_dtype=tl.float32).to(tl.float64) +
                                tl.dot(xl, wh, out_dtype=tl.float32).to(tl.float64)) * 512.0
            d = d + tl.dot(xl, wl, out_dtype=tl.float32).to(tl.float64)
        elif SX:
            d = d * 512.0 + tl.dot(xl, wh, out_dtype=tl.float32).to(tl.float64)
        elif SW:
            d = d * 512.0 + tl.dot(xh, wl, out_dtype=tl.float32).to(tl.float64)
        fx = tl.load(fx_ptr + rm * NB + b, mask=mm, other=1.0)
        fw = tl.load(fw_ptr + rn * NB + b, mask=nm, other=1.0)
        v = ((d * fx[:, None]) * fw[None, :]).to(tl.float32)
        acc = acc + v
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=mm[:, None] & nm[None, :])


SPLIT_UNIT = 512.0


def _parts(max_fixed: float, split: bool):
    return (math.ceil(max_fixed / SPLIT_UNIT), SPLIT_UNIT - 1) if split else (max_fixed,)


def mx_plan(x_spec, w_spec):
    """(split_x, split_w) for a pair the kernel computes exactly — every partial
    block dot bounded by 32·max·max < 2^24, MXFP8 E4M3 split into 512-limbs — or
    None (E5M2: the plain path)."""
    split_x, split_w = x_spec.max_fixed > 4096, w_spec.max_fixed > 4096
    for a in _parts(x_spec.max_fixed, split_x):
        for b in _parts(w_spec.max_fixed, split_w):
            if 32.0 * a * b >= 2.0 ** 24:
                return None
    return split_x, split_w


def mx_linear(x_fixed, fx, w_fixed, fw, bias, split=(False, False)):
    """Y [M, N] fp32 from fixed-point operands [M|N, NB, 32] and their FP64 block
    factors 2^(e - F) (NaN for NaN blocks) [M|N, NB]; `split` from mx_plan."""
    m, blocks, _ = x_fixed.shape
    n = w_fixed.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x_fixed.device)
    if m == 0 or n == 0:
        return y
    bm = 16 if m <= 16 else 64 if m <= 64 else 128
    bn = 128 if bm == 128 else 64
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    b = bias if bias is not None else y  # unused without HAS_BIAS
    _mx_linear_kernel[grid](x_fixed.contiguous(), fx.contiguous(), w_fixed.contiguous(),
                            fw.contiguous(), b, y, m, n, blocks, HAS_BIAS=bias is not None,
                            SX=split[0], SW=split[1], BM=bm, BN=bn, num_warps=8 if bm == 128 else 4, num_stages=3)
    return y


@triton.jit
def _fma_linear_kernel(xt_ptr, wt_ptr, b_ptr, y_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mm = rm < M
    nm = rn < N
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nm, other=0.0)
        acc = tl.broadcast_to(bias[None, :], (BM, BN))
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K):
        xk = tl.load(xt_ptr + k * M + rm, mask=mm, other=0.0)
        wk = tl.load(wt_ptr + k * N + rn, mask=nm, other=0.0)
        acc = tl.fma(xk[:, None], wk[None, :], acc)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=mm[:, None] & nm[None, :])


def fma_linear(xv, wv_t, bias):
    """Y [M, N] = fma chain over k ascending from the bias; xv [M, K], wv_t = Wᵀ [K, N]."""
    m, k = xv.shape
    n = wv_t.shape[1]
    y = torch.empty(m, n, dtype=torch.float32, device=xv.device)
    if m == 0 or n == 0:
        return y
    bm, bn = (16, 128) if m <= 16 else (64, 64)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    b = bias if bias is not None else y
    _fma_linear_kernel[grid](xv.t().contiguous(), wv_t.contiguous(), b, y, m, n, k,
                             HAS_BIAS=bias is not None, BM=bm, BN=bn, num_warps=4)
    return y


@triton.jit
def _column_sums_kernel(dy_ptr, out_ptr, M, N, BN: tl.constexpr):
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    nm = rn < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    for r in range(0, M):
        acc = acc + tl.load(dy_ptr + r * N + rn, mask=nm, other=0.0)
    tl.store(out_ptr + rn, acc, mask=nm)


def column_sums(dy):
    """Σ rows of an FP32 CUDA tensor [M, N], rows ascending from +0.0."""
    m, n = dy.shape
    out = torch.empty(n, dtype=torch.float32, device=dy.device)
    if n:
        _column_sums_kernel[(triton.cdiv(n, 128),)](dy.contiguous(), out, m, n, BN=128,
                                                      num_warps=4)
    return out
