"""Tabulated step cost: the form in which every cost model reaches the replay engines.

A step's cost splits by what drives it (pipeline/costmodel/steps.py has the six step fields):

- operators driven by the tokens through the linear layers, ``T = prefill_tokens + decode_seqs``
  (GEMMs, fused MoE, norms and activations, all-reduces, embedding): a **token table** indexed
  by the integer T;
- operators driven by the sampled positions, ``n = prefill_seqs + decode_seqs`` (LM head,
  sampler, logits gather): a **logits table** indexed by n;
- attention, driven by the other fields: affine operators (FLOPs and bytes affine in the six
  fields, timed by the roofline) and, for a measured profile, (batch × length) grids;
- per-step overhead: a fixed GPU-side part, plus host time (scheduling, input preparation,
  launching kernels of eager steps) where it exceeds the GPU time — with asynchronous
  scheduling the host prepares step k+1 while the GPU runs step k, so only the excess shows.

The tables are filled once per deployment by vectorised code — the roofline
(:func:`roofline_tables`, tier 2) or a GPU's measured profile (pipeline/costmodel/profile/cost.py, tier 1)
— so anything a token count determines (CUDA-graph padding, the fused-MoE kernel's non-linear
cost, the collective backend at that message size) costs one lookup in the engine. The same
kernel (:func:`tab_row`) prices a step in the compiled engine loop and in :class:`TabulatedCost`
calls (the reference engine's), so both engines get the same numbers to the bit.

Table columns (``TAB_COLUMNS``): compute-bound, memory-bound, collective and kernel-floor
seconds; FLOPs and bytes per TP rank over all stages; seconds that came from measured tables;
host seconds the step adds (eager kernel launches).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.costmodel.steps import STEP_FIELDS, FloatArray, StepBatch, StepCost

TAB_COLUMNS = ("compute_s", "memory_s", "comm_s", "floor_s", "flops", "bytes", "measured_s", "host_s")
N_TAB = len(TAB_COLUMNS)
#: Scalar parameters, in the order of the ``scalars`` array.
SCALARS = (
    "min_kernel_s",  # floor of one affine operator (roofline kernels)
    "tile",  # attention query tile (pipeline/costmodel/profile/attention.py); 0: parts summed as measured
    "layers",  # attention layers the grids' per-layer times are multiplied by
    "base_s",  # per-step GPU-side overhead of a step with tokens
    "host_s",  # per-step host time (scheduler, input preparation, output processing)
    "host_per_seq_s",  # host time per scheduled sequence
    "pp",  # pipeline stages (FLOPs/bytes per GPU)
    "measured_attention",  # 1: attention time from the grids (affine operators only account)
    "peak_gpu",  # FLOP/s per GPU for MFU
    "bw_gpu",  # bytes/s per GPU for MBU
)
N_SCALARS = len(SCALARS)
#: Output slots of tab_row.
OUT = ("time_s", "compute_s", "memory_s", "comm_s", "overhead_s", "flops", "bytes", "measured_s")
#: cost_source codes of the steps table.
COST_SOURCES = ("roofline", "measured")


def _empty_grid() -> tuple[FloatArray, FloatArray, FloatArray]:
    one = np.zeros(1)
    return one, one.copy(), np.zeros((1, 1))


def kernel_array(a: np.ndarray[Any, Any], dtype: Any = None) -> np.ndarray[Any, Any]:
    """An array argument of a compiled kernel: C-contiguous and writeable, so that every call has
    the one type signature that is compiled and cached on disk (arrays a Ray worker receives are
    read-only views of its object store, a different numba type: another compile of a minute or
    more, in every worker)."""
    return np.require(a, dtype, ["C_CONTIGUOUS", "WRITEABLE"])


@dataclass(frozen=True)
class TabulatedCost:
    """A StepCostFn from tables (see module doc). ``kernel_args`` are :func:`tab_row`'s fixed
    arguments, which the jit engine passes to the same kernel inside its loop.

    ``extend(t_max)`` must return tables covering T ≤ t_max (and n ≤ t_max) for steps larger than
    the tables built; ``describe`` says which tier costed what (for the run's metadata); ``exact``
    answers steps given with sliding-window sums, which the six-field tables do not carry (the
    engines never produce them).
    """

    tok: FloatArray
    logit: FloatArray
    affine_flops: FloatArray
    affine_bytes: FloatArray
    affine_count: FloatArray
    affine_peak: FloatArray
    affine_has_peak: npt.NDArray[np.bool_]
    affine_bw: FloatArray
    decode_grid: tuple[FloatArray, FloatArray, FloatArray]
    prefill_grid: tuple[FloatArray, FloatArray, FloatArray]
    scalars: FloatArray
    source: str = "roofline"
    #: The mixed-batch attention ratio grid, flattened (:func:`flat_ratio_grid`; ``[0.0]``: none).
    mixed_ratio: FloatArray = field(default_factory=lambda: np.zeros(1))
    describe: dict[str, Any] = field(default_factory=dict, compare=False)
    extend: Callable[[int], TabulatedCost] | None = field(default=None, compare=False, repr=False)
    #: The exact cost model, for steps the tables do not describe (sliding-window sums given).
    exact: Callable[[StepBatch], StepCost] | None = field(default=None, compare=False, repr=False)

    @property
    def kernel_args(self) -> tuple[Any, ...]:
        return (
            self.tok,
            self.logit,
            self.affine_flops,
            self.affine_bytes,
            self.affine_count,
            self.affine_peak,
            self.affine_has_peak,
            self.affine_bw,
            *self.decode_grid,
            *self.prefill_grid,
            self.mixed_ratio,
            self.scalars,
        )

    @functools.cached_property
    def kernel_tables(self) -> tuple[np.ndarray[Any, Any], ...]:
        """:attr:`kernel_args` as the compiled kernels take them (one value, built once): each array
        C-contiguous and writeable (:func:`kernel_array`)."""
        return tuple(kernel_array(a) for a in self.kernel_args)

    @property
    def max_tokens(self) -> int:
        return int(min(self.tok.shape[0], self.logit.shape[0])) - 1

    def __call__(self, batch: StepBatch) -> StepCost:
        windows = (batch.prefill_attn_pairs_window, batch.prefill_kv_tokens_window, batch.decode_ctx_tokens_window)
        if self.exact is not None and any(w is not None for w in windows):
            return self.exact(batch)
        x = np.empty((batch.n, 6))
        for j, name in enumerate(STEP_FIELDS):
            x[:, j] = getattr(batch, name)
        need = int(max(np.max(x[:, 0] + x[:, 4], initial=0.0), np.max(x[:, 1] + x[:, 4], initial=0.0)))
        need = min(need, MAX_TABLE_TOKENS)
        cost = self
        if need > self.max_tokens:
            if self.extend is None:
                raise ValueError(f"step of {need} tokens beyond the cost tables ({self.max_tokens})")
            cost = self.extend(need)
        out = np.empty((len(OUT), batch.n))
        binding = np.empty(batch.n, np.int8)
        args = (kernel_array(a) if isinstance(a, np.ndarray) else a for a in cost.kernel_args)
        _rows_kernel()(x, *args, out, binding)
        time, compute, memory, comm, overhead, flops, nbytes, measured = out
        sc = cost.scalars
        safe = np.where(time > 0, time, 1.0)
        return StepCost(
            time_s=time,
            flops=flops,
            bytes=nbytes,
            compute_s=compute,
            memory_s=memory,
            comm_s=comm,
            overhead_s=overhead,
            binding=binding,
            mfu=np.where(time > 0, flops / safe / sc[8], 0.0),
            mbu=np.where(time > 0, nbytes / safe / sc[9], 0.0),
            measured_s=measured,
        )

    def measured_share(self, batch: StepBatch) -> FloatArray:
        """Share of each step's time that came from measured tables."""
        cost = self(batch)
        measured = cost.measured_s if cost.measured_s is not None else np.zeros(batch.n)
        return np.where(cost.time_s > 0, measured / np.where(cost.time_s > 0, cost.time_s, 1.0), 0.0)


# --------------------------------------------------------------------------------------------
# the kernel (plain Python; compiled by numba on first use)


def _axis(lg: FloatArray, x: float) -> tuple[int, int, float, float]:
    """Where log-size ``x`` falls on a log axis: (i0, i1, weight, log factor above the axis)."""
    n = lg.shape[0]
    extra = 0.0
    if x > lg[n - 1]:
        extra = x - lg[n - 1]
    x = min(max(x, lg[0]), lg[n - 1])
    if n == 1:
        return 0, 0, 0.0, extra
    i1 = 1
    while i1 < n - 1 and lg[i1] < x:
        i1 += 1
    i0 = i1 - 1
    return i0, i1, (x - lg[i0]) / (lg[i1] - lg[i0]), extra


def _g2(la: FloatArray, lb: FloatArray, lt: FloatArray, qa: float, qb: float) -> float:
    """Grid2 (pipeline/costmodel/profile/interp.py) at one point: bilinear in log space, clamped below,
    proportional above. ``la``/``lb`` are the logs of the axes, ``lt`` of the times. Interpolates
    along ``a`` first, so a decode span (fixed batch) can do that part once (:func:`_g2_row`,
    :func:`_g1`) and get the same numbers."""
    i0, i1, w, ea = _axis(la, np.log(qa))
    j0, j1, v, eb = _axis(lb, np.log(qb))
    r0 = (1.0 - w) * lt[i0, j0] + w * lt[i1, j0]
    r1 = (1.0 - w) * lt[i0, j1] + w * lt[i1, j1]
    return float(np.exp((1.0 - v) * r0 + v * r1 + (ea + eb)))


def _g2_row(la: FloatArray, lt: FloatArray, qa: float, row: FloatArray) -> float:
    """The grid interpolated along ``a`` at ``qa`` into ``row``; returns the ``a`` log factor."""
    i0, i1, w, ea = _axis(la, np.log(qa))
    for j in range(lt.shape[1]):
        row[j] = (1.0 - w) * lt[i0, j] + w * lt[i1, j]
    return ea


def _g1(lb: FloatArray, row: FloatArray, ea: float, qb: float) -> float:
    """:func:`_g2` from a row of :func:`_g2_row` (the same operations on the same values)."""
    j0, j1, v, eb = _axis(lb, np.log(qb))
    return float(np.exp((1.0 - v) * row[j0] + v * row[j1] + (ea + eb)))


#: Tables are built for at most this many tokens (and sampled positions); steps beyond them are
#: extrapolated linearly from the last two rows (:func:`_tab`). Every operator is linear in the
#: tokens there — GEMMs compute-bound, elementwise kernels and collectives proportional to the
#: bytes, every MoE expert touched, measured curves proportional above their largest size — and a
#: token budget of 10⁹ then costs two 65,537-row tables, not 10⁹-row ones.
MAX_TABLE_TOKENS = 65536


def _tab(tab: FloatArray, i: int, c: int) -> float:
    """Column ``c`` of a token or logits table at ``i``, extrapolated linearly past its end."""
    last = tab.shape[0] - 1
    if i <= last:
        return float(tab[i, c])
    return float(tab[last, c] + (i - last) * (tab[last, c] - tab[last - 1, c]))


def _affine_op(
    f: float, b: float, count: float, peak: float, has_peak: bool, bw: float, min_kernel: float
) -> tuple[int, float]:
    """One affine operator's roofline term (roofline.op_times): (0 compute-bound, 1 memory-bound,
    2 kernel floor; seconds over its ``count`` instances)."""
    t_c = f / peak if has_peak else 0.0
    t_m = b / bw
    fl = min_kernel if (f > 0 or b > 0) else 0.0
    if fl > max(t_c, t_m):
        return 2, count * fl
    if t_c > t_m:
        return 0, count * t_c
    return 1, count * t_m


def _ceq(pairs: float) -> float:
    return float((np.sqrt(8.0 * pairs + 1.0) - 1.0) / 2.0)


def _prefill(pla: FloatArray, plb: FloatArray, plt: FloatArray, seqs: float, chunk: float) -> float:
    """The prefill grid at ``seqs`` prompts of ``chunk`` tokens. Past the longest measured prompt
    the time grows with the causal pairs, chunk·(chunk+1)/2 — quadratic, not the grid's
    proportional extrapolation (pipeline/costmodel/profile/attention.py, ``prefill_grid_time``)."""
    top = float(np.exp(plb[plb.shape[0] - 1]))
    if chunk <= top:
        return _g2(pla, plb, plt, seqs, chunk)
    return _g2(pla, plb, plt, seqs, top) * (chunk * (chunk + 1.0)) / (top * (top + 1.0))


def _flat_bracket(mx: FloatArray, start: int, n: int, x: float) -> tuple[int, int, float]:
    """Clamped position of ``x`` on the axis ``mx[start:start+n]`` (pipeline/costmodel/profile/mixed._bracket)."""
    if n == 1:
        return 0, 0, 0.0
    x = min(max(x, mx[start]), mx[start + n - 1])
    i1 = 1
    while i1 < n - 1 and mx[start + i1] < x:
        i1 += 1
    i0 = i1 - 1
    return i0, i1, (x - mx[start + i0]) / (mx[start + i1] - mx[start + i0])


def _mixed_ratio(mx: FloatArray, chunk: float, offset: float, decodes: float, ctx: float) -> float:
    """pipeline/costmodel/profile/mixed.RatioGrid at one point, from its flat form (:func:`flat_ratio_grid`):
    the same axes, clamping and quadrilinear sum in the same order."""
    na = int(mx[0])
    nb = int(mx[1])
    nc = int(mx[2])
    nd = int(mx[3])
    pa = 4
    pb = pa + na
    pc = pb + nb
    pd = pc + nc
    pt = pd + nd
    a0, a1, wa = _flat_bracket(mx, pa, na, np.log(max(chunk, 1.0)))
    b0, b1, wb = _flat_bracket(mx, pb, nb, np.log(max(offset, 0.0) + 16.0))
    c0, c1, wc = _flat_bracket(mx, pc, nc, np.log(max(decodes, 0.0) + 1.0))
    d0, d1, wd = _flat_bracket(mx, pd, nd, np.log(max(ctx, 16.0)))
    acc = 0.0
    for ia in range(2):
        fa = wa if ia else 1.0 - wa
        xa = a1 if ia else a0
        for ib in range(2):
            fb = wb if ib else 1.0 - wb
            xb = b1 if ib else b0
            for ic in range(2):
                fc = wc if ic else 1.0 - wc
                xc = c1 if ic else c0
                for idd in range(2):
                    fd = wd if idd else 1.0 - wd
                    xd = d1 if idd else d0
                    w = fa * fb * fc * fd
                    if w != 0.0:
                        acc += w * mx[pt + ((xa * nb + xb) * nc + xc) * nd + xd]
    return float(np.exp(acc))


def flat_ratio_grid(grid: Any | None) -> FloatArray:
    """A :class:`pipeline.costmodel.profile.mixed.RatioGrid` as one array: the four axis lengths, the axes,
    then the table in C order (``[0.0]`` when there is none)."""
    if grid is None:
        return np.zeros(1)
    la, lb, lc, ld, lt = grid.arrays()
    head = np.array([la.size, lb.size, lc.size, ld.size], dtype=np.float64)
    return np.ascontiguousarray(np.concatenate([head, la, lb, lc, ld, np.ravel(lt)]), dtype=np.float64)


def _attention(
    x: FloatArray,
    dla: FloatArray,
    dlb: FloatArray,
    dlt: FloatArray,
    pla: FloatArray,
    plb: FloatArray,
    plt: FloatArray,
    tile: float,
    mx: FloatArray,
) -> float:
    """pipeline/costmodel/profile/attention.step_attention for one step (one layer). With a mixed-batch
    ratio grid (``mx`` longer than one value), a step with a prefill chunk costs the parts summed
    (no query tile) times the grid's ratio at its mean chunk, mean cached offset, decode count
    and mean decode context (pipeline/costmodel/profile/mixed.py)."""
    ps = x[1]
    ds = x[4]
    if ps > 0 and mx.shape[0] > 1:
        c = max(x[0] / ps, 1.0)
        p = max(x[2] / ps, 1.0)
        t = _prefill(pla, plb, plt, ps, _ceq(p))
        k = 0.0
        if ds > 0:
            k = max(x[5] / ds, 1.0)
            t += _g2(dla, dlb, dlt, ds, k)
        offset = max(x[3] / ps - c, 0.0)
        return t * _mixed_ratio(mx, c, offset, ds, k)
    t = 0.0
    if ps > 0:
        c = max(x[0] / ps, 1.0)
        p = max(x[2] / ps, 1.0)
        if tile > 0:
            o = max((p - c * (c + 1.0) / 2.0) / c, 0.0)
            cp = max(c, tile)
            p = cp * o + cp * (cp + 1.0) / 2.0
        t += _prefill(pla, plb, plt, ps, _ceq(p))
    if ds > 0:
        k = max(x[5] / ds, 1.0)
        d = _g2(dla, dlb, dlt, ds, k)
        if ps > 0 and tile > 0:
            d = max(d, _prefill(pla, plb, plt, ds, _ceq(tile * k + tile * (tile + 1.0) / 2.0)))
        t += d
    return t


def tab_row(
    x: FloatArray,
    tok: FloatArray,
    logit: FloatArray,
    af: FloatArray,
    ab: FloatArray,
    acount: FloatArray,
    apeak: FloatArray,
    ahas: npt.NDArray[np.bool_],
    abw: FloatArray,
    dla: FloatArray,
    dlb: FloatArray,
    dlt: FloatArray,
    pla: FloatArray,
    plb: FloatArray,
    plt: FloatArray,
    mx: FloatArray,
    sc: FloatArray,
    out: FloatArray,
) -> int:
    """Price one step ``x`` (the six fields) into ``out`` (OUT order); returns the binding index
    (0 compute, 1 memory, 2 communication, 3 overhead). A step with no tokens and no sampled
    position costs nothing. Requires T and n within the tables."""
    T = x[0] + x[4]
    n = x[1] + x[4]
    if T <= 0.0 and n <= 0.0:
        for q in range(8):
            out[q] = 0.0
        return 0
    ti = int(T)
    ni = int(n)
    compute = _tab(tok, ti, 0) + _tab(logit, ni, 0)
    memory = _tab(tok, ti, 1) + _tab(logit, ni, 1)
    comm = _tab(tok, ti, 2) + _tab(logit, ni, 2)
    floors = _tab(tok, ti, 3) + _tab(logit, ni, 3)
    flops = _tab(tok, ti, 4) + _tab(logit, ni, 4)
    nbytes = _tab(tok, ti, 5) + _tab(logit, ni, 5)
    measured = _tab(tok, ti, 6) + _tab(logit, ni, 6)
    host_extra = _tab(tok, ti, 7) + _tab(logit, ni, 7)
    a_comp = 0.0
    a_mem = 0.0
    a_floor = 0.0
    min_kernel = sc[0]
    for i in range(af.shape[0]):
        f = af[i, 0]
        b = ab[i, 0]
        for j in range(6):
            if x[j] != 0.0:
                f += af[i, j + 1] * x[j]
                b += ab[i, j + 1] * x[j]
        kind, seconds = _affine_op(f, b, acount[i], apeak[i], ahas[i], abw[i], min_kernel)
        if kind == 0:
            a_comp += seconds
        elif kind == 1:
            a_mem += seconds
        else:
            a_floor += seconds
        flops += acount[i] * f
        nbytes += acount[i] * b
    t_att = sc[2] * _attention(x, dla, dlb, dlt, pla, plb, plt, sc[1], mx) if sc[7] > 0.0 else 0.0
    return _finish(
        compute, memory, comm, floors, flops, nbytes, measured, host_extra, a_comp, a_mem, a_floor, t_att, T, n, sc, out
    )


def _finish(
    compute: float,
    memory: float,
    comm: float,
    floors: float,
    flops: float,
    nbytes: float,
    measured: float,
    host_extra: float,
    a_comp: float,
    a_mem: float,
    a_floor: float,
    t_att: float,
    T: float,
    n: float,
    sc: FloatArray,
    out: FloatArray,
) -> int:
    """The end of :func:`tab_row`: attention into its bucket, overhead rule, outputs, binding."""
    if sc[7] > 0.0:
        if a_comp > a_mem:
            compute += t_att
        else:
            memory += t_att
        measured += t_att
    else:
        compute += a_comp
        memory += a_mem
        floors += a_floor
    base = sc[3] if T > 0 else 0.0
    gpu = compute + memory + comm + floors + base
    host = sc[4] + sc[5] * n + host_extra
    overhead = base + floors + max(0.0, host - gpu)
    time = compute + memory + comm + overhead
    out[0] = time
    out[1] = compute
    out[2] = memory
    out[3] = comm
    out[4] = overhead
    out[5] = flops / sc[6]
    out[6] = nbytes / sc[6]
    out[7] = measured
    best = compute
    arg = 0
    if memory > best:
        best = memory
        arg = 1
    if comm > best:
        best = comm
        arg = 2
    if overhead > best:
        arg = 3
    return arg


def tab_span_prep(
    nr: float,
    tok: FloatArray,
    logit: FloatArray,
    af: FloatArray,
    ab: FloatArray,
    dla: FloatArray,
    dlt: FloatArray,
    sc: FloatArray,
    pre: FloatArray,
    pf: FloatArray,
    pb: FloatArray,
    row: FloatArray,
) -> None:
    """For a span of pure-decode steps of ``nr`` sequences (only the context grows): the parts of
    :func:`tab_row` that do not depend on the context, computed once (``pre``: the table sums and
    the grid's batch factor; ``pf``/``pb``: each affine operator's FLOPs and bytes before the
    context term; ``row``: the decode grid at this batch)."""
    ti = int(nr)
    for c in range(8):
        pre[c] = _tab(tok, ti, c) + _tab(logit, ti, c)
    for i in range(af.shape[0]):
        pf[i] = af[i, 0] + af[i, 5] * nr
        pb[i] = ab[i, 0] + ab[i, 5] * nr
    pre[8] = _g2_row(dla, dlt, nr, row) if sc[7] > 0.0 else 0.0


def tab_span_row(
    nr: float,
    ctx: float,
    af: FloatArray,
    ab: FloatArray,
    acount: FloatArray,
    apeak: FloatArray,
    ahas: npt.NDArray[np.bool_],
    abw: FloatArray,
    dlb: FloatArray,
    sc: FloatArray,
    pre: FloatArray,
    pf: FloatArray,
    pb: FloatArray,
    row: FloatArray,
    out: FloatArray,
) -> int:
    """:func:`tab_row` of the pure-decode step (``nr`` sequences, ``ctx`` context tokens) after
    :func:`tab_span_prep`: the same operations on the same values, so the same numbers."""
    compute = pre[0]
    memory = pre[1]
    comm = pre[2]
    floors = pre[3]
    flops = pre[4]
    nbytes = pre[5]
    measured = pre[6]
    host_extra = pre[7]
    a_comp = 0.0
    a_mem = 0.0
    a_floor = 0.0
    min_kernel = sc[0]
    for i in range(af.shape[0]):
        f = pf[i]
        b = pb[i]
        if ctx != 0.0:
            f += af[i, 6] * ctx
            b += ab[i, 6] * ctx
        kind, seconds = _affine_op(f, b, acount[i], apeak[i], ahas[i], abw[i], min_kernel)
        if kind == 0:
            a_comp += seconds
        elif kind == 1:
            a_mem += seconds
        else:
            a_floor += seconds
        flops += acount[i] * f
        nbytes += acount[i] * b
    t_att = 0.0
    if sc[7] > 0.0:
        t = 0.0
        t += _g1(dlb, row, pre[8], max(ctx / nr, 1.0))
        t_att = sc[2] * t
    return _finish(
        compute,
        memory,
        comm,
        floors,
        flops,
        nbytes,
        measured,
        host_extra,
        a_comp,
        a_mem,
        a_floor,
        t_att,
        nr,
        nr,
        sc,
        out,
    )


def tab_rows(
    x: FloatArray,
    tok: FloatArray,
    logit: FloatArray,
    af: FloatArray,
    ab: FloatArray,
    acount: FloatArray,
    apeak: FloatArray,
    ahas: npt.NDArray[np.bool_],
    abw: FloatArray,
    dla: FloatArray,
    dlb: FloatArray,
    dlt: FloatArray,
    pla: FloatArray,
    plb: FloatArray,
    plt: FloatArray,
    mx: FloatArray,
    sc: FloatArray,
    out: FloatArray,
    binding: npt.NDArray[np.int8],
) -> None:
    row = np.empty(8)
    for r in range(x.shape[0]):
        binding[r] = tab_row(
            x[r], tok, logit, af, ab, acount, apeak, ahas, abw, dla, dlb, dlt, pla, plb, plt, mx, sc, row
        )
        for q in range(8):
            out[q, r] = row[q]


_KERNELS: dict[str, Callable[..., Any]] = {}


def _compiled() -> dict[str, Callable[..., Any]]:
    """tab_row and tab_rows compiled by numba (disk-cached), or plain Python without numba."""
    if not _KERNELS:
        try:
            import numba
        except ImportError:  # pragma: no cover - numba is a runtime dependency
            _KERNELS.update(
                row=tab_row,
                rows=tab_rows,
                attention=_attention,
                g2=_g2,
                span_prep=tab_span_prep,
                span_row=tab_span_row,
            )
        else:
            # How they are inlined is a matter of compile time, not speed (the same loads and
            # arithmetic either way): the small helpers at numba-IR level (inline="always"),
            # the rest by LLVM (forceinline, _nrt=False: they allocate nothing, and a compiled
            # loop without reference counting calls them). Inlining the whole tree at numba-IR
            # level, as before, typed it anew in every caller: tab_rows compiled in 34 s, the
            # engine's step in 65 s more (now 6 s and under 1 s; benchmarks/cold_start.py).
            small = numba.njit(cache=True, inline="always")
            kernel = numba.njit(cache=True, forceinline=True, _nrt=False)  # type: ignore[call-overload]
            axis = small(_axis)
            tab = small(_tab)
            g2 = small(_rebind(_g2, {"_axis": axis}))
            g2_row = small(_rebind(_g2_row, {"_axis": axis}))
            g1 = small(_rebind(_g1, {"_axis": axis}))
            ceq = small(_ceq)
            finish = small(_finish)
            aop = small(_affine_op)
            fbr = small(_flat_bracket)
            mratio = kernel(_rebind(_mixed_ratio, {"_flat_bracket": fbr}))
            pre_fill = kernel(_rebind(_prefill, {"_g2": g2}))
            att = kernel(_rebind(_attention, {"_g2": g2, "_ceq": ceq, "_prefill": pre_fill, "_mixed_ratio": mratio}))
            row = kernel(_rebind(tab_row, {"_attention": att, "_finish": finish, "_affine_op": aop, "_tab": tab}))
            span_prep = kernel(_rebind(tab_span_prep, {"_g2_row": g2_row, "_tab": tab}))
            span_row = kernel(_rebind(tab_span_row, {"_g1": g1, "_finish": finish, "_affine_op": aop}))
            rows = numba.njit(cache=True)(_rebind(tab_rows, {"tab_row": row}))
            _KERNELS.update(row=row, rows=rows, attention=att, g2=g2, span_prep=span_prep, span_row=span_row)
    return _KERNELS


def _rebind(fn: Callable[..., Any], names: dict[str, Any]) -> Callable[..., Any]:
    """``fn`` with the globals in ``names`` replaced (so compiled callees are called compiled)."""
    import types

    glb = dict(fn.__globals__)
    glb.update(names)
    new = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    return new


def _rows_kernel() -> Callable[..., Any]:
    return _compiled()["rows"]


def row_kernel() -> Callable[..., Any]:
    """The compiled :func:`tab_row` (for engines that call it from their own compiled loops)."""
    return _compiled()["row"]


def span_kernels() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The compiled :func:`tab_span_prep` and :func:`tab_span_row`."""
    k = _compiled()
    return k["span_prep"], k["span_row"]


# --------------------------------------------------------------------------------------------
# building tables


def table_size(tokens: int) -> int:
    """Rows (less one) to tabulate for steps of up to ``tokens``: capped at MAX_TABLE_TOKENS."""
    return max(1, min(int(tokens), MAX_TABLE_TOKENS))


def grid_arrays(grid: Any | None) -> tuple[FloatArray, FloatArray, FloatArray]:
    """A pipeline.costmodel.profile.interp.Grid2 as the kernel's (log a, log b, log t) arrays."""
    if grid is None:
        return _empty_grid()
    return (
        np.ascontiguousarray(np.log(grid.a)),
        np.ascontiguousarray(np.log(grid.b)),
        np.ascontiguousarray(np.log(grid.t)),
    )


def scalars(**values: float) -> FloatArray:
    unknown = sorted(set(values) - set(SCALARS))
    if unknown:
        raise ValueError(f"unknown scalar(s) {unknown}")
    defaults = {"pp": 1.0, "peak_gpu": 1.0, "bw_gpu": 1.0}
    return np.array([float(values.get(k, defaults.get(k, 0.0))) for k in SCALARS])


def affine_cost(
    flops: FloatArray,
    nbytes: FloatArray,
    count: FloatArray,
    peak: FloatArray,
    has_peak: npt.NDArray[np.bool_],
    bw: FloatArray,
    sc: FloatArray,
    max_tokens: int = 1,
) -> TabulatedCost:
    """A cost made only of affine operators (zero token and logits tables), e.g. a stand-in."""
    zeros = np.zeros((max_tokens + 1, N_TAB))

    def extend(t: int) -> TabulatedCost:
        return affine_cost(flops, nbytes, count, peak, has_peak, bw, sc, table_size(max(t, 2 * max_tokens)))

    return TabulatedCost(
        tok=zeros,
        logit=zeros.copy(),
        affine_flops=np.ascontiguousarray(flops, np.float64),
        affine_bytes=np.ascontiguousarray(nbytes, np.float64),
        affine_count=np.ascontiguousarray(count, np.float64),
        affine_peak=np.ascontiguousarray(peak, np.float64),
        affine_has_peak=np.ascontiguousarray(has_peak, np.bool_),
        affine_bw=np.ascontiguousarray(bw, np.float64),
        decode_grid=_empty_grid(),
        prefill_grid=_empty_grid(),
        scalars=sc,
        source="stand-in",
        extend=extend,
    )
