"""A box's own collectives: nccl-tests ``all_reduce_perf`` output -> the GPU link's efficiency and latency.

The roofline prices a ring all-reduce of ``bytes`` over ``n`` GPUs as
``2(n−1)/n · bytes / (link_bandwidth · link_efficiency) + link_latency`` (pipeline/costmodel/roofline.py).
nccl-tests measures exactly that call: each data row of ``all_reduce_perf`` gives the message
size and its out-of-place time. So the two link factors of a hardware entry are a linear fit of
time on the ring's bytes (``latency + ring_bytes / effective_bandwidth``), weighted so that every
size counts by its relative error, with one size in three held out to judge it.

What PCIe boxes differ in — P2P through a switch, through the CPU's root complex, or none — shows
up in these two numbers, which is why a user's own log beats a datasheet: ``rooftrace calibrate
--measurements all_reduce.log --hardware h100-pcie`` writes a hardware entry with them, which a
FLEET.toml names as its ``hardware``.

The log format (nccl-tests' ``src/common.cu``, as printed since its 2.x releases): comment lines
start with ``#`` (the run's parameters ``nThread N nGpus M ...``, one ``#  Rank  i ... device j
[...] NAME`` line per rank, and a two-line column header ``size count type redop root time algbw
busbw #wrong time algbw busbw #wrong`` for out-of-place then in-place); data lines are those
columns (``#wrong`` is ``N/A`` without ``-c 1``); sizes in bytes, times in microseconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from pipeline.catalog import HardwareSpec, hardware_to_toml, load_hardware
from pipeline.common.errors import RooftraceError

#: The first bytes read to tell an nccl-tests log from an operator table.
SNIFF_BYTES = 64 * 1024
#: Messages smaller than this are launch latency alone in every NCCL algorithm: not fitted.
MIN_FIT_BYTES = 1024
#: A fitted link faster than this share of the catalog's link bandwidth is not this GPU's link
#: (another --hardware, or a log of another box): refused.
MAX_EFFICIENCY = 1.25
#: Held-out median relative error above which no entry is written.
MAX_HOLDOUT_ERROR = 0.25
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\b(.*)$")
_NGPUS = re.compile(r"\bnGpus\s+(\d+)")
_NTHREAD = re.compile(r"\bnThread\s+(\d+)")
_DEVICE = re.compile(r"\[[^\]]*\]\s*(.+?)\s*$")


@dataclass(frozen=True)
class AllReduceRun:
    """The rows of one ``all_reduce_perf`` log: message sizes (bytes) and out-of-place times (s)."""

    path: Path
    ranks: int
    devices: tuple[str, ...]
    size_bytes: npt.NDArray[np.float64]
    time_s: npt.NDArray[np.float64]
    #: Data lines not used, with why (``line N: reason``).
    skipped: tuple[str, ...] = ()

    @property
    def ring_bytes(self) -> npt.NDArray[np.float64]:
        """Bytes each GPU's link carries in a ring all-reduce: 2(n−1)/n of the message."""
        return self.size_bytes * 2.0 * (self.ranks - 1) / self.ranks


@dataclass(frozen=True)
class LinkFit:
    """The fitted link of one log, judged on the sizes it held out."""

    run: AllReduceRun
    efficiency: float
    latency_s: float
    effective_bandwidth: float
    n_train: int
    n_holdout: int
    train_median_abs_error: float
    holdout_median_abs_error: float
    #: The catalog entry's link on the same held-out sizes.
    before_median_abs_error: float
    hardware: HardwareSpec
    toml: str


def is_all_reduce_log(path: Path) -> bool:
    """Whether ``path`` is a file that reads as nccl-tests output (its parameter line or its
    column header), judged on its first bytes."""
    if not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            head = f.read(SNIFF_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    return any(
        line.startswith("#") and (("nThread" in line and "nGpus" in line) or ("busbw" in line and "algbw" in line))
        for line in head.splitlines()
    )


def _number(text: str, what: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {what} {text[:40]!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: {what} {text[:40]!r} is not a finite number ≥ 0")
    return value


def read_all_reduce(path: Path) -> AllReduceRun:
    """Read one ``all_reduce_perf`` log. A file that is not one, or holds no usable row, is one
    RooftraceError line naming it (and the line at fault); a data row that cannot be used (a
    wrong result, a time of 0, a malformed number) is left out with its reason."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise RooftraceError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    ranks: dict[int, str] = {}
    ngpus = nthread = None
    time_col: int | None = None
    sizes: list[float] = []
    times: list[float] = []
    skipped: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if (m := _RANK.match(line)) is not None:
                d = _DEVICE.search(m.group(2))
                ranks[int(m.group(1))] = d.group(1) if d else ""
            if (m := _NGPUS.search(line)) is not None:
                ngpus = int(m.group(1))
            if (m := _NTHREAD.search(line)) is not None:
                nthread = int(m.group(1))
            words = line.lstrip("#").split()
            if words[:2] == ["size", "count"] and "time" in words:
                time_col = words.index("time")
            continue
        where = f"{path}:{number}"
        if time_col is None:
            raise RooftraceError(
                f"{where}: a data line before nccl-tests' column header ('# size count type redop root time algbw "
                "busbw #wrong ...'): not an all_reduce_perf log"
            )
        cols = line.split()
        if len(cols) < time_col + 4:
            skipped.append(f"line {number}: {len(cols)} columns, the header names {time_col + 4} or more")
            continue
        try:
            size = _number(cols[0], "size", where)
            t_us = _number(cols[time_col], "time", where)
        except ValueError as exc:
            skipped.append(f"line {number}: {str(exc).split(': ', 1)[1]}")
            continue
        wrong = cols[time_col + 3]
        if wrong not in ("0", "N/A"):
            skipped.append(f"line {number}: {wrong} wrong results (#wrong): a failed collective")
            continue
        if size < MIN_FIT_BYTES:
            skipped.append(f"line {number}: {size:.0f} B, below {MIN_FIT_BYTES} B (launch latency alone)")
            continue
        if t_us <= 0:
            skipped.append(f"line {number}: a time of 0 us")
            continue
        sizes.append(size)
        times.append(t_us * 1e-6)
    n = len(ranks) or (ngpus or 0) * (nthread or 1)
    if time_col is None:
        raise RooftraceError(
            f"{path}: not an nccl-tests log (no '# size count type ... time algbw busbw' header); "
            "give the output of all_reduce_perf"
        )
    if n < 2:
        raise RooftraceError(f"{path}: the log names {n} GPU(s): an all-reduce over fewer than 2 moves nothing")
    if len(sizes) < 6:
        said = f" ({'; '.join(skipped[:3])})" if skipped else ""
        raise RooftraceError(
            f"{path}: {len(sizes)} usable sizes of {MIN_FIT_BYTES} B or more; the fit needs at least 6 "
            f"(all_reduce_perf -b 1K -e 1G -f 2){said}"
        )
    devices = tuple(dict.fromkeys(d for _, d in sorted(ranks.items()) if d))
    return AllReduceRun(path, n, devices, np.array(sizes), np.array(times), tuple(skipped))


def _fit(x: npt.NDArray[np.float64], t: npt.NDArray[np.float64]) -> tuple[float, float]:
    """(latency s, seconds per ring byte) minimising the relative error of ``lat + x·inv``, both ≥ 0."""
    a = np.column_stack([1.0 / t, x / t])
    (lat, inv), _ = nnls(a, np.ones_like(t))
    return float(lat), float(inv)


def _median_error(pred: npt.NDArray[np.float64], t: npt.NDArray[np.float64]) -> float:
    return float(np.median(np.abs(pred / t - 1.0)))


def fit_link(run: AllReduceRun, hardware: str, name: str | None = None) -> LinkFit:
    """Fit ``hardware``'s link efficiency and latency on ``run`` (one size in three held out, by
    size order) and return the new catalog entry; refused (RooftraceError, one line) when the fit
    cannot be this GPU's link or misses its held-out sizes."""
    base = load_hardware(hardware)
    order = np.argsort(run.size_bytes, kind="stable")
    x, t = run.ring_bytes[order], run.time_s[order]
    held = np.arange(x.size) % 3 == 1
    lat, inv = _fit(x[~held], t[~held])
    if inv <= 0:
        raise RooftraceError(
            f"{run.path}: the all-reduce times do not grow with the message size: no link bandwidth can be fitted"
        )
    bandwidth = 1.0 / inv
    eff = bandwidth / base.link_bandwidth_bytes_per_s
    if not eff <= MAX_EFFICIENCY:
        raise RooftraceError(
            f"{run.path}: the fitted link moves {bandwidth / 1e9:.1f} GB/s per direction, {eff:.2f}x the "
            f"{base.link_bandwidth_bytes_per_s / 1e9:.1f} GB/s of {base.name}'s [link]: not this GPU's link "
            "(check --hardware, and that the log is of this box)"
        )
    pred = lat + x * inv
    before = base.link_latency_s + x / (base.link_bandwidth_bytes_per_s * base.link_efficiency)
    out = _median_error(pred[held], t[held])
    if not out <= MAX_HOLDOUT_ERROR:
        raise RooftraceError(
            f"{run.path}: the fitted link misses the held-out sizes by {out:.1%} (median); a fit off by more than "
            f"{MAX_HOLDOUT_ERROR:.0%} is not written"
        )
    on = ", ".join(run.devices) or "devices not named"
    note = (
        f"link efficiency {eff:.4g} and latency {lat:.3g} s fitted by rooftrace calibrate on nccl-tests "
        f"all_reduce_perf {run.path.name} ({run.ranks} GPUs: {on}; {int((~held).sum())} sizes, "
        f"{int(held.sum())} held out, hold-out median abs error {out:.1%})"
    )
    stem = name or f"{base.name}-link"
    new = replace(
        base,
        name=stem,
        display_name=f"{base.display_name} (link calibrated)",
        link_efficiency=eff,
        link_latency_s=lat,
        # the device stays the catalog's GPU (its measured profile prices it); the link is the box's
        link_fitted_from=base.link_fitted_from or base.name,
        calibrated_on=f"{base.calibrated_on}; {note}",
        sources={
            **dict(base.sources),
            "link": f"{base.sources.get('link', '')}; latency: {note}".lstrip("; "),
            "efficiency": f"{base.sources.get('efficiency', '')}; link: {note}".lstrip("; "),
        },
    )
    return LinkFit(
        run=run,
        efficiency=eff,
        latency_s=lat,
        effective_bandwidth=bandwidth,
        n_train=int((~held).sum()),
        n_holdout=int(held.sum()),
        train_median_abs_error=_median_error(pred[~held], t[~held]),
        holdout_median_abs_error=out,
        before_median_abs_error=_median_error(before[held], t[held]),
        hardware=new,
        toml=f"# {new.display_name}: written by `rooftrace calibrate`.\n" + hardware_to_toml(new),
    )
