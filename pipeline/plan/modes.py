"""Serving modes of ``plan --modes``: the options' checks, and the frontier the plan reports — per
mode, the cheapest configuration that meets the SLOs and, in words, why the others lost.

The modes (:data:`pipeline.plan.search.MODES`): ``colocated`` (one pool prefilling and decoding,
the plan as it always was), ``disaggregated`` (a prefill pool handing every request to a decode
pool of the same GPU and TP over a link, at each prefill:decode replica ratio given) and
``speculative`` (one pool with speculative decoding, its acceptance the catalog's published figure)
``offload`` (one pool with a lower KV tier, FLEET.toml ``[kv_offload]``, at each size given) and
``disaggregated-speculative`` (disaggregated, the decode pool speculating as ``speculative`` does).
Every configuration of every mode is searched and priced the same way (pipeline.plan.search)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pipeline.classify.offload import MAX_OFFLOAD_GB, OFFLOAD_KINDS, tier_from_summary
from pipeline.common.errors import ConfigError
from pipeline.engine.model import MAX_SPECULATIVE_TOKENS
from pipeline.plan.search import DISAGGREGATED_MODES, MODES, CandidateResult, Evaluation
from pipeline.replay.fleet import SPEC_METHODS
from pipeline.replay.pools import link_kinds

#: The largest side of a --pd-ratios ratio: a ratio past 16:1 is a fleet one pool of which is
#: a rounding error at any size plan searches.
MAX_RATIO_SIDE = 16
#: At equal $/day the simpler mode ranks first (fewer moving parts to run): colocated, then
#: speculative (one flag), then offload (a KV connector and host memory to give it), then
#: disaggregated (two pools, a proxy and a KV link), then disaggregated with a speculating decode pool.
MODE_ORDER: dict[str, int] = {
    "colocated": 0, "speculative": 1, "offload": 2, "disaggregated": 3, "disaggregated-speculative": 4,
}  # fmt: skip
#: A pool whose busy share is this much below the other pool's "idles" (the reason in words): the
#: busier pool sets the fleet's size, and the other's replicas wait for it.
IDLE_GAP = 0.25


#: Each mode option (its command-line flag) and the modes that read it.
MODE_OPTION_USERS: dict[str, tuple[str, ...]] = {
    "--pd-ratios": ("disaggregated", "disaggregated-speculative"),
    "--link": ("disaggregated", "disaggregated-speculative"),
    "--speculative": ("speculative", "disaggregated-speculative"),
    "--offload-gb": ("offload",),
    "--offload-kind": ("offload",),
    "--offload-store-gb": ("offload",),
}


def unused_mode_options(given: Sequence[str], modes: Sequence[str]) -> list[str]:
    """A line for each mode option in ``given`` (flags set on the command line) that none of
    ``modes`` reads: it changed nothing, and the user should hear so."""
    return [
        f"{flag} not used: --modes has no {' or '.join(MODE_OPTION_USERS[flag])}"
        for flag in given
        if flag in MODE_OPTION_USERS and not set(MODE_OPTION_USERS[flag]) & set(modes)
    ]


def check_modes(modes: Sequence[str]) -> tuple[str, ...]:
    """The modes, each once, in the order given; an unknown or missing one is one line."""
    out = tuple(dict.fromkeys(modes))
    if not out:
        raise ConfigError(f"--modes: give at least one of {', '.join(MODES)}")
    for m in out:
        if m not in MODES:
            raise ConfigError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    return out


def parse_ratios(text: str) -> tuple[tuple[int, int], ...]:
    """``1:3,1:1,2:1`` as ((1, 3), (1, 1), (2, 1)): each side a whole number in 1..MAX_RATIO_SIDE;
    a ratio given twice (or a multiple of another, 2:2 = 1:1) is tried once."""
    out: dict[tuple[int, int], None] = {}
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise ConfigError(f"--pd-ratios: expected prefill:decode ratios such as 1:2,1:1, got {text!r}")
    for item in items:
        left, sep, right = item.partition(":")
        try:
            p, d = int(left), int(right)
        except ValueError:
            p = d = -1
        if not sep or not (1 <= p <= MAX_RATIO_SIDE and 1 <= d <= MAX_RATIO_SIDE):
            raise ConfigError(
                f"--pd-ratios {item!r}: expected PREFILL:DECODE replicas, each a whole number in 1..{MAX_RATIO_SIDE}"
            )
        g = _gcd(p, d)
        out[(p // g, d // g)] = None
    return tuple(out)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def check_link(kind: str) -> str:
    kinds = link_kinds()
    if kind not in kinds:
        raise ConfigError(f"--link: unknown link kind {kind!r}; choose one of {', '.join(sorted(kinds))}")
    return kind


def parse_speculative(text: str) -> tuple[str, int]:
    """``eagle3:3`` as ("eagle3", 3): a method whose acceptance the catalog can give and k in
    1..16 (draft_model needs a draft model: give it in a base fleet's [speculative] instead)."""
    method, sep, k_text = text.strip().partition(":")
    methods = [m for m in SPEC_METHODS if m != "draft_model"]
    if method not in methods:
        extra = " (draft_model needs its draft: set [speculative] in the base fleet)" if method == "draft_model" else ""
        raise ConfigError(f"--speculative {text!r}: method must be one of {', '.join(methods)}{extra}")
    try:
        k = int(k_text) if sep else -1
    except ValueError:
        k = -1
    if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(
            f"--speculative {text!r}: expected METHOD:K, K the draft tokens (num_speculative_tokens) "
            f"in 1..{MAX_SPECULATIVE_TOKENS}"
        )
    return method, k


def parse_offload_gb(text: str, flag: str = "--offload-gb") -> tuple[float, ...]:
    """``256,512`` as (256.0, 512.0): each a finite number of GB in (0, MAX_OFFLOAD_GB], each
    tried once (a 0 GB tier is colocated). ``flag``: the option named in an error
    (``--offload-store-gb``: the stores below a cpu tier; empty there means none)."""
    if flag == "--offload-store-gb" and not text.strip():
        return ()
    items = [p.strip() for p in text.split(",") if p.strip()]
    out = []
    for item in items:
        try:
            gb = float(item)
        except ValueError:
            gb = math.nan
        out.append((item, gb))
    if not out:
        raise ConfigError(f"{flag}: expected GB of the offload tier such as 256 or 256,512, got {text!r}")
    for item, gb in out:
        _check_gb(gb, repr(item), flag)
    return tuple(dict.fromkeys(gb + 0.0 for _, gb in out))


def _check_gb(gb: float, shown: str, flag: str = "--offload-gb") -> None:
    if isinstance(gb, bool) or not isinstance(gb, int | float) or not (math.isfinite(gb) and 0 < gb <= MAX_OFFLOAD_GB):
        what = (
            "the store below the cpu tier, for the pool"
            if flag == "--offload-store-gb"
            else "the tier (per replica for cpu, for the pool for shared)"
        )
        raise ConfigError(f"{flag} {shown}: expected GB of {what}, a number in (0, {MAX_OFFLOAD_GB:g}]")


def check_offload_gb(sizes: Sequence[float]) -> tuple[float, ...]:
    """The library's check of :func:`parse_offload_gb`'s result (PlanOptions.offload_gb)."""
    if not sizes:
        raise ConfigError("--offload-gb: give at least one size in GB")
    for gb in sizes:
        _check_gb(gb, repr(gb))
    return tuple(dict.fromkeys(float(gb) + 0.0 for gb in sizes))


def check_offload_store_gb(sizes: Sequence[float], kind: str) -> tuple[float, ...]:
    """The library's check of the stores below a cpu tier (PlanOptions.offload_store_gb): each
    as :func:`check_offload_gb`'s, and only below a ``cpu`` tier (a ``shared`` tier is the store)."""
    for gb in sizes:
        _check_gb(gb, repr(gb), "--offload-store-gb")
    if sizes and kind != "cpu":
        raise ConfigError(
            f"--offload-store-gb: a store goes below a cpu tier (--offload-kind cpu); --offload-kind {kind} is "
            "the store itself"
        )
    return tuple(dict.fromkeys(float(gb) + 0.0 for gb in sizes))


def check_offload_kind(kind: str) -> str:
    if kind not in OFFLOAD_KINDS:
        raise ConfigError(f"--offload-kind: unknown kind {kind!r}; choose one of {', '.join(OFFLOAD_KINDS)}")
    return kind


def tier_text(r: CandidateResult) -> str | None:
    """An offload configuration's tier in words (kind, GB, GB/s, µs: its replay's, else what was
    asked), None for the other modes."""
    c = r.candidate
    if c.mode != "offload" or c.offload is None:
        return None
    ev = r.chosen
    got = ev.offload if ev is not None else {}
    if got:
        return tier_from_summary(got).text()
    where = "per replica" if c.offload[0] == "cpu" else "shared by the pool"
    below = f", then shared {c.offload_store:g} GB shared by the pool" if c.offload_store is not None else ""
    return f"{c.offload[0]} {c.offload[1]:g} GB {where}{below}"


def usd_per_day(r: CandidateResult) -> float:
    return (r.replicas or 0) * r.gpus_per_replica * r.usd_per_gpu_hour * 24.0 + 0.0


def rank_key(r: CandidateResult) -> tuple[float, int, float, str]:
    """How configurations rank: $/day, then the simpler mode (:data:`MODE_ORDER`), then p99
    TTFT, then the label (a colocated-only plan ranks as it always did)."""
    ev = r.chosen
    return (usd_per_day(r), MODE_ORDER[r.candidate.mode], ev.p99["ttft"] if ev else 0.0, r.candidate.label)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s")


def _gpus(r: CandidateResult) -> int:
    return (r.replicas or 0) * r.gpus_per_replica


def _n_gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _tokens(x: float) -> str:
    return f"{x / 1e6:,.1f} M" if x >= 1e5 else f"{x:,.0f}"


def _offload_diagnosis(r: CandidateResult, won: bool, colocated: CandidateResult | None) -> str:
    """Why an offload configuration won or lost, from its replay's pre-pass: the prompt tokens it
    loaded from the tier instead of prefilling, against the colocated configuration's fresh prefill
    (the same GPU tier without the lower one), and what that did to the replicas."""
    ev = r.chosen
    assert ev is not None
    got = ev.offload
    loaded = float(got.get("offload_hit_tokens") or 0)
    fresh = float(got.get("fresh_tokens") or 0.0)
    col = colocated.chosen if colocated is not None else None
    if loaded <= 0:
        return "no reuse beyond the GPU cache: the tier loaded nothing, so it saved nothing"
    prompts = float(got.get("prompt_tokens") or 0.0)
    against = ""
    if col is not None and prompts > 0:
        before = (1.0 - col.cache_hit_fraction) * prompts
        against = f" (fresh prefill {_tokens(fresh)} tokens against colocated's {_tokens(before)})"
    by_tier = got.get("by_tier")
    if isinstance(by_tier, dict):  # three levels: each lower tier's share
        cpu, store = by_tier["cpu"], by_tier["shared"]
        source = (
            f"host memory ({_tokens(float(cpu['hit_tokens']))}) and the pool's store "
            f"({_tokens(float(store['hit_tokens']))})"
        )
    else:
        source = "host memory" if got.get("kind") == "cpu" else "the shared store"
    turned = (
        f"the tier turned {_tokens(loaded)} fresh prefill tokens into loads from {source} for "
        f"{int(got.get('requests_loading') or 0):,} requests{against}"
    )
    if won:
        if colocated is None or colocated.replicas is None:
            return f"{turned}: colocated meets no SLO without it"
        fewer = colocated.replicas - (r.replicas or 0)
        if fewer > 0:
            return f"{turned}: {fewer} replica{'s' if fewer != 1 else ''} fewer"
        return turned
    one = r.one_fewer
    at = (
        f": at {one.replicas} replica{'s' if one.replicas != 1 else ''} {one.failing} misses with the tier too"
        if one is not None and one.failing
        else ""
    )
    return f"{turned}, but that saves no replica{at}"


def _pools_diagnosis(ev: Evaluation, won: bool) -> str:
    """A disaggregated configuration's pools in words: which one idles, and the KV transfer."""
    pb, db = ev.pools.get("prefill_busy", 0.0), ev.pools.get("decode_busy", 0.0)
    transfer = (ev.ttft_split.get("transfer_s") or {}).get("p99")
    link = f"; the KV transfer's p99 is {_ms(transfer)}" if transfer is not None else ""
    if db - pb >= IDLE_GAP:
        return f"decode-bound: a prefill pool idles (busy {_pct(pb)} against the decode pool's {_pct(db)}){link}"
    if pb - db >= IDLE_GAP:
        return f"prefill-bound: a decode pool idles (busy {_pct(db)} against the prefill pool's {_pct(pb)}){link}"
    busy = f"both pools busy (prefill {_pct(pb)}, decode {_pct(db)}){link}"
    return f"decodes never wait behind prefill chunks, {busy}" if won else busy


def _diagnosis(r: CandidateResult, won: bool, colocated: CandidateResult | None = None) -> str:
    """What the mode's cheapest passing configuration says of itself, in words (``won``: it is
    the plan's winner; ``colocated``: the colocated mode's best, which an offload or a losing
    speculative one is judged against)."""
    ev = r.chosen
    assert ev is not None
    mode = r.candidate.mode
    if mode == "offload":
        return _offload_diagnosis(r, won, colocated)
    if mode == "disaggregated-speculative":
        assert r.candidate.speculative is not None
        method, k = r.candidate.speculative
        spec = f"; the decode pool speculates ({method} k = {k}): TPOT p99 {_ms(ev.p99['tpot'])}"
        return _pools_diagnosis(ev, won) + spec
    if mode == "disaggregated":
        return _pools_diagnosis(ev, won)
    if mode == "speculative":
        if won:
            return f"a verification advances more than one token a step: TPOT p99 {_ms(ev.p99['tpot'])}"
        saved = (colocated.replicas or 0) - (r.replicas or 0) if colocated is not None else 0
        if saved > 0:  # it beat colocated (another mode won): the drafts did save replicas
            return (
                f"the drafts save {saved} replica{'s' if saved != 1 else ''} against colocated: "
                f"TPOT p99 {_ms(ev.p99['tpot'])}"
            )
        fewer = r.one_fewer
        at = (
            f": at {fewer.replicas} replica{'s' if fewer.replicas != 1 else ''} {fewer.failing} misses with "
            "speculation too"
            if fewer is not None and fewer.failing
            else ""
        )
        return (
            f"the drafts save no replica{at} (steps {r.sizing.get('step_binding', '-')}-bound, "
            f"busy {_pct(ev.utilization)}: verifying k+1 tokens a sequence is work the batch already fills)"
        )
    fewer = r.one_fewer
    if fewer is not None and fewer.failing_target:
        return f"at {fewer.replicas} replica{'s' if fewer.replicas != 1 else ''} {fewer.failing_target} misses"
    return f"binds on {r.sizing.get('binding', '-')}"


def frontier(results: Sequence[CandidateResult], modes: Sequence[str]) -> list[dict[str, Any]]:
    """Per mode, the cheapest configuration meeting the SLOs (:func:`rank_key`), its $/day, GPUs,
    pools and SLO figures (the TTFT p99 split for disaggregated), and in words why it won or lost
    against the winner; a mode with no passing configuration says why (its first reason)."""
    best: dict[str, CandidateResult] = {}
    for ok in sorted((x for x in results if x.replicas is not None), key=rank_key):
        best.setdefault(ok.candidate.mode, ok)
    winner = min(best.values(), key=rank_key) if best else None
    out = []
    for mode in modes:
        r = best.get(mode)
        if r is None:
            tried = [x for x in results if x.candidate.mode == mode]
            why = next((x.note for x in tried if x.note), "")
            out.append({"mode": mode, "meets_slo": False, "verdict": "no configuration meets the SLO", "why": why})
            continue
        ev = r.chosen
        assert ev is not None and winner is not None
        row: dict[str, Any] = {
            "mode": mode,
            "meets_slo": True,
            "config": r.candidate.label,
            "replicas": r.replicas,
            "gpus": _gpus(r),
            "usd_per_day": usd_per_day(r),
            "ttft_p99_s": ev.p99["ttft"],
            "tpot_p99_s": ev.p99["tpot"],
            "slo": ev.achieved,
        }
        if mode in DISAGGREGATED_MODES:
            row["prefill_replicas"] = ev.pools.get("prefill_replicas")
            row["decode_replicas"] = ev.pools.get("decode_replicas")
            row["link"] = ev.pools.get("link")
            row["ttft_split_p99_s"] = {k: v.get("p99") for k, v in ev.ttft_split.items()}
        if mode == "offload":
            row["offload"] = tier_text(r)
            row["offload_hit_tokens"] = int(ev.offload.get("offload_hit_tokens") or 0)
            row["offload_requests_loading"] = int(ev.offload.get("requests_loading") or 0)
            row["fresh_prefill_tokens"] = float(ev.offload.get("fresh_tokens") or 0.0)
        diag = _diagnosis(r, r is winner, best.get("colocated"))
        if r is winner:
            others = [b for m, b in best.items() if m != mode]
            if others:
                nxt = min(others, key=rank_key)
                saved = usd_per_day(nxt) - usd_per_day(r)
                vs = (
                    f"${saved:,.0f}/day and {_n_gpus(_gpus(nxt) - _gpus(r))} less than {nxt.candidate.mode}"
                    if saved > 0
                    else f"ties {nxt.candidate.mode} on $/day and is the simpler to run"
                )
                gone = [m for m in modes if m not in best]
                no = f"; {', '.join(gone)}: no configuration meets the SLO" if gone else ""
                row["verdict"], row["why"] = "wins", f"{vs}{no}; {diag}"
            else:
                row["verdict"], row["why"] = "wins", f"the only mode meeting the SLO; {diag}"
        else:
            extra = usd_per_day(r) - usd_per_day(winner)
            cost = (
                f"${extra:,.0f}/day more than {winner.candidate.mode} ({_n_gpus(_gpus(r))} against {_gpus(winner)})"
                if extra > 0
                else f"ties {winner.candidate.mode} on $/day ({_n_gpus(_gpus(r))}), which is the simpler to run"
            )
            row["verdict"], row["why"] = "loses", f"{cost}; {diag}"
        out.append(row)
    return out


def frontier_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The frontier for people: one line per mode, and the TTFT split of a disaggregated one."""
    lines = ["serving modes (cheapest passing configuration per mode):"]
    for f in rows:
        if not f["meets_slo"]:
            lines.append(f"  {f['mode']:<14} {f['verdict']}: {f['why']}")
            continue
        pools = ""
        if f["mode"] in DISAGGREGATED_MODES:
            pools = f" = {f['prefill_replicas']}P + {f['decode_replicas']}D over {f['link']}"
        if f["mode"] == "offload":  # (the host DRAM comes with the GPU instance: priced in its GPU-hour)
            priced = "host DRAM in the GPU-hour's price" if f["offload"].startswith("cpu") else "the store not priced"
            if f["offload"].startswith("cpu") and ", then shared" in f["offload"]:
                priced += "; the store not priced"
            pools = f" + {f['offload']} ({priced})"
        lines.append(
            f"  {f['mode']:<14} {f['replicas']}x {f['config']}{pools}: {_n_gpus(f['gpus'])}, "
            f"${f['usd_per_day']:,.0f}/day, TTFT p99 {_ms(f['ttft_p99_s'])}, TPOT p99 {_ms(f['tpot_p99_s'])} "
            f"-> {f['verdict']}: {f['why']}"
        )
        split = f.get("ttft_split_p99_s")
        if split:
            names = {"queue_s": "queue", "prefill_s": "prefill", "transfer_s": "transfer",
                     "decode_queue_s": "decode queue", "first_decode_step_s": "first decode step"}  # fmt: skip
            parts = ", ".join(f"{names.get(k, k)} {_ms(v)}" for k, v in split.items())
            lines.append(f"  {'':<14} TTFT p99 by part: {parts}")
    return lines
