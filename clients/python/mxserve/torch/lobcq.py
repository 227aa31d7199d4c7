"""LO-BCQ codebook calibration: locally optimal block-clustered quantization.

LO-BCQ (block-clustered quantization; mx/lobcq.h has the format) quantizes each
block of `block_len` values with the best of a few 16-entry codebooks. This
module finds those codebooks for a layer's weights or activations by the
paper's alternation, each step of which cannot raise the squared error:

1. cluster: every block takes the codebook with the least squared error (the
   quantizer's own choice, `emulator.lobcq_select`);
2. design: every codebook becomes the Lloyd-Max quantizer of the values of the
   blocks in its cluster (each entry the mean of the values nearest it,
   rounded to an INT6 integer), a few Lloyd steps per round;

until a round lowers the error by less than `tolerance` (relative) or
`iterations` rounds have run. Everything happens on the quantizer's integer grid
(t = rint(256 · x / s), s = amax / 31 per array), so the error minimised is the
one the quantizer sees. Initial clusters: blocks ranked by their largest |t|
(their statistics) and cut into `codebooks` equal groups, each codebook started
at the quantiles of its group's density to the 1/3 (Panter-Dite). Deterministic for a given input and seed.

    books, report = calibrate([layer.weight], geometry)
    op = emulator.quantize_lobcq(layer.weight, books, geometry)

The LO_BCQ format the daemon serves uses one frozen set
(`emulator.lobcq_codebooks()`, mx::DefaultLoBcqCodebooks), calibrated by
`default_codebooks()` on a seeded mix of Gaussian, Laplace and Student-t
arrays — the paper's observation that LO-BCQ codebooks calibrated once carry
across layers and models.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, List, Sequence

import torch

from mxserve.torch import emulator
from mxserve.torch.emulator import LOBCQ_ENTRY_MAX, LOBCQ_GRID, LOBCQ_W4A4, LoBcqGeometry

__all__ = ["CalibrationReport", "calibrate", "default_codebooks", "quantization_mse"]


@dataclasses.dataclass
class CalibrationReport:
    """How a calibration went: the mean squared error on the grid (units of
    (s/256)²) after each round, and the blocks used."""
    mse: List[float]
    blocks: int

    @property
    def rounds(self) -> int:
        return len(self.mse)


def _grid_blocks(samples: Iterable[torch.Tensor], geometry: LoBcqGeometry) -> torch.Tensor:
    """Every whole, finite, non-zero array of every sample (2-D: rows along K;
    1-D: one row), as blocks [n, block_len] of grid values t."""
    blocks = []
    for i, sample in enumerate(samples):
        x = torch.as_tensor(sample).detach().float().cpu()
        if x.dim() == 1:
            x = x[None, :]
        if x.dim() != 2:
            raise ValueError(f"samples[{i}]: expected a 1-D or 2-D tensor, got {x.dim()}-D")
        whole = (x.shape[1] // geometry.array_len) * geometry.array_len
        if whole == 0:
            continue
        t, scale = emulator.lobcq_grid(x[:, :whole], geometry.array_len)
        keep = torch.isfinite(scale) & (scale > 0)
        blocks.append(t[keep].reshape(-1, geometry.block_len))
    if not blocks or sum(b.shape[0] for b in blocks) == 0:
        raise ValueError(f"samples: no whole finite non-zero array of {geometry.array_len} values "
                         "along the last dimension to calibrate on")
    return torch.cat(blocks)


def _lloyd(values: torch.Tensor, entries: torch.Tensor, steps: int) -> torch.Tensor:
    """Lloyd-Max steps on 1-D grid values: each entry (INT6) the rounded mean of
    the values nearest it (the first entry on ties). An entry no value is nearest
    (a duplicate, or one left in an empty range) is dead weight: it moves to the
    worst-quantized value not yet an entry, as k-means re-seeds empty clusters
    (without this, integer rounding makes neighbours near 0 collide and stay
    collided, a poor local minimum)."""
    grid_index = torch.arange(16)
    for _ in range(steps):
        d = values[:, None] - entries[None, :] * LOBCQ_GRID
        key = (d * d) * 16 + grid_index
        best = key.min(dim=1).values
        nearest, err = best & 15, best >> 4
        sums = torch.zeros(16, dtype=torch.float64).index_add_(0, nearest, values.double())
        counts = torch.bincount(nearest, minlength=16).double()
        means = torch.where(counts > 0, sums / counts.clamp(min=1) / LOBCQ_GRID,
                            entries.double())
        updated = torch.clamp(torch.round(means), -LOBCQ_ENTRY_MAX, LOBCQ_ENTRY_MAX).long()
        dead = [k for k in range(16) if counts[k] == 0 or int(updated[k]) in
                updated[:k].tolist()]
        if dead:
            taken = set(updated.tolist())
            order = torch.argsort(err * values.numel() + torch.arange(values.numel()),
                              descending=True)
            for i in order.tolist():
                if not dead:
                    break
                if int(err[i]) == 0:
                    break
                target = int(torch.clamp(torch.round(values[i].double() / LOBCQ_GRID),
                                         -LOBCQ_ENTRY_MAX, LOBCQ_ENTRY_MAX))
                if target not in taken:
                    updated[dead.pop(0)] = target
                    taken.add(target)
        if torch.equal(updated, entries):
            break
        entries = updated
    return entries


def _initial_entries(values: torch.Tensor) -> torch.Tensor:
    """16 starting entries for grid values: the quantiles of their density to the
    1/3 (Panter and Dite: the point density of a high-rate MSE quantizer goes as
    p^(1/3)). Plain quantiles crowd the entries where values are dense and leave
    Lloyd a poor local minimum on peaked (Laplace, Student-t) data."""
    bins = torch.clamp(torch.round(values.double() / LOBCQ_GRID), -LOBCQ_ENTRY_MAX,
                       LOBCQ_ENTRY_MAX).long() + LOBCQ_ENTRY_MAX
    density = torch.bincount(bins, minlength=2 * LOBCQ_ENTRY_MAX + 1).double() ** (1.0 / 3.0)
    cdf = torch.cumsum(density, 0) / density.sum()
    targets = (torch.arange(16, dtype=torch.float64) + 0.5) / 16
    index = torch.searchsorted(cdf, targets).clamp(max=2 * LOBCQ_ENTRY_MAX)
    return index - LOBCQ_ENTRY_MAX


def _canonical(books: torch.Tensor) -> torch.Tensor:
    """Entries ascending within a codebook, codebooks in lexicographic order: the
    same quantizer (ties aside), one spelling."""
    books = torch.sort(books, dim=1).values
    order = sorted(range(books.shape[0]), key=lambda j: books[j].tolist())
    return books[order].contiguous()


def quantization_mse(blocks: torch.Tensor, books: torch.Tensor, block_len: int) -> float:
    """Mean squared error of grid blocks [n, block_len] under codebooks, per value."""
    _, _, err = emulator.lobcq_select(blocks.reshape(1, -1), books, block_len)
    return float(err.sum()) / blocks.numel()


def calibrate(samples: Sequence[torch.Tensor], geometry: LoBcqGeometry = LOBCQ_W4A4, *,
              iterations: int = 20, lloyd_steps: int = 4, tolerance: float = 1e-4,
              max_blocks: int = 1 << 16, seed: int = 0):
    """Codebooks [geometry.codebooks, 16] (int64 INT6 entries) for the samples'
    values, and a CalibrationReport. At most `max_blocks` blocks (a seeded random
    subset) are used."""
    if iterations < 1:
        raise ValueError(f"iterations: expected at least 1, got {iterations}")
    if max_blocks < geometry.codebooks:
        raise ValueError(f"max_blocks: expected at least geometry.codebooks "
                         f"({geometry.codebooks}), got {max_blocks}")
    blocks = _grid_blocks(samples, geometry)
    if blocks.shape[0] > max_blocks:
        pick = torch.randperm(blocks.shape[0], generator=torch.Generator().manual_seed(seed))
        blocks = blocks[torch.sort(pick[:max_blocks]).values]
    n = blocks.shape[0]
    # Initial clusters: ranked by the block's largest |t|, cut in equal groups.
    rank = torch.sort(blocks.abs().amax(dim=1) * n + torch.arange(n)).indices
    cluster = torch.empty(n, dtype=torch.int64)
    cluster[rank] = torch.arange(n) * geometry.codebooks // n
    books = torch.stack([_initial_entries(blocks[cluster == j].reshape(-1))
                         for j in range(geometry.codebooks)])
    history: List[float] = []
    best, best_mse = books, float("inf")
    for _ in range(iterations):
        for j in range(geometry.codebooks):  # design
            members = blocks[cluster == j].reshape(-1)
            if members.numel():
                books[j] = _lloyd(members, books[j], lloyd_steps)
        cluster, _, err = emulator.lobcq_select(blocks.reshape(1, -1), books,
                                                geometry.block_len)  # cluster
        cluster = cluster.reshape(-1)
        mse = float(err.sum()) / blocks.numel()
        history.append(mse)
        if mse < best_mse:
            best, best_mse = books.clone(), mse
        if len(history) > 1 and history[-2] - mse <= tolerance * history[-2]:
            break
    return _canonical(best), CalibrationReport(history, n)


def default_codebooks(seed: int = 35):
    """The LO_BCQ format's frozen codebooks, calibrated on 3 × 2048 seeded arrays
    of 64 values (Gaussian, Laplace, Student-t with 4 degrees of freedom: the
    tails of LLM weights and activations). Returns (codebooks, report)."""
    g = torch.Generator().manual_seed(seed)
    n = 2048 * LOBCQ_W4A4.array_len
    gaussian = torch.randn(n, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    laplace = -torch.sign(u) * torch.log1p(-2 * u.abs())
    chi2 = (torch.randn(4, n, generator=g, dtype=torch.float64) ** 2).sum(0)
    student = torch.randn(n, generator=g, dtype=torch.float64) / torch.sqrt(chi2 / 4)
    samples = [s.float().reshape(-1, LOBCQ_W4A4.array_len) for s in (gaussian, laplace, student)]
    return calibrate(samples, LOBCQ_W4A4, iterations=40, max_blocks=1 << 20, seed=seed)


def main(argv=None) -> int:
    """python -m mxserve.torch.lobcq [--check]: recalibrate the frozen set and print
    it as mx/lobcq.cc and emulator.py spell it; --check exits 1 where the
    emulator's table differs from what calibration gives."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(description=main.__doc__.split(":", 1)[1].strip())
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    books, report = default_codebooks()
    rows = [", ".join(str(v) for v in b) for b in books.tolist()]
    if args.check:
        same = torch.equal(books, emulator.lobcq_codebooks())
        print("the frozen set is what calibration gives" if same else
              "emulator._LOBCQ_DEFAULT differs from default_codebooks()", file=sys.stderr)
        return 0 if same else 1
    print(f"// mse per round (grid units): {report.mse}, {report.blocks} blocks")
    print("// mx/lobcq.cc\n" + "".join(f"    {{{{{r}}}}},\n" for r in rows))
    print("# emulator.py\n" + "".join(f"    ({r}),\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
