"""A fleet of pools: FLEET.toml's ``[[pool]]`` tables, and the rule that sends each request to one.

A fleet file without ``[[pool]]`` tables is one homogeneous pool (pipeline.replay.fleet.FleetConfig),
read and replayed exactly as before. With them, the file's top-level keys (``name``, ``model``,
``[slo]``, and any fleet key such as ``hardware``, ``tp`` or ``[engine]``) are the defaults each
pool starts from, and every ``[[pool]]`` table is one homogeneous pool — its own hardware,
tp/pp/dp/ep, replicas, router, engine settings, dtypes and calibration — with a ``name``, a
``role`` and a ``[pool.match]`` rule::

    name = "split"
    model = "llama-3.1-8b"

    [[pool]]
    name = "long"
    hardware = "h200-sxm"
    replicas = 2
    [pool.match]
    min_input_tokens = 8192        # prompts of 8,192 tokens or more

    [[pool]]
    name = "rest"                  # the last pool has no match: it takes every other request
    hardware = "h100-sxm"
    replicas = 4

Requests go to the first pool whose rule they match, the last pool taking the rest: a rule is
``tenant`` (a list of tenant names), ``min_input_tokens`` / ``max_input_tokens`` (the logged
prompt length, both bounds inclusive), or several of them (all must hold). Inside a pool its own
``router`` spreads the pool's requests over its replicas.

Roles (:data:`ROLES`): ``unified`` (the default: a pool's replicas prefill and decode the
requests it is sent); ``prefill`` (the pool takes requests by its rule, as a unified pool does,
computes each prompt and its first token, and hands the request with its prompt's KV over a link
to a decode pool: ``[pool.handoff] to = "<decode pool>"``, by default the fleet's only decode
pool; the link is ``[pool.link]``, else the fleet's ``[link]``); ``decode`` (the pool takes no
request by rule, only those its prefill pools hand it, and decodes their output). A fleet with
prefill pools has decode pools and every decode pool is some prefill pool's target
(docs/pools.md, "Disaggregated prefill/decode").

Speculative decoding (``[speculative]``, docs/engine.md) runs where tokens are decoded: the fleet's
``[speculative]`` is every unified and decode pool's, and a pool's own ``[pool.speculative]``
replaces it. A prefill pool samples one token a request and never verifies drafts, so it takes no
``[speculative]`` of its own; it loads its decode pool's drafter when that is a model (EAGLE,
EAGLE-3, MTP, a draft model: vLLM's NIXL hand-off needs both sides to agree on the drafter's KV
layers, and the drafter's KV moves with the prompt's), which its memory fit counts
(:func:`_drafters`).

Each pool is resolved and replayed as a fleet of its own (pipeline.replay.run replays them one after
another and writes one run whose tables carry a ``pool`` column); a pool's fleet is named
``<fleet>-<pool>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.catalog.entries import CATALOG_DIR
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.engine.model import EngineResult, Workload
from pipeline.replay.fleet import MAX_ENGINES, FleetConfig, check_loaded_fleet, parse_fleet

#: What a pool's replicas do with the requests it is sent. ``unified``: prefill and decode;
#: ``prefill``: the prompt and the first token, then hand the request to a decode pool;
#: ``decode``: the output of the requests prefill pools hand it (none by rule).
ROLES: tuple[str, ...] = ("unified", "prefill", "decode")
#: The keys of a ``[pool.match]`` rule.
MATCH_KEYS: tuple[str, ...] = ("tenant", "min_input_tokens", "max_input_tokens")
#: Keys of the whole fleet that a pool may not set: one fleet serves one model and is judged
#: against one SLO.
FLEET_ONLY_KEYS: tuple[str, ...] = ("model", "slo", "description", "cost")
#: The keys of a ``[[pool]]`` table that are the pool's own, not fleet keys.
POOL_KEYS: tuple[str, ...] = ("name", "role", "match", "handoff", "link")
#: The keys of a link table (``[pool.link]`` or the fleet's ``[link]``).
LINK_KEYS: tuple[str, ...] = ("kind", "bandwidth_gb_s", "latency_us", "layerwise")
#: A link's bandwidth bounds, GB/s: above 0, at most 100 TB/s (NVLink 5 gives a GPU 1.8 TB/s in
#: all, NVIDIA GB200 NVL72 datasheet 2024: 50x that is no link).
MAX_LINK_GB_S = 100_000.0
#: A link's latency bound, µs: one second per transfer.
MAX_LINK_LATENCY_US = 1e6
#: Most pools one fleet holds (each is replayed as a fleet of its own).
MAX_POOLS = 64
POOL_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,31}")


@dataclass(frozen=True)
class PoolMatch:
    """Which requests a pool takes: every condition set must hold (none set: every request)."""

    tenants: tuple[str, ...] | None = None
    min_input_tokens: int | None = None
    max_input_tokens: int | None = None

    @property
    def catch_all(self) -> bool:
        return self.tenants is None and self.min_input_tokens is None and self.max_input_tokens is None

    @property
    def columns(self) -> tuple[str, ...]:
        """The request columns the rule reads."""
        cols = []
        if self.tenants is not None:
            cols.append("tenant")
        if self.min_input_tokens is not None or self.max_input_tokens is not None:
            cols.append("recorded_input_tokens")
        return tuple(cols)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tenants is not None:
            out["tenant"] = list(self.tenants)
        if self.min_input_tokens is not None:
            out["min_input_tokens"] = self.min_input_tokens
        if self.max_input_tokens is not None:
            out["max_input_tokens"] = self.max_input_tokens
        return out

    def text(self) -> str:
        """The rule for people: 'tenant in [a, b] and input tokens ≥ 8,192'; 'every other request'."""
        parts = []
        if self.tenants is not None:
            parts.append(f"tenant in [{', '.join(self.tenants)}]")
        lo, hi = self.min_input_tokens, self.max_input_tokens
        if lo is not None and hi is not None:
            parts.append(f"input tokens {lo:,}–{hi:,}")
        elif lo is not None:
            parts.append(f"input tokens ≥ {lo:,}")
        elif hi is not None:
            parts.append(f"input tokens ≤ {hi:,}")
        return " and ".join(parts) if parts else "every other request"

    def mask(self, frame: pl.DataFrame) -> npt.NDArray[np.bool_]:
        """Which rows of ``frame`` (canonical requests holding :attr:`columns`) match."""
        expr = pl.lit(True)
        if self.tenants is not None:
            expr = expr & pl.col("tenant").is_in(list(self.tenants)).fill_null(False)
        if self.min_input_tokens is not None:
            expr = expr & (pl.col("recorded_input_tokens") >= self.min_input_tokens)
        if self.max_input_tokens is not None:
            expr = expr & (pl.col("recorded_input_tokens") <= self.max_input_tokens)
        out = frame.select(expr.alias("m")).get_column("m")
        if out.len() != frame.height:  # a literal over a frame is one row
            return np.full(frame.height, bool(out[0]), np.bool_)
        return np.asarray(out.to_numpy(), np.bool_)


@dataclass(frozen=True)
class LinkSpec:
    """A link as a fleet file writes it: its kind (pipeline/catalog/links.toml gives the kind's
    default bandwidth and latency), its bandwidth in GB/s per direction per GPU, its latency per
    transfer in µs, and whether the transfer overlaps the prefill layer by layer."""

    kind: str
    bandwidth_gb_s: float
    latency_us: float
    layerwise: bool = False

    def link(self) -> Link:
        return Link(self.bandwidth_gb_s * 1e9, self.latency_us * 1e-6, self.layerwise)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bandwidth_gb_s": self.bandwidth_gb_s,
            "latency_us": self.latency_us,
            "layerwise": self.layerwise,
        }

    def text(self) -> str:
        lw = ", layer-wise" if self.layerwise else ""
        return f"{self.kind} {self.bandwidth_gb_s:g} GB/s, {self.latency_us:g} µs{lw}"


@dataclass(frozen=True)
class Pool:
    """One homogeneous pool of a fleet: a name, a role, the requests it takes, and its fleet; a
    prefill pool also names the decode pool it hands to (``handoff``) and the link between them."""

    name: str
    role: str
    match: PoolMatch
    config: FleetConfig
    handoff: str | None = None
    link: LinkSpec | None = None

    @property
    def takes_requests(self) -> bool:
        """Whether the pool takes requests by rule (a decode pool takes only handed-off ones)."""
        return self.role != "decode"

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "role": self.role, "match": self.match.to_dict(), "fleet": self.config.to_dict()}
        if self.handoff is not None:
            out["handoff"] = {"to": self.handoff}
        if self.link is not None:
            out["link"] = self.link.to_dict()
        return out


@dataclass(frozen=True)
class PooledFleet:
    """A fleet of two or more pools (FLEET.toml with ``[[pool]]`` tables)."""

    name: str
    model: str
    pools: tuple[Pool, ...]
    slo: str | None = None
    description: str = ""
    #: The fleet's own keys as the file wrote them, without its pools (recorded with the run).
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> tuple[str, ...]:
        """The request columns the pools' rules read."""
        return tuple(dict.fromkeys(c for p in self.pools for c in p.match.columns))

    @property
    def disaggregated(self) -> bool:
        """Whether the fleet has prefill and decode pools."""
        return any(p.role == "prefill" for p in self.pools)

    def index(self, name: str) -> int:
        return next(i for i, p in enumerate(self.pools) if p.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "slo": self.slo,
            "description": self.description,
            "pools": [p.to_dict() for p in self.pools],
        }

    def assign(self, frame: pl.DataFrame) -> npt.NDArray[np.int32]:
        """Each request's pool (its index in :attr:`pools`): the first whose rule it matches; the
        last pool that takes requests by rule (a decode pool takes none), which has no rule, takes
        the rest."""
        entry = [i for i, p in enumerate(self.pools) if p.takes_requests]
        out = np.full(frame.height, entry[-1], np.int32)
        free = np.ones(frame.height, np.bool_)
        for i in entry[:-1]:
            hit = free & self.pools[i].match.mask(frame)
            out[hit] = i
            free &= ~hit
        return out


def is_pooled(data: Mapping[str, Any]) -> bool:
    """Whether a parsed fleet file (or a run's recorded fleet) has ``[[pool]]`` tables."""
    return "pool" in data or "pools" in data


def _match(raw: Any, where: str) -> PoolMatch:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: match must be a table ([pool.match]), got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(MATCH_KEYS))
    if unknown:
        raise ConfigError(f"{where} [pool.match]: unknown key(s) {unknown}; a rule has {list(MATCH_KEYS)}")
    tenants = None
    if "tenant" in raw:
        t = raw["tenant"]
        if isinstance(t, str):
            t = [t]
        if not isinstance(t, list) or not t or not all(isinstance(x, str) and x for x in t):
            raise ConfigError(f"{where} [pool.match]: tenant must be a non-empty list of tenant names, got {t!r}")
        tenants = tuple(dict.fromkeys(t))
    bounds: dict[str, int | None] = {}
    for key in ("min_input_tokens", "max_input_tokens"):
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**62):
            raise ConfigError(f"{where} [pool.match]: {key} must be a whole number of tokens >= 0, got {v!r}")
        bounds[key] = v
    lo, hi = bounds["min_input_tokens"], bounds["max_input_tokens"]
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(f"{where} [pool.match]: min_input_tokens {lo:,} is above max_input_tokens {hi:,}")
    rule = PoolMatch(tenants, lo, hi)
    if rule.catch_all:
        raise ConfigError(f"{where} [pool.match]: an empty rule; leave match out of the last pool instead")
    return rule


def link_kinds() -> dict[str, dict[str, float]]:
    """Each link kind's default ``bandwidth_gb_s`` and ``latency_us`` (pipeline/catalog/links.toml,
    with its sources)."""
    data = read_toml(CATALOG_DIR / "links.toml", "link catalog")
    return {k: {"bandwidth_gb_s": float(v["bandwidth_gb_s"]), "latency_us": float(v["latency_us"])}
            for k, v in data["kinds"].items()}  # fmt: skip


def _link(raw: Any, where: str) -> LinkSpec:
    """A ``[pool.link]`` or ``[link]`` table (keys and types already checked), its figures in range."""
    kinds = link_kinds()
    kind = raw["kind"]
    if kind not in kinds:
        raise ConfigError(f"{where}: link kind {kind!r} unknown; choose one of {sorted(kinds)}")
    bw = float(raw.get("bandwidth_gb_s", kinds[kind]["bandwidth_gb_s"]))
    lat = float(raw.get("latency_us", kinds[kind]["latency_us"]))
    if not (np.isfinite(bw) and 0 < bw <= MAX_LINK_GB_S):
        raise ConfigError(f"{where}: bandwidth_gb_s must be a number of GB/s in (0, {MAX_LINK_GB_S:,.0f}], got {bw!r}")
    if not (np.isfinite(lat) and 0 <= lat <= MAX_LINK_LATENCY_US):
        raise ConfigError(f"{where}: latency_us must be a number of µs in [0, {MAX_LINK_LATENCY_US:,.0f}], got {lat!r}")
    return LinkSpec(kind, bw, lat, bool(raw.get("layerwise", False)))


def link_of_kind(kind: str, where: str) -> LinkSpec:
    """A link of catalog kind ``kind`` at its default bandwidth and latency (pipeline/catalog/links.toml),
    as a fleet's ``[link] kind = ...`` alone gives; an unknown kind is one line naming ``where``."""
    return _link({"kind": kind}, where)


def _roles(pools_raw: list[Any], origin: str) -> list[str]:
    """Each pool's role, checked before the pools are (the last pool that takes requests by rule
    is known before the loop reaches it)."""
    roles = []
    for i, raw in enumerate(pools_raw):
        role = raw.get("role", "unified") if isinstance(raw, Mapping) else "unified"
        name = raw.get("name") if isinstance(raw, Mapping) else None
        if role not in ROLES:
            raise ConfigError(f"{origin} [[pool]] {name or '#' + str(i + 1)!r}: role {role!r} unknown; "
                              f"choose one of {list(ROLES)}")  # fmt: skip
        roles.append(role)
    if all(r == "decode" for r in roles):
        raise ConfigError(f"{origin}: every pool is a decode pool; a prefill pool must take the requests")
    return roles


def _disaggregation(pools: list[Pool], fleet_link: LinkSpec | None, origin: str) -> list[Pool]:
    """The prefill pools with their decode pool and link resolved; every mistake one line."""
    prefill = [p.name for p in pools if p.role == "prefill"]
    decode = [p.name for p in pools if p.role == "decode"]
    if prefill and not decode:
        raise ConfigError(f'{origin}: prefill pool(s) {prefill} but no decode pool (a [[pool]] of role = "decode")')
    if decode and not prefill:
        raise ConfigError(f"{origin}: decode pool(s) {decode} but no prefill pool hands them requests")
    if fleet_link is not None and not prefill:
        raise ConfigError(f"{origin} [link]: a link joins prefill pools to decode pools; this fleet has none")
    roles = {p.name: p.role for p in pools}
    out, fed = [], set()
    for p in pools:
        if p.role != "prefill":
            out.append(p)
            continue
        where = f"{origin} [[pool]] {p.name!r}"
        to = p.handoff
        if to is None:
            if len(decode) > 1:
                raise ConfigError(f"{where}: the fleet has decode pools {decode}: say which in [pool.handoff] to")
            to = decode[0]
        if to not in roles:
            raise ConfigError(f"{where} [pool.handoff]: to {to!r} names no pool; the decode pools are {decode}")
        if roles[to] != "decode":
            raise ConfigError(
                f"{where} [pool.handoff]: to {to!r} is a {roles[to]} pool; a prefill pool hands to a decode pool "
                f"({decode})"
            )
        link = p.link if p.link is not None else fleet_link
        if link is None:
            raise ConfigError(
                f'{where}: a prefill pool needs a link to its decode pool: [pool.link] kind = "rdma" (or '
                "nvlink, infiniband, ethernet, pcie), or a fleet-level [link]"
            )
        fed.add(to)
        out.append(replace(p, handoff=to, link=link))
    idle = [d for d in decode if d not in fed]
    if idle:
        raise ConfigError(f"{origin}: decode pool(s) {idle} get no requests: no prefill pool hands to them")
    return out


#: Drafters that are models: their KV layers sit in the KV cache beside the target's, so a prefill
#: pool handing to a pool that drafts with one loads it too (vLLM refuses a NIXL hand-off whose two
#: sides disagree on a model-based drafter: vllm-project/vllm#49230, 2026-07-20); n-gram drafting
#: is a lookup on the decode side alone.
MODEL_DRAFTERS: tuple[str, ...] = ("draft_model", "eagle", "eagle3", "mtp")


def _drafters(pools: list[Pool]) -> list[Pool]:
    """Each prefill pool with its decode pool's ``[speculative]`` where that drafts with a model
    (:data:`MODEL_DRAFTERS`): the prefill pool loads the drafter and computes its KV for the
    prompt (its memory fit counts both); it samples one token a request, so it never verifies."""
    by_name = {p.name: p for p in pools}
    out = []
    for p in pools:
        sd = by_name[p.handoff].config.speculative if p.role == "prefill" and p.handoff is not None else None
        if sd is not None and sd.method in MODEL_DRAFTERS:
            p = replace(p, config=replace(p.config, speculative=sd))
        out.append(p)
    return out


def parse_pooled(data: Mapping[str, Any], origin: str, base_dir: Path | None = None) -> PooledFleet:
    """Validate a fleet file with ``[[pool]]`` tables; every error names ``origin``, the pool and
    the key. (A run records each pool's resolved fleet; pipeline.replay.runfolder.pools_of reads them.)"""
    from pipeline.common.tomlschema import (  # lazy: pydantic, loaded only when a file is read
        PooledFleetFile,
        PoolTable,
        check,
    )

    pools_raw = data.get("pool")
    if pools_raw == []:
        raise ConfigError(f"{origin}: pool = [] holds no pool; write [[pool]] tables, or leave pool out for one pool")
    if not isinstance(pools_raw, list) or not pools_raw:
        raise ConfigError(f"{origin}: pool must be an array of tables ([[pool]] ...), got {type(pools_raw).__name__}")
    if len(pools_raw) > MAX_POOLS:
        raise ConfigError(f"{origin}: {len(pools_raw):,} pools, more than the {MAX_POOLS} a fleet holds")
    top = {k: v for k, v in data.items() if k not in ("pool", "link")}
    check({k: v for k, v in data.items() if k != "pool"}, PooledFleetFile, origin)  # keys and types, one line
    fleet_link = _link(data["link"], f"{origin} [link]") if "link" in data else None
    roles = _roles(pools_raw, origin)
    last_entry = max(i for i, r in enumerate(roles) if r != "decode")
    pools: list[Pool] = []
    seen: set[str] = set()
    for i, raw in enumerate(pools_raw):
        where = f"{origin} [[pool]] #{i + 1}"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: must be a table, got {type(raw).__name__}")
        name = raw.get("name")
        if not isinstance(name, str) or not POOL_NAME_RE.fullmatch(name):
            raise ConfigError(
                f"{where}: name must be 1-32 letters, digits, '_' or '-' (it names the pool in the run's tables), "
                f"got {name!r}"
            )
        where = f"{origin} [[pool]] {name!r}"
        if name in seen:
            raise ConfigError(f"{where}: a second pool of that name (pool names must differ)")
        seen.add(name)
        shared = sorted(k for k in FLEET_ONLY_KEYS if k in raw)
        if shared:
            raise ConfigError(f"{where}: {shared} belong to the whole fleet (set them at the top of the file)")
        role = roles[i]
        check(dict(raw), PoolTable, where)
        last = i == last_entry
        own = sorted(k for k in ("handoff", "link") if k in raw)
        if own and role != "prefill":
            raise ConfigError(f"{where}: {own} belong to a prefill pool (this pool's role is {role})")
        if role == "decode":
            if "match" in raw:
                raise ConfigError(
                    f"{where}: a decode pool takes only the requests prefill pools hand it: leave out its match"
                )
            rule = PoolMatch()
        elif "match" in raw:
            if last:
                raise ConfigError(
                    f"{where}: the last pool takes every request the pools before it do not: leave out its match"
                )
            rule = _match(raw["match"], where)
        elif not last:
            raise ConfigError(f"{where}: needs a [pool.match] rule (only the last pool takes the rest)")
        else:
            rule = PoolMatch()
        handoff = raw["handoff"]["to"] if "handoff" in raw else None
        link = _link(raw["link"], f"{where} [pool.link]") if "link" in raw else None
        if role == "prefill" and "speculative" in raw:
            raise ConfigError(
                f"{where} [pool.speculative]: a prefill pool samples one token a request and verifies no drafts; set "
                "speculation on the decode pool it hands to (the prefill pool then loads that pool's drafter)"
            )
        merged = {**top, **{k: v for k, v in raw.items() if k not in POOL_KEYS}, "name": f"{top['name']}-{name}"}
        if role == "prefill":
            merged.pop("speculative", None)  # the fleet's [speculative] is for the pools that decode
        if isinstance(top.get("engine"), Mapping) and isinstance(raw.get("engine"), Mapping):
            merged["engine"] = {**top["engine"], **raw["engine"]}  # a pool's engine keys on the fleet's
        cfg = parse_fleet(merged, where, base_dir)
        pools.append(Pool(name, role, rule, cfg, handoff, link))
    pools = _drafters(_disaggregation(pools, fleet_link, origin))
    engines = sum(p.config.replicas * p.config.dp for p in pools)
    if engines > MAX_ENGINES:
        raise ConfigError(
            f"{origin}: the pools hold {engines:,} engines (replicas × dp) in all, more than the {MAX_ENGINES:,} a "
            "replay numbers (4-byte replica ids, numbered pool after pool)"
        )
    first = pools[0].config
    return PooledFleet(
        str(top["name"]), first.model, tuple(pools), first.slo, str(top.get("description", "")), dict(top)
    )


def load_fleet_file(path: Path | str, *, check_profile: bool = True) -> FleetConfig | PooledFleet:
    """Read a FLEET.toml: one pool (FleetConfig, as pipeline.replay.fleet.load_fleet reads it) or a
    fleet of pools, each checked as load_fleet checks a fleet."""
    data = read_toml(path, "fleet file")
    if not is_pooled(data):
        cfg = parse_fleet(data, str(path), Path(path).parent)
        check_loaded_fleet(cfg, str(path), check_profile)
        return cfg
    pooled = parse_pooled(data, str(path), Path(path).parent)
    for pool in pooled.pools:
        check_loaded_fleet(pool.config, f"{path} [[pool]] {pool.name!r}", check_profile)
    return pooled


def pooled_refusal(path: Path | str, command: str) -> ConfigError:
    """The error of a command that takes one homogeneous pool given a fleet of pools."""
    return ConfigError(
        f"{path}: a fleet of [[pool]] tables; `rooftrace {command}` takes a fleet of one pool (replay one "
        "pooled fleet with `rooftrace replay`, or give this command one pool's fleet file)"
    )


def offsets(ranks: Sequence[int]) -> npt.NDArray[np.int64]:
    """The first global replica number of each pool: pools number their replicas one after
    another (pool 0's first, then pool 1's, ...), so a replica number names one engine of the run."""
    return np.concatenate([[0], np.cumsum(np.asarray(ranks, np.int64))[:-1]]).astype(np.int64)


# -- the seam between pools ---------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """The path a request's KV blocks take from a prefill pool to a decode pool: bytes per second
    per transfer and a fixed latency per transfer (each transfer is taken to have the link to
    itself: no queueing on it, no contention between transfers). ``layerwise``: the transfer
    overlaps the prefill layer by layer (NIXL-style): :meth:`exposed`."""

    bytes_per_s: float
    latency_s: float = 0.0
    layerwise: bool = False

    def __post_init__(self) -> None:
        if not (np.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise ConfigError(f"a link's bandwidth must be a finite number of bytes/s > 0, got {self.bytes_per_s!r}")
        if not (np.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"a link's latency must be a finite number of seconds >= 0, got {self.latency_s!r}")

    def seconds(self, nbytes: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The whole transfer: latency + bytes / bandwidth."""
        return self.latency_s + nbytes / self.bytes_per_s

    def exposed(
        self, nbytes: npt.NDArray[np.float64], prefill_s: npt.NDArray[np.float64], layers: int
    ) -> npt.NDArray[np.float64]:
        """Seconds between the prefill's first token and the KV's arrival. Without overlap, the whole
        transfer, ``latency + T`` (T = bytes / bandwidth). Layer-wise over ``layers`` layers, each
        layer's KV leaves as the prefill finishes it: the first leaves ``P / L`` into the prefill
        (P = the request's prefill span, scheduled to first token) and the link then needs T, and
        the last leaves at the end and needs T / L, so the exposed part is
        ``latency + max(T / L, T − P · (L − 1) / L)``."""
        t = nbytes / self.bytes_per_s
        if not self.layerwise or layers <= 1:
            return self.latency_s + t
        return self.latency_s + np.maximum(t / layers, t - prefill_s * (layers - 1) / layers)


@dataclass(frozen=True)
class Handoff:
    """Requests moving from a prefill pool to a decode pool with their KV blocks: which rows of the
    source workload move (``rows``), and the destination pool's workload of them (``work``)."""

    rows: npt.NDArray[np.int64]
    work: Workload
    #: Seconds each waited on the link after its first token (:meth:`Link.exposed`).
    transfer_s: npt.NDArray[np.float64]
    #: Bytes each moved.
    kv_bytes: npt.NDArray[np.float64]


def kv_transfer_bytes(
    prompt: npt.NDArray[np.int64], kv_bytes_per_token: float, window_bytes_per_token: float = 0.0, window: int = 0
) -> npt.NDArray[np.float64]:
    """KV bytes a prompt's transfer moves to one GPU of the decode pool: ``kv_bytes_per_token`` for
    every prompt token (the full-attention layers) and ``window_bytes_per_token`` for the last
    ``window`` of them (sliding-window layers keep no more)."""
    p = prompt.astype(np.float64)
    out = p * float(kv_bytes_per_token)
    if window > 0 and window_bytes_per_token > 0:
        out += np.minimum(p, float(window)) * float(window_bytes_per_token)
    return out


def hand_off(
    source: Workload,
    result: EngineResult,
    kv_bytes_per_token: float,
    link: Link,
    *,
    output_tokens: npt.NDArray[np.int64] | None = None,
    window_bytes_per_token: float = 0.0,
    window: int = 0,
    layers: int = 1,
) -> Handoff:
    """The seam a request's life crosses pools by (a prefill pool handing its requests to a decode
    pool): every request ``result`` served (not rejected, first token out) leaves the source pool
    at its first token and arrives at the decode pool once its prompt's KV
    (:func:`kv_transfer_bytes`, as the destination stores it) has crossed ``link``
    (:meth:`Link.exposed`; ``layers``: the model's, for a layer-wise link). There its prompt
    counts as computed at admission (``reported_hit_tokens``: blocks of its own, against the
    pool's capacity, as a reported cache hit is), and the engine computes the last prompt token
    for its logits, which samples the first token the client sees, then decodes the rest: the
    destination produces all of ``output_tokens`` (default the source's), as vLLM's decode
    instance does behind a ``--kv-transfer-config`` proxy that sent the prefill instance the
    request with ``max_tokens = 1``. The destination workload is in arrival order; ``rows`` maps
    it back to the source's rows."""
    outputs = source.output_tokens if output_tokens is None else np.asarray(output_tokens, np.int64)
    done = (result.reject_reason == 0) & np.isfinite(result.first_token_s)
    rows = np.flatnonzero(done).astype(np.int64)
    prompt = source.prompt_tokens[rows]
    nbytes = kv_transfer_bytes(prompt, kv_bytes_per_token, window_bytes_per_token, window)
    prefill_s = result.first_token_s[rows] - result.scheduled_s[rows]
    transfer = link.exposed(nbytes, prefill_s, layers)
    arrive = result.first_token_s[rows] + transfer
    order = np.argsort(arrive, kind="stable")
    rows, prompt, transfer, arrive, nbytes = rows[order], prompt[order], transfer[order], arrive[order], nbytes[order]
    work = Workload(
        arrival_s=arrive,
        prompt_tokens=prompt,
        output_tokens=outputs[rows].astype(np.int64),
        reported_hit_tokens=prompt.copy(),
    )
    return Handoff(rows, work, transfer, nbytes)


def take_result(res: EngineResult, idx: npt.NDArray[np.int64]) -> EngineResult:
    """The results of requests ``idx`` (positions in ``res``), in that order."""
    return EngineResult(**{f.name: getattr(res, f.name)[idx] for f in fields(EngineResult)})


def merge_handoffs(moved: Sequence[Handoff]) -> tuple[Workload, list[npt.NDArray[np.int64]]]:
    """One decode pool's workload from the hand-offs of the prefill pools that feed it, in arrival
    order (ties: the pools' order in the file, then each hand-off's own order), and where each
    hand-off's requests landed in it."""
    sizes = [m.work.n for m in moved]
    arrive = np.concatenate([m.work.arrival_s for m in moved]) if moved else np.zeros(0)
    order = np.argsort(arrive, kind="stable")
    where = np.empty(order.shape[0], np.int64)
    where[order] = np.arange(order.shape[0], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    positions = [where[bounds[i] : bounds[i + 1]] for i in range(len(moved))]

    def cat(name: str) -> npt.NDArray[Any]:
        return np.concatenate([getattr(m.work, name) for m in moved])[order] if moved else np.zeros(0, np.int64)

    work = Workload(
        arrival_s=arrive[order].astype(np.float64),
        prompt_tokens=cat("prompt_tokens").astype(np.int64),
        output_tokens=cat("output_tokens").astype(np.int64),
        reported_hit_tokens=cat("reported_hit_tokens").astype(np.int64),
    )
    return work, positions


#: The TTFT split of a disaggregated request (columns of the run's requests table, seconds):
#: queue_s (the prefill pool's queue) + these = ttft_s.
SPLIT_COLUMNS: tuple[str, ...] = ("prefill_s", "transfer_s", "decode_queue_s", "first_decode_step_s")


@dataclass(frozen=True)
class Disaggregated:
    """A prefill pool's requests joined with their decode pool's results, in the prefill pool's
    row order: ``result`` is each request's life as one engine result (arrival, replica, queue
    and cache hits from the prefill pool; first token, last token and inter-token gaps from the
    decode pool; preemptions and prefilled tokens summed; the rejection of whichever pool refused
    it), ``decode_replica`` the decode pool's replica (−1: never reached it), ``split`` the TTFT
    split (:data:`SPLIT_COLUMNS`, NaN where the request never reached the decode pool or was
    rejected there) and ``kv_bytes`` the bytes it moved (NaN: none)."""

    result: EngineResult
    decode_replica: npt.NDArray[np.int32]
    split: dict[str, npt.NDArray[np.float64]]
    kv_bytes: npt.NDArray[np.float64]
    #: Where each request was rejected: 0 served, 1 the prefill pool, 2 the decode pool.
    rejected_at: npt.NDArray[np.int8]


def join_disaggregated(prefill: EngineResult, moved: Handoff, decode: EngineResult) -> Disaggregated:
    """One row per request of the prefill pool (``prefill``: its results with one output token),
    the ``moved`` ones completed by ``decode`` (the decode pool's results of ``moved.work``, in its
    order). TTFT = the decode pool's first token − arrival = queue_s + prefill_s + transfer_s +
    decode_queue_s + first_decode_step_s, term by term."""
    n = prefill.reject_reason.shape[0]
    rows = moved.rows
    out = EngineResult.empty(n)
    out.arrival_s[:] = prefill.arrival_s
    out.replica[:] = prefill.replica
    out.scheduled_s[:] = prefill.scheduled_s
    out.preemptions[:] = prefill.preemptions
    out.cache_hit_tokens[:] = prefill.cache_hit_tokens
    out.prefill_tokens[:] = prefill.prefill_tokens
    out.reject_reason[:] = prefill.reject_reason
    out.first_token_s[rows] = decode.first_token_s
    out.finish_s[rows] = decode.finish_s
    out.max_itl_s[rows] = decode.max_itl_s
    out.preemptions[rows] += decode.preemptions
    out.prefill_tokens[rows] += decode.prefill_tokens
    rejected_at = np.where(prefill.reject_reason != 0, 1, 0).astype(np.int8)
    refused = decode.reject_reason != 0
    out.reject_reason[rows[refused]] = decode.reject_reason[refused]
    rejected_at[rows[refused]] = 2
    nan = np.full(n, np.nan)
    served = ~refused
    split = {name: nan.copy() for name in SPLIT_COLUMNS}
    ok_rows = rows[served]
    split["prefill_s"][ok_rows] = prefill.first_token_s[ok_rows] - prefill.scheduled_s[ok_rows]
    split["transfer_s"][ok_rows] = moved.transfer_s[served]
    split["decode_queue_s"][ok_rows] = decode.scheduled_s[served] - decode.arrival_s[served]
    split["first_decode_step_s"][ok_rows] = decode.first_token_s[served] - decode.scheduled_s[served]
    replica = np.full(n, -1, np.int32)
    replica[ok_rows] = decode.replica[served]
    kv = nan.copy()
    kv[rows] = moved.kv_bytes
    return Disaggregated(out, replica, split, kv, rejected_at)
