"""The landmarks: ``_pool`` (forward, grid (G, m): landmark ``j`` the
mean of the patch queries of its bin, PyTorch's adaptive bins, which may
overlap) and ``_pool_bwd`` (grid (G, token blocks): ``dq += dR / bin
size`` of each bin holding the patch, gathered; a patch lies in at most
2 x 2 bins).

Plain reference: ``torch.nn.functional.adaptive_avg_pool2d``
(:func:`mmseg_mita.ops.naive.naive_mita`).
"""
import triton
import triton.language as tl

from .helpers import _cast, _group_base, _head_dim, _load_rows, _row_offsets


@triton.jit
def _bin_bounds(offs_l, hgt, wid, ph, pw):
    """PyTorch's adaptive-pooling bin of landmark ``offs_l`` (row-major on
    ``ph x pw``; bin i of an axis of length L is ``[floor(i L / p),
    ceil((i + 1) L / p))``, bins may overlap): first and end row, first and
    end column on the ``hgt x wid`` grid."""
    bi = offs_l // pw
    bj = offs_l % pw
    return (bi * hgt // ph, ((bi + 1) * hgt + ph - 1) // ph, bj * wid // pw,
            ((bj + 1) * wid + pw - 1) // pw)


@triton.jit
def _axis_bins(x, length, p):
    """The (at most two, as ``p <= length``) adaptive bins of an axis of
    ``length`` in ``p`` bins that hold coordinate ``x`` (>= 0): bin i holds x
    iff ``floor(i L / p) <= x < ceil((i + 1) L / p)``, i.e. ``floor(x p / L)
    <= i <= floor(((x + 1) p - 1) / L)``. Returns the first (int32), whether
    the next holds ``x`` too, and the lengths of both (int32); unsigned
    divisions, cheaper than signed ones."""
    x = x.to(tl.uint32)
    length = length.to(tl.uint32)
    p = p.to(tl.uint32)
    first = x * p // length
    two = first < ((x + 1) * p - 1) // length
    start = first * length // p
    next_start = (first + 1) * length // p
    end = ((first + 1) * length + p - 1) // p
    next_end = ((first + 2) * length + p - 1) // p
    return (first.to(tl.int32), two, (end - start).to(tl.int32),
            (next_end - next_start).to(tl.int32))


@triton.jit(do_not_specialize=['hgt', 'wid', 'first'])
def _pool(Q, R, m, d, heads, first, hgt, wid, ph, pw, sqb, sqh, sqn,
          BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
          UPCAST: tl.constexpr):
    """Landmark ``j`` of group ``g`` (grid: G, m): the mean of the patch
    queries of its bin, ``BLOCK_P`` patches at a time."""
    g = tl.program_id(0)
    j = tl.program_id(1)
    r0, r1, c0, c1 = _bin_bounds(j, hgt, wid, ph, pw)
    bin_wid = c1 - c0
    size = (r1 - r0) * bin_wid
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    q_base = Q + _group_base(g, heads, sqb, sqh)
    total = tl.zeros([BLOCK_P, BLOCK_D], tl.float32)
    for i0 in range(0, size, BLOCK_P):
        offs_i = i0 + tl.arange(0, BLOCK_P)
        # The patch's row in the bin (unsigned: cheaper), then its column.
        bin_row = (offs_i.to(tl.uint32) // bin_wid.to(tl.uint32)).to(tl.int32)
        rows = first + (r0 + bin_row) * wid + c0 + offs_i - bin_row * bin_wid
        total += _load_rows(q_base, rows.to(tl.int64), offs_i < size, sqn,
                            offs_d, d_mask).to(tl.float32)
    mark = tl.sum(total, 0) * (1.0 / size)
    tl.store(
        R + (g * m + j).to(tl.int64) * d + offs_d,
        _cast(mark, R.dtype.element_ty, UPCAST),
        mask=d_mask)


@triton.jit(do_not_specialize=['n', 'hgt', 'wid', 'first'])
def _pool_bwd(DQ_ACC, DR, DQ, n, m, d, first, hgt, wid, ph, pw,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              UPCAST: tl.constexpr):
    """``dq`` of ``BLOCK_N`` tokens: the attention's part plus, for a patch,
    ``dR / bin size`` of each of the (at most 2 x 2) bins holding it;
    written in its dtype."""
    g = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    offs, mask = _row_offsets(
        g.to(tl.int64) * n + offs_t, offs_t < n, d, offs_d, d_mask)
    dq = tl.load(DQ_ACC + offs, mask=mask, other=0.0)
    patch = offs_t - first
    is_patch = (patch >= 0) & (patch < hgt * wid) & (offs_t < n)
    patch = tl.where(is_patch, patch, 0).to(tl.uint32)
    row = patch // wid.to(tl.uint32)
    bi, two_rows, rows0, rows1 = _axis_bins(row, hgt, ph)
    bj, two_cols, cols0, cols1 = _axis_bins(patch - row * wid, wid, pw)
    for di in tl.static_range(2):
        for dj in tl.static_range(2):
            held = is_patch
            size = rows0
            if di == 1:
                held = held & two_rows
                size = rows1
            if dj == 1:
                held = held & two_cols
                size = size * cols1
            else:
                size = size * cols0
            j = (bi + di) * pw + bj + dj
            # dR / bin size, as a product with the size's reciprocal.
            weight = tl.where(held, 1.0 / size.to(tl.float32), 0.0)
            r_offs, r_mask = _row_offsets(
                (g * m + j).to(tl.int64), held, d, offs_d, d_mask)
            dq += weight[:, None] * tl.load(
                DR + r_offs, mask=r_mask, other=0.0)
    tl.store(DQ + offs, _cast(dq, DQ.dtype.element_ty, UPCAST), mask=mask)
