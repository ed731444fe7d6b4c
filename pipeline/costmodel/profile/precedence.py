"""Which measured set prices a fleet where several cover its GPU's operator (the stated
precedence of ``pipeline/catalog/profiles/sources.toml``, docs/validation.md "Several measured
sources").

A profile keeps every set's rows where sets overlap (pipeline/costmodel/profile/select.py); when
it is read, each family's groups (GEMMs per dtype, attention per KV dtype) take the rows of the
first set in the fleet's order that measured them (:func:`choose_sets`). The order
(:func:`source_order`): the fleet's ``measured_source`` first, then the sets measured on the
fleet's serving stack, then those measured as that stack runs by default (CUDA graphs on), then
the set whose version is nearest the fleet's ``[engine] vllm_version`` (where set), then the
file's ``precedence``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import polars as pl

from pipeline.catalog import CATALOG_DIR
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml

SOURCES_FILE = CATALOG_DIR / "profiles" / "sources.toml"
#: The serving stack rooftrace replays (its engine follows vLLM V1).
FLEET_STACK = "vllm"
#: Families whose rows several sets may hold, and the column that groups them (a set is chosen
#: per group: a GPU's bf16 GEMMs may come from one set and its fp8 GEMMs from another).
GROUPED_BY = {"gemm": "dtype", "attn_decode": "kv_dtype", "attn_prefill": "kv_dtype"}
#: FLEET.toml ``measured_source``'s default: the stated precedence.
AUTO = "auto"


@dataclass(frozen=True)
class MeasuredSet:
    name: str
    stack: str
    version: str
    cuda_graphs: bool
    what: str
    source: str

    def label(self) -> str:
        mode = "CUDA graphs" if self.cuda_graphs else "eager"
        return f"{self.name} ({self.stack} {self.version}, {mode})"


@dataclass(frozen=True)
class Sources:
    precedence: tuple[str, ...]
    sets: dict[str, MeasuredSet]


_SET_KEYS = {"stack": str, "version": str, "cuda_graphs": bool, "what": str, "source": str}


@cache
def load_sources() -> Sources:
    """The catalog's sources.toml, checked: every key known and typed, the precedence naming
    each set once."""
    data = read_toml(SOURCES_FILE, "measured sources")
    where = str(SOURCES_FILE)
    unknown = sorted(set(data) - {"precedence", "sets"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}")
    raw_sets = data.get("sets")
    if not isinstance(raw_sets, dict) or not raw_sets:
        raise ConfigError(f"{where}: [sets] must hold one table per measured set")
    sets: dict[str, MeasuredSet] = {}
    for name, entry in raw_sets.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: [sets.{name}] must be a table")
        bad = sorted(set(entry) ^ set(_SET_KEYS))
        if bad:
            raise ConfigError(f"{where}: [sets.{name}] unknown or missing key(s) {bad}")
        for key, typ in _SET_KEYS.items():
            if not isinstance(entry[key], typ):
                raise ConfigError(f"{where}: [sets.{name}] {key} must be a {typ.__name__}")
        sets[name] = MeasuredSet(name, **entry)
    order = data.get("precedence")
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(sets):
        raise ConfigError(f"{where}: precedence must name each set of [sets] once: {sorted(sets)}")
    return Sources(tuple(order), sets)


def known_sources() -> list[str]:
    """What FLEET.toml's ``measured_source`` accepts."""
    return [AUTO, *load_sources().precedence]


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.strip().split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _distance(a: str, b: str) -> float:
    va, vb = _version(a), _version(b)
    va += (0,) * (3 - len(va))
    vb += (0,) * (3 - len(vb))
    return abs((va[0] - vb[0]) * 1e6 + (va[1] - vb[1]) * 1e3 + (va[2] - vb[2]))


def source_order(measured_source: str = AUTO, vllm_version: str | None = None) -> tuple[str, ...]:
    """Every set, in the order they price a fleet (module doc)."""
    src = load_sources()
    if measured_source not in (AUTO, *src.sets):
        raise ConfigError(f"measured_source {measured_source!r} unknown; choose one of {known_sources()}")
    rank = {name: i for i, name in enumerate(src.precedence)}

    def key(name: str) -> tuple[Any, ...]:
        s = src.sets[name]
        near = _distance(s.version, vllm_version) if vllm_version else 0.0
        return (name != measured_source, s.stack != FLEET_STACK, not s.cuda_graphs, near, rank[name])

    return tuple(sorted(src.sets, key=key))


def covering(frames: dict[str, pl.DataFrame]) -> dict[str, dict[str, list[str]]]:
    """Per family and group, the sets whose rows ``frames`` hold (several where they overlap)."""
    out: dict[str, dict[str, list[str]]] = {}
    for fam, col in GROUPED_BY.items():
        f = frames.get(fam)
        if f is None or f.height == 0 or "set" not in f.columns:
            continue
        groups = f.group_by(col).agg(pl.col("set").unique().sort()).sort(col)
        out[fam] = {str(g): [str(s) for s in sets] for g, sets in groups.iter_rows()}
    return out


def choose_sets(frames: dict[str, pl.DataFrame], order: tuple[str, ...]) -> dict[str, pl.DataFrame]:
    """``frames`` with, per family and group, only the rows of the first set of ``order`` that
    measured it (a set the order does not name comes after those it does)."""
    out = dict(frames)
    rank = {name: i for i, name in enumerate(order)}
    for fam, col in GROUPED_BY.items():
        f = frames.get(fam)
        if f is None or f.height == 0 or "set" not in f.columns:
            continue
        if f["set"].n_unique() < 2:
            continue
        first = (
            f.select(col, "set")
            .unique()
            .with_columns(pl.col("set").replace_strict(rank, default=len(rank), return_dtype=pl.Int64).alias("__r"))
            .sort([col, "__r", "set"])
            .group_by(col, maintain_order=True)
            .first()
            .select(col, "set")
        )
        out[fam] = f.join(first, on=[col, "set"], how="semi", maintain_order="left")
    return out


def alternatives(frames: dict[str, pl.DataFrame]) -> list[str]:
    """The sets that cover a group another set covers too (those a band can re-price with)."""
    names: set[str] = set()
    for groups in covering(frames).values():
        for sets in groups.values():
            if len(sets) > 1:
                names.update(sets)
    return sorted(names)


def describe_choice(frames: dict[str, pl.DataFrame], order: tuple[str, ...], measured_source: str) -> dict[str, str]:
    """What the run records: per family and group where sets overlap, the set chosen and the
    others, with why."""
    src = load_sources()
    rank = {name: i for i, name in enumerate(order)}
    out: dict[str, str] = {}
    why = (
        f"measured_source = {measured_source!r}"
        if measured_source != AUTO
        else "stated precedence (pipeline/catalog/profiles/sources.toml): the fleet's stack, CUDA graphs as vLLM "
        "runs by default, nearest vLLM version, then the file's order"
    )
    for fam, groups in covering(frames).items():
        for group, sets in groups.items():
            ranked = sorted(sets, key=lambda s: rank.get(s, len(rank)))

            def label(name: str) -> str:
                return src.sets[name].label() if name in src.sets else name

            text = label(ranked[0])
            if len(ranked) > 1:
                text += " over " + ", ".join(label(s) for s in ranked[1:]) + f" ({why})"
            out[f"{fam}:{group}"] = text
    return out
