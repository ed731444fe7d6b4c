"""The full cost of a fleet as stated inputs, line by line, and the volume at which it beats a per-token price.

A fleet's cost is a stack of lines, each a rate in $ per hour and each shown (docs/economics.md,
"Cost stack"); none is folded into another:

* ``compute``: the GPUs the replay ran, at the purchase model's $/GPU-hour: the hardware entry's
  dated on-demand price × the purchase model's fraction (pipeline/catalog/cost.toml, cited), or a
  quoted price the fleet states (FLEET.toml ``[cost] usd_per_gpu_hour``, ``cost --gpu-price``);
* ``redundancy``: N+k, ``k`` spare replicas per pool, paid whether or not they serve;
* ``spot_restarts``: on spot capacity, the GPU-hours lost to interruptions: every replica (spares
  included) is interrupted ``spot_interruptions_per_day`` times a day and each interruption costs
  it ``spot_restart_s`` seconds of paid GPU time that serves nothing;
* ``network``, ``storage``, ``operations``: each a percentage of the GPU lines above (compute +
  redundancy + spot restarts) or a flat $ per hour;
* further lines a caller adds (``extra``: an energy line has its place here, before the margin);
* ``margin``: a percentage on top of every line above (a markup on cost: price = cost × (1 + m)).

Replacement: the same day's tokens priced per token by a provider (pipeline/economics/cost.py) give
a blended $ per million tokens ``p`` (its bill over the day's tokens, in the day's own mix); a
fleet that costs ``F`` $ a day whatever it serves beats it above ``V* = F / p × 10⁶`` tokens a
day (:func:`break_even_tokens_per_day`), as long as the fleet still meets its SLO at that volume.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml

COST_CATALOG = Path(__file__).resolve().parents[1] / "catalog" / "cost.toml"
PURCHASES: tuple[str, ...] = ("on_demand", "reserved_1y", "reserved_3y", "spot")
OVERHEADS: tuple[str, ...] = ("network", "storage", "operations")
#: Highest percentage accepted for an overhead or the margin (ten times the cost it is taken on).
MAX_PERCENT = 1000.0
#: Highest flat overhead accepted, $ per hour: as for a $/GPU-hour, far above any real figure and
#: low enough that every $ figure stays a finite JSON number.
MAX_USD_PER_HOUR = 1_000_000.0
MAX_REDUNDANCY_REPLICAS = 1000
#: A replica interrupted more than once a minute serves nothing.
MAX_INTERRUPTIONS_PER_DAY = 1440.0
MAX_RESTART_S = 86400.0


# --------------------------------------------------------------------------------------------
# purchase models (the catalog)


@dataclass(frozen=True)
class Purchase:
    """A purchase model's $/GPU-hour as a fraction of the on-demand one, with when and where it was read."""

    name: str
    fraction: float
    date: str
    source: str


def parse_purchases(data: Mapping[str, Any], origin: str) -> dict[str, Purchase]:
    """pipeline/catalog/cost.toml's ``[purchase.<name>]`` tables: every purchase model, each fraction in (0, 1]."""
    from pipeline.common.tomlschema import CostCatalogFile, check  # lazy: pydantic, loaded only when a file is read

    check(data, CostCatalogFile, origin)
    out: dict[str, Purchase] = {}
    for name, raw in data["purchase"].items():
        where = f"{origin} [purchase.{name}]"
        if name not in PURCHASES:
            raise ConfigError(f"{where}: unknown purchase model; the purchase models are {list(PURCHASES)}")
        fraction = raw["fraction_of_on_demand"]
        if not 0.0 < fraction <= 1.0:  # NaN fails too
            raise ConfigError(f"{where}: fraction_of_on_demand must be in (0, 1], got {fraction!r}")
        out[name] = Purchase(name, float(fraction), _day(raw["date"], where), raw["source"])
    missing = [p for p in PURCHASES if p not in out]
    if missing:
        raise ConfigError(f"{origin}: missing [purchase.<name>] table(s) {missing}")
    return out


def load_purchases(path: Path | str = COST_CATALOG) -> dict[str, Purchase]:
    return parse_purchases(read_toml(path, "cost catalog"), str(path))


def _day(value: Any, where: str, key: str = "date") -> str:
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        return value.isoformat()
    try:
        day = _dt.date.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        day = None
    if day is None:
        raise ConfigError(f"{where}: {key} must be a YYYY-MM-DD day, got {value!r}")
    if day > _dt.date.today():
        raise ConfigError(f"{where}: {key} {value} is in the future")
    return day.isoformat()


# --------------------------------------------------------------------------------------------
# the stated inputs: FLEET.toml [cost] and the command line


@dataclass(frozen=True)
class Overhead:
    """One overhead line: a percentage of the GPU lines, or a flat $ per hour (or neither: not set)."""

    name: str
    percent: float | None = None
    usd_per_hour: float | None = None

    def usd_per_hour_on(self, gpu_usd_per_hour: float) -> float:
        if self.percent is not None:
            return self.percent / 100.0 * gpu_usd_per_hour
        return self.usd_per_hour or 0.0

    @property
    def basis(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}% of the GPU lines"
        if self.usd_per_hour is not None:
            return f"${self.usd_per_hour:,.4g}/h flat"
        return "not set"


@dataclass(frozen=True)
class CostInputs:
    """What the full cost is computed from, each stated (FLEET.toml ``[cost]``, the command line) or
    a cited default (on demand, no spares, no overheads, no margin)."""

    purchase: str = "on_demand"
    #: A quoted $/GPU-hour for the purchase model (replaces the catalog price × fraction).
    usd_per_gpu_hour: float | None = None
    price_date: str | None = None
    spot_interruptions_per_day: float | None = None
    spot_restart_s: float | None = None
    redundancy_replicas: int = 0
    overheads: tuple[Overhead, ...] = tuple(Overhead(n) for n in OVERHEADS)
    margin_percent: float = 0.0
    #: Whether the run's electricity is a line of its own (owned GPUs: pipeline/economics/energy.py,
    #: the facility's kWh at the fleet's [energy] price). Off by default: a cloud GPU-hour price
    #: already pays for the power.
    electricity: bool = False
    #: Where the inputs were read ("defaults", a fleet file's [cost], "command line").
    origin: str = "defaults"

    def overhead(self, name: str) -> Overhead:
        return next(o for o in self.overheads if o.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "purchase": self.purchase,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "price_date": self.price_date,
            "spot_interruptions_per_day": self.spot_interruptions_per_day,
            "spot_restart_s": self.spot_restart_s,
            "redundancy_replicas": self.redundancy_replicas,
            **{f"{o.name}_percent": o.percent for o in self.overheads},
            **{f"{o.name}_usd_per_hour": o.usd_per_hour for o in self.overheads},
            "margin_percent": self.margin_percent,
            "electricity": self.electricity,
            "origin": self.origin,
        }


def _number(value: Any, where: str, key: str, least: float, most: float, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not least <= value <= most:
        raise ConfigError(f"{where}: {key} must be a number in [{least:g}, {most:,.0f}] {unit}, got {value!r}")
    return float(value)


def check_inputs(inputs: CostInputs, where: str) -> CostInputs:
    """Range and cross-key checks of stated inputs; one ConfigError line naming ``where`` and the key."""
    if inputs.purchase not in PURCHASES:
        raise ConfigError(f"{where}: purchase {inputs.purchase!r} unknown; choose one of {list(PURCHASES)}")
    if inputs.usd_per_gpu_hour is not None:
        _number(inputs.usd_per_gpu_hour, where, "usd_per_gpu_hour", 0.0, MAX_USD_PER_HOUR, "USD per GPU-hour")
    if isinstance(inputs.redundancy_replicas, bool) or not isinstance(inputs.redundancy_replicas, int):
        raise ConfigError(f"{where}: redundancy_replicas must be an integer, got {inputs.redundancy_replicas!r}")
    if not 0 <= inputs.redundancy_replicas <= MAX_REDUNDANCY_REPLICAS:
        raise ConfigError(
            f"{where}: redundancy_replicas must be in [0, {MAX_REDUNDANCY_REPLICAS}] spare replicas per pool, "
            f"got {inputs.redundancy_replicas!r}"
        )
    for o in inputs.overheads:
        if o.percent is not None and o.usd_per_hour is not None:
            raise ConfigError(f"{where}: {o.name}_percent and {o.name}_usd_per_hour both set: keep one")
        if o.percent is not None:
            _number(o.percent, where, f"{o.name}_percent", 0.0, MAX_PERCENT, "%")
        if o.usd_per_hour is not None:
            _number(o.usd_per_hour, where, f"{o.name}_usd_per_hour", 0.0, MAX_USD_PER_HOUR, "USD per hour")
    _number(inputs.margin_percent, where, "margin_percent", 0.0, MAX_PERCENT, "%")
    if not isinstance(inputs.electricity, bool):
        raise ConfigError(f"{where}: electricity must be true or false, got {inputs.electricity!r}")
    spot_keys = {
        "spot_interruptions_per_day": inputs.spot_interruptions_per_day,
        "spot_restart_s": inputs.spot_restart_s,
    }
    if inputs.purchase == "spot":
        missing = [k for k, v in spot_keys.items() if v is None]
        if missing:
            raise ConfigError(
                f"{where}: purchase = 'spot' needs {missing}: no cloud publishes a GPU spot interruption rate to "
                "default to (docs/economics.md, 'Cost stack'); state yours"
            )
        _number(
            inputs.spot_interruptions_per_day,
            where,
            "spot_interruptions_per_day",
            0.0,
            MAX_INTERRUPTIONS_PER_DAY,
            "per replica per day",
        )
        _number(inputs.spot_restart_s, where, "spot_restart_s", 0.0, MAX_RESTART_S, "s")
    else:
        given = [k for k, v in spot_keys.items() if v is not None]
        if given:
            raise ConfigError(f"{where}: {given} apply to purchase = 'spot' only (purchase is {inputs.purchase!r})")
    return inputs


def parse_cost_table(raw: Mapping[str, Any], where: str) -> CostInputs:
    """FLEET.toml's ``[cost]`` table (keys and types: ``CostTable`` in pipeline/common/tomlschema.py)."""
    from pipeline.common.tomlschema import CostTable, check  # lazy: pydantic, loaded only when a file is read

    check(raw, CostTable, where)
    overheads = tuple(
        Overhead(n, _opt_float(raw.get(f"{n}_percent")), _opt_float(raw.get(f"{n}_usd_per_hour"))) for n in OVERHEADS
    )
    date = _day(raw["price_date"], where, "price_date") if "price_date" in raw else None
    if date is not None and "usd_per_gpu_hour" not in raw:
        raise ConfigError(f"{where}: price_date dates a quoted usd_per_gpu_hour, which is not set")
    inputs = CostInputs(
        purchase=raw.get("purchase", "on_demand"),
        usd_per_gpu_hour=_opt_float(raw.get("usd_per_gpu_hour")),
        price_date=date,
        spot_interruptions_per_day=_opt_float(raw.get("spot_interruptions_per_day")),
        spot_restart_s=_opt_float(raw.get("spot_restart_s")),
        redundancy_replicas=raw.get("redundancy_replicas", 0),
        overheads=overheads,
        margin_percent=float(raw.get("margin_percent", 0.0)),
        electricity=raw.get("electricity", False),
        origin=where,
    )
    return check_inputs(inputs, where)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def parse_overhead_option(text: str, option: str) -> tuple[float | None, float | None]:
    """``--network 10%`` (a percentage of the GPU lines) or ``--network 2.5/h`` ($ per hour):
    (percent, usd_per_hour)."""
    t = text.strip().removeprefix("$")
    try:
        if t.endswith("%"):
            return float(t[:-1]), None
        if t.endswith("/h"):
            return None, float(t[:-2].strip().removeprefix("$"))
    except ValueError:
        pass
    raise ConfigError(f"{option}: {text!r} must be a percentage of the GPU cost ('10%') or dollars per hour ('2.5/h')")


def with_options(
    base: CostInputs,
    *,
    purchase: str | None = None,
    usd_per_gpu_hour: float | None = None,
    spot_interruptions_per_day: float | None = None,
    spot_restart_s: float | None = None,
    redundancy_replicas: int | None = None,
    overheads: Mapping[str, str] | None = None,
    margin_percent: float | None = None,
    electricity: bool | None = None,
) -> CostInputs:
    """``base`` with the command line's options over it (each option set wins over the file's key)."""
    changed: dict[str, Any] = {}
    if purchase is not None:
        changed["purchase"] = purchase
        if purchase != "spot":  # a file's spot keys do not follow the fleet off spot capacity
            changed |= {"spot_interruptions_per_day": None, "spot_restart_s": None}
    if usd_per_gpu_hour is not None:
        changed |= {"usd_per_gpu_hour": usd_per_gpu_hour, "price_date": None}
    if spot_interruptions_per_day is not None:
        changed["spot_interruptions_per_day"] = spot_interruptions_per_day
    if spot_restart_s is not None:
        changed["spot_restart_s"] = spot_restart_s
    if redundancy_replicas is not None:
        changed["redundancy_replicas"] = redundancy_replicas
    if margin_percent is not None:
        changed["margin_percent"] = margin_percent
    if electricity is not None:
        changed["electricity"] = electricity
    if overheads:
        lines = {o.name: o for o in base.overheads}
        for name, text in overheads.items():
            percent, usd = parse_overhead_option(text, f"--{name}")
            lines[name] = Overhead(name, percent, usd)
        changed["overheads"] = tuple(lines[n] for n in OVERHEADS)
    if not changed:
        return base
    origin = "command line" if base.origin == "defaults" else f"{base.origin} and the command line"
    return check_inputs(replace(base, origin=origin, **changed), "cost options")


def gpu_hour_price(
    on_demand: float, on_demand_date: str, inputs: CostInputs, purchases: Mapping[str, Purchase]
) -> tuple[float, str]:
    """The $/GPU-hour the stack's GPU lines use and what it is: a quoted price, or the hardware
    entry's on-demand price × the purchase model's fraction (1 on demand)."""
    if inputs.usd_per_gpu_hour is not None:
        return inputs.usd_per_gpu_hour, f"{inputs.purchase} quoted ({inputs.price_date or 'undated'})"
    p = purchases[inputs.purchase]
    if inputs.purchase == "on_demand":
        return on_demand, on_demand_date
    return on_demand * p.fraction, f"{on_demand_date} on demand x {p.fraction:g} {p.name} ({p.date})"


# --------------------------------------------------------------------------------------------
# the stack


@dataclass(frozen=True)
class PoolGpus:
    """One pool's GPUs as the stack prices them."""

    name: str | None
    #: GPUs paid over the period: the fleet's, or an autoscaled pool's mean (its provisioned
    #: GPU-hours over the period's hours, pipeline/replay/autoscale.py)
    gpus: float
    gpus_per_replica: int
    usd_per_gpu_hour: float


@dataclass(frozen=True)
class CostLine:
    """One line of the stack: a rate in $ per hour and what it was computed from."""

    key: str
    basis: str
    usd_per_hour: float

    def usd_over(self, period_s: float) -> float:
        return self.usd_per_hour * period_s / 3600.0


@dataclass(frozen=True)
class CostStack:
    lines: tuple[CostLine, ...]
    period_s: float
    inputs: CostInputs

    @property
    def total_usd_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.lines)

    @property
    def total_usd(self) -> float:
        return self.total_usd_per_hour * self.period_s / 3600.0

    @property
    def usd_per_day(self) -> float:
        return self.total_usd_per_hour * 24.0

    def line(self, key: str) -> CostLine:
        return next(x for x in self.lines if x.key == key)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "line": x.key,
                "basis": x.basis,
                "usd_per_hour": x.usd_per_hour,
                "usd": x.usd_over(self.period_s),
                "usd_per_day": x.usd_per_hour * 24.0,
            }
            for x in self.lines
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs.to_dict(),
            "lines": self.rows(),
            "total_usd_per_hour": self.total_usd_per_hour,
            "total_usd": self.total_usd,
            "usd_per_day": self.usd_per_day,
        }


def _count(gpus: float) -> float | int:
    """A GPU count as written: whole when it is (an autoscaled pool's mean keeps two decimals)."""
    return int(gpus) if float(gpus).is_integer() else round(gpus, 2)


def build_stack(
    pools: Sequence[PoolGpus], inputs: CostInputs, period_s: float, extra: Sequence[CostLine] = ()
) -> CostStack:
    """The cost stack of ``pools`` (each at its own $/GPU-hour, already the purchase model's) over
    ``period_s``: every line of the module's list, in order, ``extra`` lines before the margin."""
    k = inputs.redundancy_replicas
    compute = sum(p.gpus * p.usd_per_gpu_hour for p in pools)
    spare = sum(k * p.gpus_per_replica * p.usd_per_gpu_hour for p in pools)
    gpus = _count(sum(p.gpus for p in pools))
    spare_gpus = sum(k * p.gpus_per_replica for p in pools)
    lost = 0.0
    spot_basis = f"not spot ({inputs.purchase})"
    if inputs.purchase == "spot":
        per_day = inputs.spot_interruptions_per_day or 0.0
        restart_s = inputs.spot_restart_s or 0.0
        # each paid GPU loses per_day × restart_s seconds a day: that share of its hours again
        share = per_day * restart_s / 86400.0
        lost = sum((p.gpus + k * p.gpus_per_replica) * p.usd_per_gpu_hour for p in pools) * share
        spot_basis = (
            f"{_count(gpus + spare_gpus)} GPUs x {per_day:g} interruptions/day x {restart_s:g} s lost each "
            f"= {share:.4%} more GPU-hours"
        )
    lines = [
        CostLine("compute", f"{gpus} GPUs x $/GPU-h ({inputs.purchase})", compute),
        CostLine(
            "redundancy",
            f"N+{k}: {k} spare replica{'s' if k > 1 else ''} per pool, {spare_gpus} GPU{'s' if spare_gpus != 1 else ''}"
            if k
            else "N+0: no spare replicas",
            spare,
        ),
        CostLine("spot_restarts", spot_basis, lost),
    ]
    gpu_lines = compute + spare + lost
    lines += [CostLine(o.name, o.basis, o.usd_per_hour_on(gpu_lines)) for o in inputs.overheads]
    lines += list(extra)
    subtotal = sum(x.usd_per_hour for x in lines)
    margin = inputs.margin_percent / 100.0 * subtotal
    lines.append(CostLine("margin", f"{inputs.margin_percent:g}% on every line above", margin))
    return CostStack(tuple(lines), period_s, inputs)


# --------------------------------------------------------------------------------------------
# replacement: a per-token price against the fleet's fixed cost


def blended_usd_per_million(usd: float, tokens: float) -> float | None:
    """$ per million tokens of a bill over ``tokens`` (every token class together, the traffic's own mix)."""
    return usd / tokens * 1e6 if tokens > 0 and math.isfinite(usd) else None


def break_even_tokens_per_day(fleet_usd_per_day: float, usd_per_million: float | None) -> float | None:
    """``V* = F / p × 10⁶``: tokens a day (in the priced mix) above which a fleet costing
    ``fleet_usd_per_day`` whatever it serves is cheaper than ``usd_per_million`` per million tokens
    (None: a free alternative is never beaten)."""
    if usd_per_million is None or usd_per_million <= 0:
        return None
    return fleet_usd_per_day / usd_per_million * 1e6
