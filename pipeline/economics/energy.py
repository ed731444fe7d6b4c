"""Energy of a replayed day: a power model per GPU applied to the run's step log.

Each GPU's board power during a span of engine steps is

    P = idle_w + (max_w − idle_w) · min(1, compute·MFU + memory·MBU + communication·c + overhead·o)

where MFU and MBU are the span's achieved FLOP/s and bytes/s over the GPU's datasheet peaks (the
steps table's ``flops`` and ``bytes`` per GPU over the span's duration: how hard the compute-bound
and the memory-bound operators drive their units), and ``c``, ``o`` the shares of the span's
priced time in communication and in the fixed per-step overhead (``comm_s``, ``overhead_s`` over
the four parts). ``idle_w``, ``max_w`` and the four draws are data (``pipeline/catalog/power.toml``,
each with its source; the draws fitted on the ML.ENERGY batch sweeps, docs/economics.md
"Energy"). A span's joules are P × its duration × the rank's GPUs; the time a rank is not
stepping, within the period ``cost`` prices, is at ``idle_w``.

Attribution: a span's joules go to prefill and decode by their share of its tokens (prefill
tokens vs decode tokens); prefill joules are the fresh-input class (recomputation included),
decode joules the output class. Cache-hit input tokens run no step of their own: they are
charged nothing directly (the attention reads over them are inside the steps that read them),
and ``cache_hit_avoided_kwh`` says what prefilling them would have cost at the fresh rate.
Per request, each rank's prefill joules are shared over its requests by prefill tokens weighted
with the rank's joules per prefill token between their scheduling and first token, and its
decode joules by the per-sequence decode power over their decode interval; both are normalised
per rank, so Σ requests + idle + unattributed (spans of a rank that served no finished request)
= total, exactly up to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow.compute as pc

from pipeline.common.errors import ConfigError
from pipeline.common.schemas import read_parquet
from pipeline.common.tomlfile import read_toml
from pipeline.common.units import plain_number
from pipeline.economics.period import stored_run_period
from pipeline.replay.autoscale import autoscale_record, paid_per_replica
from pipeline.replay.fleet import ENERGY_RANGES, ResolvedFleet, energy_range_error
from pipeline.replay.runfolder import RunPool, config_path, pools_of, read_config
from pipeline.replay.slo import MIN_PROJECTION_S, day_projection, traffic_span

FloatArray = npt.NDArray[np.float64]

#: The catalog's power tables (one per GPU, each with its sources).
POWER_PATH = Path(__file__).resolve().parents[1] / "catalog" / "power.toml"
#: What bound a span's time, in the steps table's column order.
BOUNDS: tuple[str, ...] = ("compute", "memory", "communication", "overhead")
_BOUND_COLUMNS = ("compute_s", "memory_s", "comm_s", "overhead_s")
_POWER_KEYS = ("idle_w", "max_w", *BOUNDS)
#: The highest board power a GPU entry may state (W): above every accelerator's TDP
#: (GB200's 1,200 W, MI355X's 1,400 W) with room, below anything a typo of a kW figure gives.
MAX_BOARD_W = 3000.0

#: The largest draw per unit of utilisation (a GPU at full MFU drawing 3x its dynamic range is
#: already clipped at max_w; a larger figure is a typo).
MAX_DRAW = 3.0

#: Defaults of the electricity inputs (FLEET.toml ``[energy]`` or the command line override them).
DEFAULT_USD_PER_KWH = 0.0811
DEFAULT_PUE = 1.56
SETTING_SOURCES = {
    "usd_per_kwh": "U.S. EIA, Electric Power Monthly (Feb 2025), Table 5.3: average retail price to the "
    "industrial sector, 2024 annual, 8.11 cents/kWh",
    "pue": "Uptime Institute Global Data Center Survey 2024: average annual PUE 1.56",
}


@dataclass(frozen=True)
class PowerSpec:
    """One GPU's power model (W per GPU); ``draw`` maps each of :data:`BOUNDS` to the share of
    the dynamic range (max_w − idle_w) drawn per unit of that utilisation (module doc)."""

    hardware: str
    idle_w: float
    max_w: float
    draw: Mapping[str, float]
    sources: Mapping[str, str] = field(default_factory=dict)

    def power_w(
        self, mfu: npt.ArrayLike, mbu: npt.ArrayLike, comm: npt.ArrayLike, overhead: npt.ArrayLike
    ) -> FloatArray:
        """Board power of one GPU (W) in spans of the given compute and memory-bandwidth
        utilisation (achieved FLOP/s and bytes/s over the datasheet peaks) and shares of their
        priced time in communication and fixed overhead; at most max_w."""
        terms = [np.nan_to_num(np.maximum(np.asarray(v, np.float64), 0.0)) for v in (mfu, mbu, comm, overhead)]
        mix = sum(self.draw[k] * v for k, v in zip(BOUNDS, terms, strict=True))
        return self.idle_w + (self.max_w - self.idle_w) * np.minimum(np.asarray(mix, np.float64), 1.0)

    def span_power_w(self, spans: Mapping[str, FloatArray], peak_flops: float, bandwidth: float) -> FloatArray:
        """:meth:`power_w` of step-log spans (the steps table's flops, bytes, start_s, end_s and
        the four parts of the priced time), for a GPU of ``peak_flops`` FLOP/s and ``bandwidth`` B/s."""
        dur = np.maximum(spans["end_s"] - spans["start_s"], 0.0)
        parts = np.stack([np.maximum(np.nan_to_num(spans[c]), 0.0) for c in _BOUND_COLUMNS])
        total = parts.sum(axis=0)
        ok = dur > 0
        mfu = np.divide(spans["flops"], dur * peak_flops, out=np.zeros_like(dur), where=ok)
        mbu = np.divide(spans["bytes"], dur * bandwidth, out=np.zeros_like(dur), where=ok)
        comm = np.divide(parts[2], total, out=np.zeros_like(dur), where=total > 0)
        over = np.divide(parts[3], total, out=np.ones_like(dur), where=total > 0)
        return self.power_w(mfu, mbu, comm, over)


def _number(table: Mapping[str, Any], key: str, where: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
    return v


def parse_power(name: str, table: Any, origin: str) -> PowerSpec:
    """One GPU's ``[name]`` table of the power file, checked: every key present and known, watts
    in (0, MAX_BOARD_W] with idle_w < max_w, draws in [0, MAX_DRAW], a source for each number."""
    where = f"{origin} [{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table of {list(_POWER_KEYS)} and [sources]")
    allowed = {*_POWER_KEYS, "sources"}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = [k for k in (*_POWER_KEYS, "sources") if k not in table]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")
    values = {k: _number(table, k, where) for k in _POWER_KEYS}
    for key in ("idle_w", "max_w"):
        if not 0.0 < values[key] <= MAX_BOARD_W:
            raise ConfigError(f"{where}: {key} must be in (0, {MAX_BOARD_W:g}] W, got {table[key]!r}")
    if values["idle_w"] >= values["max_w"]:
        raise ConfigError(f"{where}: idle_w ({values['idle_w']:g} W) must be below max_w ({values['max_w']:g} W)")
    for key in BOUNDS:
        if not 0.0 <= values[key] <= MAX_DRAW:
            raise ConfigError(
                f"{where}: {key} must be in [0, {MAX_DRAW:g}] (share of the range idle_w..max_w per unit of "
                f"utilisation), got {table[key]!r}"
            )
    sources = table["sources"]
    need = ("idle_w", "max_w", "draw")
    if not isinstance(sources, dict) or any(
        not isinstance(sources.get(k), str) or not sources[k].strip() for k in need
    ):
        raise ConfigError(f"{where} [sources]: must give a source (text) for each of {list(need)}")
    return PowerSpec(name, values["idle_w"], values["max_w"], {k: values[k] for k in BOUNDS}, dict(sources))


def parse_power_file(data: Mapping[str, Any], origin: str) -> dict[str, PowerSpec]:
    """Every GPU's power model in a parsed power file."""
    return {name: parse_power(name, table, origin) for name, table in data.items()}


@cache
def load_power(path: Path | str = POWER_PATH) -> dict[str, PowerSpec]:
    """The power file's models by catalog hardware name (``pipeline/catalog/power.toml``)."""
    return parse_power_file(read_toml(path, "power file"), str(path))


# --------------------------------------------------------------------------------------------
# electricity inputs


@dataclass(frozen=True)
class EnergySettings:
    """Price of electricity (USD per kWh at the meter) and the facility's PUE."""

    usd_per_kwh: float = DEFAULT_USD_PER_KWH
    pue: float = DEFAULT_PUE

    def checked(self, where: str) -> EnergySettings:
        """These settings, or one ConfigError naming ``where`` and the value out of its range."""
        for key in ENERGY_RANGES:
            why = energy_range_error(key, getattr(self, key), where)
            if why:
                raise ConfigError(why)
        return self

    def with_options(self, usd_per_kwh: float | None, pue: float | None) -> EnergySettings:
        """These settings with the command line's values where given (checked)."""
        out = EnergySettings(self.usd_per_kwh if usd_per_kwh is None else usd_per_kwh, self.pue if pue is None else pue)
        return out.checked("--usd-per-kwh/--pue")


def settings_of(table: Mapping[str, Any] | None, where: str) -> EnergySettings:
    """FLEET.toml's ``[energy]`` table (or its record in a run) as settings; None: the defaults."""
    if not table:
        return EnergySettings()
    return EnergySettings(table.get("usd_per_kwh", DEFAULT_USD_PER_KWH), table.get("pue", DEFAULT_PUE)).checked(
        f"{where} [energy]"
    )


# --------------------------------------------------------------------------------------------
# a run's energy


@dataclass(frozen=True)
class PoolEnergy:
    name: str | None
    hardware: str
    gpus: int
    busy_j: float
    idle_j: float

    @property
    def total_j(self) -> float:
        return self.busy_j + self.idle_j


@dataclass(frozen=True)
class RunEnergy:
    """What a run's GPUs drew over ``period_s`` (GPU board energy; facility energy = × PUE)."""

    period_s: float
    settings: EnergySettings
    pools: tuple[PoolEnergy, ...]
    #: Joules by token class and the tokens of that class (finished requests).
    class_j: Mapping[str, float]
    class_tokens: Mapping[str, float]
    #: Per request (rows of requests.parquet, in order): prefill and decode joules.
    request_prefill_j: FloatArray
    request_decode_j: FloatArray
    unattributed_j: float
    average_w: float
    peak_w: float
    missing_power: tuple[str, ...] = ()

    @property
    def idle_j(self) -> float:
        return sum(p.idle_j for p in self.pools)

    @property
    def total_j(self) -> float:
        return sum(p.total_j for p in self.pools)

    def to_dict(self) -> dict[str, Any]:
        """The summary's ``energy`` block (SI units, kWh for people)."""
        kwh = self.total_j / 3.6e6
        projected = math.isfinite(self.period_s) and self.period_s >= MIN_PROJECTION_S

        def day(x: float) -> float | None:  # a per-day figure only from a span worth extrapolating
            return x * 86400.0 / self.period_s if projected else None

        per_token = {
            k: (self.class_j[k] / self.class_tokens[k] if self.class_tokens[k] > 0 else None) for k in self.class_j
        }
        facility_kwh = kwh * self.settings.pue
        fresh = per_token.get("fresh_input") or 0.0
        return {
            "period_s": self.period_s,
            "gpu_kwh": kwh,
            "day_projection": day_projection(self.period_s),
            "gpu_kwh_per_day": day(kwh),
            "facility_kwh": facility_kwh,
            "facility_kwh_per_day": day(facility_kwh),
            "idle_kwh": self.idle_j / 3.6e6,
            "unattributed_kwh": self.unattributed_j / 3.6e6,
            "average_w": self.average_w,
            "peak_w": self.peak_w,
            "j_per_token": per_token,
            "class_kwh": {k: v / 3.6e6 for k, v in self.class_j.items()},
            "cache_hit_avoided_kwh": fresh * self.class_tokens.get("cache_hit_input", 0.0) / 3.6e6,
            "j_per_request_mean": (
                float((self.request_prefill_j + self.request_decode_j).sum()) / n
                if (n := int(np.count_nonzero(self.request_prefill_j + self.request_decode_j)))
                else None
            ),
            "electricity_usd": facility_kwh * self.settings.usd_per_kwh,
            "electricity_usd_per_day": day(facility_kwh * self.settings.usd_per_kwh),
            "usd_per_kwh": self.settings.usd_per_kwh,
            "pue": self.settings.pue,
            "pools": [
                {
                    "pool": p.name,
                    "hardware": p.hardware,
                    "gpus": p.gpus,
                    "gpu_kwh": p.total_j / 3.6e6,
                    "gpu_kwh_per_day": day(p.total_j / 3.6e6),
                    "idle_kwh": p.idle_j / 3.6e6,
                }
                for p in self.pools
            ],
            "missing_power": list(self.missing_power),
            "scope": "GPU board power (NVML-style); host, network and cooling only through PUE",
        }


@dataclass(frozen=True)
class EnergyPool:
    """What the energy of one pool needs of it: its replicas' numbers in the run's tables
    (``first_replica`` on, ``ranks`` of them), GPUs per rank, and the peaks MFU and MBU are over."""

    name: str | None
    hardware: str
    first_replica: int
    ranks: int
    gpus_per_rank: int
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    #: An autoscaled pool's seconds each rank was paid within the period (None: all of it): a
    #: rank idles only while provisioned (pipeline/replay/autoscale.py).
    paid_s: tuple[float, ...] | None = None

    @classmethod
    def of(cls, pool: RunPool) -> EnergyPool:
        return cls.of_fleet(pool.fleet, pool.name, pool.first_replica)

    @classmethod
    def of_fleet(cls, fleet: ResolvedFleet, name: str | None = None, first_replica: int = 0) -> EnergyPool:
        """A resolved fleet's ranks as one pool (a stored run's pool, or a replay plan holds in memory)."""
        dep = fleet.deployment
        hw = fleet.config.hardware
        return cls(
            name,
            Path(hw).stem if hw.endswith(".toml") else hw,
            first_replica,
            fleet.ranks,
            dep.gpus,
            dep.hardware.peak_for(dep.compute_dtype),
            dep.hardware.memory_bandwidth_bytes_per_s,
        )


def _col(table: Any, name: str) -> FloatArray:
    out: FloatArray = np.nan_to_num(table.column(name).to_numpy(zero_copy_only=False).astype(np.float64))
    return out


def _cumulative(start: FloatArray, end: FloatArray, amount: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Breakpoints (x, y) of the cumulative amount of spans sorted by start that do not overlap,
    each spread evenly over [start, end]: np.interp(t, x, y) is the amount up to ``t``."""
    cum = np.concatenate([[0.0], np.cumsum(amount)])
    x = np.empty(2 * start.size)
    y = np.empty(2 * start.size)
    x[0::2], x[1::2] = start, end
    y[0::2], y[1::2] = cum[:-1], cum[1:]
    return x, y


def _window(x: FloatArray, y: FloatArray, a: FloatArray, b: FloatArray) -> FloatArray:
    if x.size == 0:
        return np.zeros(a.shape)
    return np.interp(b, x, y) - np.interp(a, x, y)


_NONE = np.zeros(0, np.int64)


def _groups(keys: npt.NDArray[np.int64]) -> dict[int, npt.NDArray[np.int64]]:
    """The positions of each key's rows, in their order (one stable sort, not a scan per key)."""
    if keys.size == 0:
        return {}
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(np.diff(keys[order])) + 1
    return {int(keys[g[0]]): g for g in np.split(order, cuts)}


def _share(weights: FloatArray, total: float) -> FloatArray:
    s = float(weights.sum())
    return weights * (total / s) if s > 0 else np.zeros_like(weights)


def _peak_w(start: FloatArray, end: FloatArray, above_w: FloatArray, base_w: float) -> float:
    """The highest one-second mean of the fleet's power: ``base_w`` (every GPU at idle) plus each
    span's ``above_w`` spread over the seconds it covers."""
    if start.size == 0:
        return base_w
    t0 = math.floor(float(start.min()))
    n = math.ceil(float(end.max())) - t0 + 1
    bins = np.zeros(n + 1)
    s, e = start - t0, end - t0
    k0, k1 = np.floor(s).astype(np.int64), np.floor(e).astype(np.int64)
    same = k0 == k1
    np.add.at(bins, k0[same], above_w[same] * (e - s)[same])
    cross = ~same
    np.add.at(bins, k0[cross], above_w[cross] * (k0[cross] + 1 - s[cross]))
    np.add.at(bins, k1[cross], above_w[cross] * (e[cross] - k1[cross]))
    full = np.zeros(n + 2)  # whole seconds strictly between: a difference array of the rate
    np.add.at(full, k0[cross] + 1, above_w[cross])
    np.add.at(full, k1[cross], -above_w[cross])
    bins += np.cumsum(full)[: n + 1]
    return base_w + float(bins.max())


def run_energy(
    run_dir: Path,
    config: Mapping[str, Any],
    settings: EnergySettings | None = None,
    power: Mapping[str, PowerSpec] | None = None,
) -> RunEnergy:
    """The energy of a stored replay run (its steps and requests tables and its ``config.json``)
    with the power models ``power`` (default: the catalog's) and the electricity ``settings``
    (default: the run's fleet ``[energy]``, else the defaults)."""
    origin = str(run_dir / "config.json")
    pools = pools_of(config, origin)
    if settings is None:
        settings = settings_of(_recorded_energy(config), origin)
    models = load_power() if power is None else power
    period = stored_run_period(run_dir, config).seconds
    steps = read_parquet(
        run_dir / "steps.parquet",
        "replay_steps",
        ["replica", "start_s", "end_s", "steps", "prefill_tokens", "decode_tokens", "flops", "bytes", *_BOUND_COLUMNS],
    )
    req = read_parquet(
        run_dir / "requests.parquet",
        "replay_requests",
        [
            "replica",
            "status",
            "scheduled_s",
            "first_token_s",
            "finish_s",
            "fresh_input_tokens",
            "cache_hit_tokens",
            "output_tokens",
            "prefill_tokens",
        ],
    )
    s = {name: _col(steps, name) for name in steps.column_names}
    finished = pc.equal(req.column("status"), "finished").to_numpy(zero_copy_only=False).astype(bool)
    r = {name: _col(req, name) for name in req.column_names if name != "status"}
    parts = []
    for p in pools:
        part = EnergyPool.of(p)
        scaled = autoscale_record(config, p.name)
        if scaled is not None:  # (time 0 is the first arrival: the period starts there)
            part = replace(part, paid_s=tuple(paid_per_replica(scaled, 0.0, period, part.ranks).tolist()))
        parts.append(part)
    return energy_of(s, r, finished, parts, models, settings, period)


def spans_busy_energy(spans: Mapping[str, FloatArray], pool: EnergyPool, spec: PowerSpec) -> tuple[float, float]:
    """Board joules and GPU-seconds of a pool's step-log spans (columns as in :func:`energy_of`,
    every row on ``pool``'s ranks), with the same power per span as a run's energy: what a
    replay held in memory (``rooftrace plan``'s) draws while stepping, before any idle time."""
    dur = np.maximum(spans["end_s"] - spans["start_s"], 0.0)
    watts = spec.span_power_w(spans, pool.peak_flops_per_s, pool.bandwidth_bytes_per_s)
    return float((watts * dur).sum()) * pool.gpus_per_rank, float(dur.sum()) * pool.gpus_per_rank


def _recorded_energy(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    resolved = config.get("resolved")
    fleet = resolved.get("fleet") if isinstance(resolved, dict) else None
    if isinstance(resolved, dict) and isinstance(resolved.get("pools"), list) and resolved["pools"]:
        first = resolved["pools"][0]
        fleet = first.get("fleet") if isinstance(first, dict) else None
    table = fleet.get("energy") if isinstance(fleet, dict) else None
    return table if isinstance(table, dict) else None


def energy_of(
    s: Mapping[str, FloatArray],
    r: Mapping[str, FloatArray],
    finished: npt.NDArray[np.bool_],
    pools: Sequence[EnergyPool],
    models: Mapping[str, PowerSpec],
    settings: EnergySettings,
    period_s: float,
) -> RunEnergy:
    """The energy of a run given as columns: ``s`` the steps table's (replica, start_s, end_s,
    steps, prefill_tokens, decode_tokens, flops, bytes, compute_s, memory_s, comm_s, overhead_s),
    ``r`` the requests table's (replica, scheduled_s, first_token_s, finish_s, prefill_tokens,
    fresh_input_tokens, cache_hit_tokens, output_tokens) with ``finished`` marking the finished
    ones, over ``period_s`` (module doc)."""
    n_req = finished.size
    pre_j, dec_j = np.zeros(n_req), np.zeros(n_req)
    class_j = {"fresh_input": 0.0, "cache_hit_input": 0.0, "output": 0.0}
    unattributed = 0.0
    out: list[PoolEnergy] = []
    missing: list[str] = []
    starts, ends, above = [], [], []
    base_w = 0.0
    span_replica = s["replica"].astype(np.int64)
    done = np.flatnonzero(finished)
    req_groups = {k: done[rows] for k, rows in _groups(r["replica"].astype(np.int64)[done]).items()}
    for pool in pools:
        name, gpus_rank, ranks = pool.hardware, pool.gpus_per_rank, pool.ranks
        spec = models.get(name)
        if spec is None:
            missing.append(name)
            continue
        first, last = pool.first_replica, pool.first_replica + ranks
        in_pool = (span_replica >= first) & (span_replica < last)
        dur = np.maximum(s["end_s"][in_pool] - s["start_s"][in_pool], 0.0)
        watts = spec.span_power_w(
            {k: v[in_pool] for k, v in s.items()}, pool.peak_flops_per_s, pool.bandwidth_bytes_per_s
        )
        watts = watts * gpus_rank
        joules = watts * dur
        # idle: every rank's period less its busy time; ranks that never stepped idle all of it
        # (counted, not allocated: a fleet of a billion replicas is a number, not an array)
        stepped, at = np.unique(span_replica[in_pool] - first, return_inverse=True)
        busy_per_rank = np.bincount(at, weights=dur, minlength=stepped.size)
        if pool.paid_s is None:
            idle_s = float(np.maximum(period_s - busy_per_rank, 0.0).sum()) + (ranks - stepped.size) * max(
                period_s, 0.0
            )
        else:  # an autoscaled pool: each rank idles while paid and not stepping
            busy = np.zeros(ranks)
            inside = stepped < ranks
            busy[stepped[inside]] = busy_per_rank[inside]
            idle_s = float(np.maximum(np.asarray(pool.paid_s) - busy, 0.0).sum())
        idle = idle_s * spec.idle_w * gpus_rank
        out.append(PoolEnergy(pool.name, name, ranks * gpus_rank, float(joules.sum()), idle))
        starts.append(s["start_s"][in_pool])
        ends.append(s["end_s"][in_pool])
        above.append(watts - spec.idle_w * gpus_rank)
        base_w += spec.idle_w * gpus_rank * ranks
        p_tok, d_tok = s["prefill_tokens"][in_pool], s["decode_tokens"][in_pool]
        tok = p_tok + d_tok
        pf = np.divide(p_tok, tok, out=np.zeros_like(tok), where=tok > 0)
        span_pre, span_dec = joules * pf, joules * (1.0 - pf)
        span_dec = np.where(tok > 0, span_dec, 0.0)
        unattributed += float(joules[tok <= 0].sum())
        starts_in = s["start_s"][in_pool]
        for k, on in _groups(span_replica[in_pool]).items():
            on = on[np.argsort(starts_in[on], kind="stable")]  # the rank's spans in time order
            mine = req_groups.get(k, _NONE)
            a, b = s["start_s"][in_pool][on], s["end_s"][in_pool][on]
            e_pre, e_dec = float(span_pre[on].sum()), float(span_dec[on].sum())
            # prefill: the request's prefill tokens at the rank's J/token between scheduling and first token
            xe, ye = _cumulative(a, b, span_pre[on])
            xn, yn = _cumulative(a, b, p_tok[on])
            lo, hi = r["scheduled_s"][mine], r["first_token_s"][mine]
            pe, pn = _window(xe, ye, lo, hi), _window(xn, yn, lo, hi)
            avg = e_pre / max(float(p_tok[on].sum()), 1.0)
            rate = np.divide(pe, pn, out=np.full(pe.shape, avg), where=pn > 0)
            w_pre = r["prefill_tokens"][mine] * rate
            # decode: what one sequence decoding throughout a span is charged (the span's decode
            # joules over its decode sequences), accumulated over the request's decode interval
            xd, yd = _cumulative(a, b, _seq_j(span_dec[on], d_tok[on], s["steps"][in_pool][on]))
            wd = np.where(r["output_tokens"][mine] > 1, _window(xd, yd, hi, r["finish_s"][mine]), 0.0)
            if float(wd.sum()) <= 0:  # no decode interval overlaps a span: by decode tokens
                wd = np.maximum(r["output_tokens"][mine] - 1.0, 0.0)
            # a rank whose energy no finished request can take (none finished there): unattributed
            for weights, amount, into, cls in ((w_pre, e_pre, pre_j, "fresh_input"), (wd, e_dec, dec_j, "output")):
                if float(weights.sum()) > 0:
                    into[mine] = _share(weights, amount)
                    class_j[cls] += amount
                else:
                    unattributed += amount
    tokens = {
        "fresh_input": float(r["fresh_input_tokens"][finished].sum()),
        "cache_hit_input": float(r["cache_hit_tokens"][finished].sum()),
        "output": float(r["output_tokens"][finished].sum()),
    }
    total = sum(p.total_j for p in out)
    peak = _peak_w(
        np.concatenate(starts) if starts else np.zeros(0),
        np.concatenate(ends) if ends else np.zeros(0),
        np.concatenate(above) if above else np.zeros(0),
        base_w,
    )
    return RunEnergy(
        period_s=period_s,
        settings=settings,
        pools=tuple(out),
        class_j=class_j,
        class_tokens=tokens,
        request_prefill_j=pre_j,
        request_decode_j=dec_j,
        unattributed_j=unattributed,
        average_w=total / period_s if period_s > 0 else 0.0,
        peak_w=peak,
        missing_power=tuple(missing),
    )


def _seq_j(span_dec_j: FloatArray, decode_tokens: FloatArray, steps: FloatArray) -> FloatArray:
    """Decode joules one sequence is charged for decoding throughout each span: the span's decode
    joules per decode token times its steps (= over the sequences decoding in each step)."""
    return np.divide(span_dec_j * steps, decode_tokens, out=np.zeros_like(span_dec_j), where=decode_tokens > 0)


def energy_summary(run_dir: Path, usd_per_kwh: float | None = None, pue: float | None = None) -> dict[str, Any]:
    """A stored run's energy as ``replay --json`` and the report give it (:meth:`RunEnergy.to_dict`),
    with the electricity inputs of its fleet's ``[energy]`` overridden by the given ones."""
    config = read_config(config_path(run_dir))
    base = settings_of(_recorded_energy(config), str(config_path(run_dir)))
    return run_energy(run_dir, config, base.with_options(usd_per_kwh, pue)).to_dict()


def _n(x: float | None, unit: str = "") -> str:
    """A figure for people (no scientific notation; 'n/a' for none)."""
    if x is None:
        return "n/a"
    return f"{plain_number(x)}{unit}"


def _per_day(d: Mapping[str, Any], key: str, unit: str, dollars: bool = False) -> str:
    v = d.get(key)
    if v is None:
        return "not projected to a day"
    return f"${plain_number(v)}/day" if dollars else f"{plain_number(v)} {unit}/day"


def energy_lines(d: Mapping[str, Any]) -> list[str]:
    """The energy summary for people: a line of kWh and money, a line of power and J per token."""
    missing = d.get("missing_power") or []
    if missing and not d.get("pools"):
        return [f"energy: no power model for {', '.join(missing)} (pipeline/catalog/power.toml)"]
    per = d["j_per_token"]
    if d.get("gpu_kwh_per_day") is None:  # a span too short to extrapolate: no per-day figures
        over = f"{traffic_span(d['period_s'])}; not projected to a day"
        day_kwh = day_usd = ""
    else:
        over = d["day_projection"]
        day_kwh = f" = {_per_day(d, 'gpu_kwh_per_day', 'kWh')}"
        day_usd = f" = {_per_day(d, 'electricity_usd_per_day', '', dollars=True)}"
    lines = [
        f"energy: {_n(d['gpu_kwh'])} kWh GPU over {over}{day_kwh}; {_n(d['facility_kwh'])} kWh at PUE "
        f"{plain_number(d['pue'])} = ${_n(d['electricity_usd'])} at ${plain_number(d['usd_per_kwh'])}/kWh{day_usd}",
        f"power: mean {_n(d['average_w'], ' W')}, peak {_n(d['peak_w'], ' W')} (1 s); per token: fresh input "
        f"{_n(per.get('fresh_input'), ' J')}, output {_n(per.get('output'), ' J')}, cache-hit input 0 J (prefilling "
        f"them would have cost {_n(d['cache_hit_avoided_kwh'])} kWh)",
    ]
    if len(d["pools"]) > 1:
        lines.append(
            "energy by pool: "
            + "; ".join(f"{p['pool']} {_n(p['gpu_kwh'])} kWh ({p['gpus']} {p['hardware']})" for p in d["pools"])
        )
    if missing:
        lines.append(f"energy leaves out pools on {', '.join(missing)}: no power model (pipeline/catalog/power.toml)")
    return lines


def energy_rows(d: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The energy summary as the report's table: one row per figure, with its unit and basis."""
    per = d["j_per_token"]
    rows: list[dict[str, Any]] = [
        {"figure": "GPU energy", "value": f"{_n(d['gpu_kwh'])} kWh", "per day": _per_day(d, "gpu_kwh_per_day", "kWh")},
        {
            "figure": f"facility energy (PUE {plain_number(d['pue'])})",
            "value": f"{_n(d['facility_kwh'])} kWh",
            "per day": _per_day(d, "facility_kwh_per_day", "kWh"),
        },
        {
            "figure": f"electricity at ${plain_number(d['usd_per_kwh'])}/kWh",
            "value": f"${_n(d['electricity_usd'])}",
            "per day": _per_day(d, "electricity_usd_per_day", "", dollars=True),
        },
        {"figure": "idle GPU energy (between steps)", "value": f"{_n(d['idle_kwh'])} kWh", "per day": ""},
        {
            "figure": "mean / peak fleet power (1 s)",
            "value": f"{_n(d['average_w'])} / {_n(d['peak_w'], ' W')}",
            "per day": "",
        },
        {"figure": "per fresh input token", "value": _n(per.get("fresh_input"), " J"), "per day": ""},
        {"figure": "per output token", "value": _n(per.get("output"), " J"), "per day": ""},
        {
            "figure": "per cache-hit input token",
            "value": "0 J",
            "per day": f"prefilling them instead: {_n(d['cache_hit_avoided_kwh'])} kWh over the period",
        },
    ]
    if d.get("j_per_request_mean") is not None:
        rows.append(
            {"figure": "per finished request (mean)", "value": _n(d["j_per_request_mean"], " J"), "per day": ""}
        )
    if len(d["pools"]) > 1:
        for p in d["pools"]:
            rows.append(
                {
                    "figure": f"pool {p['pool']} ({p['gpus']} {p['hardware']})",
                    "value": f"{_n(p['gpu_kwh'])} kWh",
                    "per day": _per_day(p, "gpu_kwh_per_day", "kWh"),
                }
            )
    for name in d.get("missing_power") or []:
        rows.append({"figure": f"{name}: no power model", "value": "left out", "per day": ""})
    return rows
