"""``plan --objective``: what a passing configuration is chosen by, and the two figures it needs.

Without ``--objective`` the plan ranks by the GPUs' $/day, as it always did, and writes the same
files. With it, every configuration that meets the SLOs also gets

* its **cost stack a day** (pipeline/economics/stack.py ``build_stack``: the purchase model, N+k,
  spot restarts, overheads, electricity, margin), from the base fleet's ``[cost]`` table with the
  plan's options over it, parsed as ``rooftrace cost`` parses them; the electricity line is
  counted only with ``[cost] electricity = true`` (``--electricity``), as ``cost`` counts it;
* its **energy a day**: the board power of each span of its chosen replay (the step log the search
  keeps in memory, priced by pipeline/economics/energy.py's power model per GPU, the same as a
  stored run's), the window's busy joules scaled to the day as the plan scales busy GPU-time (by
  the day's tokens over the window's, at most every GPU busy), the rest of the provisioned GPUs'
  time at ``idle_w``, over the period of record and projected to 24 h.

``usd`` chooses the lowest stack total, ``energy`` the fewest GPU kWh a day (facility kWh is the
same order: × PUE), ``gpus`` the fewest GPUs; ties fall back to the plan's own ranking ($/day,
the simpler mode, p99 TTFT, the label)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.catalog import load_hardware
from pipeline.common.errors import ConfigError
from pipeline.economics.cost import run_cost_inputs
from pipeline.economics.energy import EnergyPool, EnergySettings, load_power, settings_of, spans_busy_energy
from pipeline.economics.stack import (
    CostInputs,
    CostLine,
    CostStack,
    PoolGpus,
    Purchase,
    build_stack,
    gpu_hour_price,
    load_purchases,
    with_options,
)
from pipeline.replay.fleet import FleetConfig, ResolvedFleet

#: What ``plan --objective`` chooses by (module doc).
OBJECTIVES: tuple[str, ...] = ("usd", "energy", "gpus")
#: The plan's cost-stack options, as rooftrace cost names them (its keywords of
#: pipeline.economics.stack.with_options; network, storage and operations are its overheads).
STACK_OPTIONS: tuple[str, ...] = (
    "purchase",
    "spot_interruptions_per_day",
    "spot_restart_s",
    "redundancy_replicas",
    "network",
    "storage",
    "operations",
    "margin_percent",
    "electricity",
)
_OVERHEADS = ("network", "storage", "operations")
#: Each option's flag on the command line (rooftrace cost's).
STACK_FLAGS: dict[str, str] = {
    "purchase": "--purchase",
    "spot_interruptions_per_day": "--spot-interruptions-per-day",
    "spot_restart_s": "--spot-restart-s",
    "redundancy_replicas": "--redundancy",
    "network": "--network",
    "storage": "--storage",
    "operations": "--operations",
    "margin_percent": "--margin",
    "electricity": "--electricity",
}


def check_objective(name: object) -> str:
    """The objective, or one line naming ``--objective`` and the choices."""
    if not isinstance(name, str) or name not in OBJECTIVES:
        raise ConfigError(f"--objective: unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    return name


def check_stack_options(
    options: Sequence[tuple[str, Any]] | Mapping[str, Any],
) -> tuple[tuple[str, Any], ...]:
    """The plan's cost-stack options as (key, value) pairs, each key once and known."""
    pairs = options.items() if isinstance(options, Mapping) else options
    out = tuple(pairs)
    if any(not (isinstance(p, tuple) and len(p) == 2) for p in out):
        raise ConfigError(f"cost options: expected (option, value) pairs, got {out!r}")
    keys = [k for k, _ in out]
    unknown = [k for k in keys if k not in STACK_OPTIONS]
    if unknown:
        raise ConfigError(f"cost options: unknown {unknown}; the options are {list(STACK_OPTIONS)}")
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"cost options: {twice} given more than once")
    return out


def _with_options(base: CostInputs, options: Sequence[tuple[str, Any]]) -> CostInputs:
    given = dict(options)
    overheads = {k: str(given.pop(k)) for k in _OVERHEADS if k in given}
    return with_options(base, overheads=overheads, **given)


@dataclass(frozen=True)
class StackPricing:
    """What every candidate's cost stack is built from: the stated inputs (the base fleet's
    ``[cost]`` with the plan's options over it), the purchase models, the electricity settings of
    the base fleet's ``[energy]`` and the base fleet's GPU (a ``[cost] usd_per_gpu_hour`` quote is
    that GPU's price: other GPUs take their catalog price × the purchase model's fraction)."""

    inputs: CostInputs
    inputs_file: str | None
    purchases: Mapping[str, Purchase]
    energy: EnergySettings
    base_hardware: str

    def gpu_price(self, hardware: str, override: float | None) -> tuple[float, str]:
        """$/GPU-hour of ``hardware`` in the stack, and what it is."""
        if override is not None:  # --gpu-price: the quoted price of the purchase model
            return override, f"{self.inputs.purchase} quoted (--gpu-price)"
        inputs = self.inputs
        if inputs.usd_per_gpu_hour is not None and hardware != self.base_hardware:
            inputs = replace(inputs, usd_per_gpu_hour=None, price_date=None)
        hw = load_hardware(hardware)
        return gpu_hour_price(hw.price_usd_per_gpu_hour, hw.price_date, inputs, self.purchases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs.to_dict(),
            "inputs_file": self.inputs_file,
            "usd_per_kwh": self.energy.usd_per_kwh,
            "pue": self.energy.pue,
        }


def stack_pricing(
    base: FleetConfig, base_file: str | None, options: Sequence[tuple[str, Any]], origin: str
) -> StackPricing:
    """The plan's :class:`StackPricing`: ``base_file``'s ``[cost]`` (None: the defaults) read as
    ``rooftrace cost`` reads a fleet file's, the options over it; ``[energy]`` of the base fleet."""
    inputs, read = run_cost_inputs({}, base_file, {})
    inputs = _with_options(inputs, options)
    energy = settings_of(dict(base.energy) if base.energy else None, origin)
    return StackPricing(inputs, read, load_purchases(), energy, base.hardware)


def candidate_energy(
    cols: Mapping[str, npt.NDArray[np.float64]],
    fleet: ResolvedFleet,
    gpus: int,
    busy_scale: float,
    period_s: float,
) -> dict[str, Any]:
    """GPU energy a day of a configuration from its chosen replay's span log ``cols`` (every rank
    of ``fleet``'s GPU and TP: a disaggregated fleet's two pools together): the spans' board
    joules × ``busy_scale`` (the day's busy GPU-time over the replay's), the rest of ``gpus`` ×
    ``period_s`` at idle power, × 86,400 / ``period_s``. A GPU without a power model gets None."""
    pool = EnergyPool.of_fleet(fleet)
    spec = load_power().get(pool.hardware)
    if spec is None:
        return {"hardware": pool.hardware, "gpus": gpus, "gpu_kwh_per_day": None, "missing_power": True}
    busy_j, busy_gpu_s = spans_busy_energy(cols, pool, spec)
    day_busy_gpu_s = busy_gpu_s * busy_scale
    idle_gpu_s = max(gpus * period_s - day_busy_gpu_s, 0.0)
    per_day = 86400.0 / period_s
    busy_kwh = busy_j * busy_scale / 3.6e6 * per_day
    idle_kwh = idle_gpu_s * spec.idle_w / 3.6e6 * per_day
    return {
        "hardware": pool.hardware,
        "gpus": gpus,
        "idle_w": spec.idle_w,
        "max_w": spec.max_w,
        "period_s": period_s,
        "busy_scale": busy_scale,
        "busy_gpu_hours_per_day": day_busy_gpu_s / 3600.0 * per_day,
        "busy_w_per_gpu": busy_j / busy_gpu_s if busy_gpu_s > 0 else None,
        "busy_kwh_per_day": busy_kwh,
        "idle_kwh_per_day": idle_kwh,
        "gpu_kwh_per_day": busy_kwh + idle_kwh,
        "missing_power": False,
    }


def energy_doc(energy: Mapping[str, Any], settings: EnergySettings) -> dict[str, Any]:
    """A candidate's energy with its facility kWh (× PUE) and electricity $ a day."""
    kwh = energy.get("gpu_kwh_per_day")
    facility = kwh * settings.pue if kwh is not None else None
    return {
        **energy,
        "facility_kwh_per_day": facility,
        "electricity_usd_per_day": facility * settings.usd_per_kwh if facility is not None else None,
        "usd_per_kwh": settings.usd_per_kwh,
        "pue": settings.pue,
    }


def electricity_line(energy: Mapping[str, Any], settings: EnergySettings, counted: bool) -> CostLine:
    """The stack's ``electricity`` line of a candidate, as ``rooftrace cost`` words it: counted
    with ``[cost] electricity = true`` (owned GPUs), else $0 with what it would be."""
    doc = energy_doc(energy, settings)
    if doc["facility_kwh_per_day"] is None:
        return CostLine("electricity", f"no power model for {energy.get('hardware')} (not counted)", 0.0)
    basis = (
        f"{doc['facility_kwh_per_day']:,.4g} kWh/day (GPU boards x PUE {settings.pue:g}) x "
        f"${settings.usd_per_kwh:g}/kWh"
    )
    usd_day = float(doc["electricity_usd_per_day"])
    if counted:
        return CostLine("electricity", basis, usd_day / 24.0)
    return CostLine(
        "electricity",
        f"not counted (a cloud GPU-hour price pays for the power; [cost] electricity = true or --electricity "
        f"for owned GPUs): {basis} = ${usd_day:,.2f}/day",
        0.0,
    )


def candidate_stack(
    pricing: StackPricing,
    hardware: str,
    pools: Sequence[tuple[str | None, int]],
    gpus_per_replica: int,
    override: float | None,
    energy: Mapping[str, Any],
    period_s: float,
) -> CostStack:
    """A configuration's cost stack: ``pools`` as (name, replicas) — one unnamed pool, or a
    disaggregated fleet's prefill and decode pools (N+k spares each) — on ``hardware``."""
    price, _ = pricing.gpu_price(hardware, override)
    gpus = [PoolGpus(name, n * gpus_per_replica, gpus_per_replica, price) for name, n in pools]
    line = electricity_line(energy, pricing.energy, pricing.inputs.electricity)
    return build_stack(gpus, pricing.inputs, period_s, [line])


def stack_doc(stack: CostStack, pricing: StackPricing, hardware: str, override: float | None) -> dict[str, Any]:
    """plan.json's ``cost_stack`` of a configuration: its lines a day and the GPU price used."""
    price, basis = pricing.gpu_price(hardware, override)
    return {
        "usd_per_gpu_hour": price,
        "price_basis": basis,
        "lines": [{k: v for k, v in row.items() if k != "usd"} for row in stack.rows()],
        "usd_per_day": stack.usd_per_day,
    }
