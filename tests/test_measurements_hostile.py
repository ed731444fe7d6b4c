"""Hostile measurement folders for ``rooftrace calibrate --measurements`` and ``validate``
(pipeline/costmodel/profile/sources.py, build.py, heldout.py; pipeline/calibrate/validate.py for Splitwise tables).

Every case builds a tiny AIConfigurator / LLMServingSim / Splitwise set in ``tmp_path`` and checks
the project's promise (docs/limits.md, "Measurement folders"): no traceback, one ``error:`` line
and a non-zero exit where the user must act, bad rows left out with their count and reason said,
repeats that disagree said, ``--json`` valid JSON without NaN, and a profile whose row counts are
the rows of its Parquet files. Profiles are written under ``tmp_path`` only, never the catalog.
"""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner, Result

from pipeline.cli import main

Mutation = Callable[[pl.DataFrame], pl.DataFrame]

_MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
_NK = [512, 1024, 2048, 4096, 8192]
_GEMM_ROWS = len(_MS) * len(_NK) ** 2  # 300
_AR_ROWS = 3 * 17 * 2  # 102
_ATTN_ROWS = 6 * 5  # 30
_MOE_ROWS = 9


def _aic(
    root: Path,
    gemm: Mutation | None = None,
    ar: Mutation | None = None,
    attn: Mutation | None = None,
    moe: Mutation | None = None,
    *,
    with_gemm: bool = True,
    with_attn: bool = False,
    with_moe: bool = False,
    version: str = "0.24.0",
) -> Path:
    """A small AIConfigurator set for h100_sxm (power-law GEMMs, affine all-reduce, optional
    attention and MoE), each table passed through its mutation before it is written."""
    gpu = root / "aiconfigurator-vllm-ops" / "h100_sxm"
    if with_gemm:
        rows = [
            ("bfloat16", "torch", m, n, k, 1e-6 * m**0.7 * n**0.5 * k**0.3)
            for m, n, k in itertools.product(_MS, _NK, _NK)
        ]
        f = pl.DataFrame(rows, schema=["gemm_dtype", "kernel_source", "m", "n", "k", "latency"], orient="row")
        (gpu / "gemm" / "vllm" / version).mkdir(parents=True, exist_ok=True)
        (gemm or (lambda x: x))(f).write_parquet(gpu / "gemm" / "vllm" / version / "gemm_perf.parquet")
    a = []
    for gpus in (2, 4, 8):
        for b in [2**i for i in range(8, 25)]:
            base = 0.008 + b * 2e-9 / gpus
            a += [("vllm_graph", gpus, b, base), ("vllm_eager", gpus, b, base + 0.005)]
    af = pl.DataFrame(a, schema=["backend", "num_gpus", "message_size", "latency"], orient="row")
    af = af.with_columns(allreduce_dtype=pl.lit("bfloat16"))  # as the collector writes it
    (gpu / "comm" / "vllm" / version).mkdir(parents=True, exist_ok=True)
    (ar or (lambda x: x))(af).write_parquet(gpu / "comm" / "vllm" / version / "custom_allreduce_perf.parquet")
    if with_attn:
        r = [
            (b, isl, 0, 32, 8, 128, "bfloat16", "flash", 1e-3 * b * isl**0.5)
            for b in (1, 2, 4, 8, 16, 32)
            for isl in (128, 256, 1024, 4096, 16384)
        ]
        cols = ["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype",
                "kernel_source", "latency"]  # fmt: skip
        t = (attn or (lambda x: x))(pl.DataFrame(r, schema=cols, orient="row"))
        (gpu / "attention" / "vllm" / version).mkdir(parents=True, exist_ok=True)
        t.write_parquet(gpu / "attention" / "vllm" / version / "generation_attention_perf.parquet")
        t.write_parquet(gpu / "attention" / "vllm" / version / "context_attention_perf.parquet")
    if with_moe:
        r = [
            ("bfloat16", "triton", t, 2048, 768, 8, 128, 1, 1, "uniform", 0.01 * t**0.5)
            for t in (1, 2, 4, 8, 16, 64, 256, 1024, 4096)
        ]
        cols = ["moe_dtype", "kernel_source", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                "moe_tp_size", "moe_ep_size", "distribution", "latency"]  # fmt: skip
        (gpu / "moe" / "vllm" / version).mkdir(parents=True, exist_ok=True)
        (moe or (lambda x: x))(pl.DataFrame(r, schema=cols, orient="row")).write_parquet(
            gpu / "moe" / "vllm" / version / "moe_perf.parquet"
        )
    return root


_DENSE_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "input_layernorm")
_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _llmss(root: Path, tp: str = "tp1", cell: Callable[[str, int, float], object] | None = None, *,
           header: bool = True, attn_rows: list[str] | None = None, kv_prefill: int = 0) -> Path:  # fmt: skip
    """One LLMServingSim bundle (RTX PRO 6000, Llama-3.1-8B, bf16) in folder ``tp``; ``cell`` may
    replace a dense.csv time (op, tokens, time) -> cell text."""
    d = root / "llmservingsim-profiles" / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16" / tp
    d.mkdir(parents=True, exist_ok=True)
    lines = ["layer,tokens,time_us"] if header else []
    for op in _DENSE_OPS:
        for t in _TOKENS:
            v = 10 + t * 0.05
            lines.append(f"{op},{t},{cell(op, t, v) if cell else v}")
    (d / "dense.csv").write_text("\n".join(lines) + "\n")
    a = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
    for c in (0, 128, 512, 2048):
        for nd in (0, 1, 4, 16):
            for kv in (0, 512, 4096):
                if c == 0 and nd == 0:
                    continue
                a.append(f"{c},{kv_prefill},{nd},{kv if nd else 0},{5 + c * 0.01 + nd * kv * 0.001}")
    (d / "attention.csv").write_text("\n".join(a + (attn_rows or [])) + "\n")
    (d / "per_sequence.csv").write_text("layer,sequences,time_us\nlm_head,1,50\nlm_head,8,60\nlm_head,64,100\n")
    return root


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _no_traceback(res: Result) -> None:
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output + res.stderr


def _one_error(res: Result, *fragments: str) -> str:
    """The single ``error:`` line of a failed run (exit 1), holding every fragment."""
    _no_traceback(res)
    assert res.exit_code == 1, (res.exit_code, res.output, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    for f in fragments:
        assert f in errors[0], errors[0]
    return errors[0]


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in --json output")

    return json.loads(text, parse_constant=refuse)


def _finite_toml(value: Any) -> None:
    """No NaN or infinity in a parsed profile.toml, as a number or as the text "nan"."""
    if isinstance(value, dict):
        for v in value.values():
            _finite_toml(v)
    elif isinstance(value, list):
        for v in value:
            _finite_toml(v)
    elif isinstance(value, float):
        assert math.isfinite(value)
    elif isinstance(value, str):
        assert value.strip().lower() not in ("nan", "inf", "-inf", "infinity")


def _calibrate(src: Path, out: Path, *extra: str) -> tuple[Result, dict[str, Any]]:
    """``calibrate --measurements src --out out --json``: exit 0, no traceback, valid JSON, and
    every written profile's row counts equal to its Parquet files' rows."""
    res = _cli("calibrate", "--measurements", str(src), "--out", str(out), "--json", *extra)
    _no_traceback(res)
    assert res.exit_code == 0, (res.output, res.stderr)
    doc = _strict_json(res.stdout)
    for prof in doc["profiles"]:
        folder = Path(prof["folder"])
        meta = tomllib.loads((folder / "profile.toml").read_text())
        _finite_toml(meta)
        tables = {p.stem: pl.read_parquet(p).height for p in folder.glob("*.parquet")}
        assert meta["rows"] == tables == prof["rows"]
        assert all(n > 0 for n in tables.values())
    return res, doc


def _rows(doc: dict[str, Any]) -> dict[str, int]:
    [prof] = doc["profiles"]
    return dict(prof["rows"])


# ----------------------------------------------------------------------------------- 1. empty paths


def test_empty_out_and_measurements_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out ''`` used to write into the shipped catalog, ``--measurements ''`` to read the
    current folder: both are one error line (the catalog is swapped for a folder in tmp_path, so
    even the old behaviour could not touch it)."""
    import pipeline.costmodel.profile.tables as tables

    catalog = tmp_path / "catalog-profiles"
    monkeypatch.setattr(tables, "PROFILES_DIR", catalog)
    src = _aic(tmp_path / "m")
    _one_error(_cli("calibrate", "--measurements", str(src), "--out", ""), "--out: the path is empty")
    assert not catalog.exists()
    _one_error(
        _cli("calibrate", "--measurements", "", "--out", str(tmp_path / "p")), "--measurements: the path is empty"
    )
    res = _cli("validate", "--measurements", "", "--store", str(tmp_path / "s"), "--json")
    _one_error(res, "--measurements: the path is empty")
    assert _strict_json(res.stdout)["exit_code"] == 1
    assert not (tmp_path / "p").exists() and not catalog.exists()


# ----------------------------------------------------------------------------------- 2. version folders


def test_an_empty_newer_version_folder_hides_no_table(tmp_path: Path) -> None:
    src = _aic(tmp_path / "m", with_attn=True)
    gpu = src / "aiconfigurator-vllm-ops" / "h100_sxm"
    for fam in ("gemm", "attention", "comm"):
        (gpu / fam / "vllm" / "1.0.0").mkdir()
        (gpu / fam / "vllm" / "9999999999999999999999999").mkdir()
        (gpu / fam / "vllm" / "not-a-version").mkdir()
    _, doc = _calibrate(src, tmp_path / "p")
    assert _rows(doc) == {
        "gemm": _GEMM_ROWS,
        "allreduce": _AR_ROWS,
        "attn_decode": _ATTN_ROWS,
        "attn_prefill": _ATTN_ROWS,
    }
    # a version folder with a huge number that holds the table is the newest one
    newest = gpu / "gemm" / "vllm" / "9999999999999999999999999"
    pl.read_parquet(gpu / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet").head(250).write_parquet(
        newest / "gemm_perf.parquet"
    )
    _, doc = _calibrate(src, tmp_path / "p2")
    assert _rows(doc)["gemm"] == 250
    meta = tomllib.loads((tmp_path / "p2" / "h100-sxm" / "profile.toml").read_text())
    assert any("9999999999999999999999999" in f for f in meta["built_from"])


# ----------------------------------------------------------------------------------- 3. bad rows


def _at_m64(col: str, value: object) -> Mutation:
    return lambda f: f.with_columns(pl.when(pl.col("m") == 64).then(pl.lit(value)).otherwise(pl.col(col)).alias(col))


_BAD_ROWS: list[tuple[str, dict[str, Any], dict[str, int], str]] = [
    # (case, _aic arguments, rows kept per family, the note's text)
    ("gemm latency nan", {"gemm": _at_m64("latency", float("nan"))}, {"gemm": 275},
     "gemm_perf.parquet: 25 of 300 row(s) left out, the first at row 151: latency = nan is not a time"),
    ("gemm latency inf", {"gemm": _at_m64("latency", float("inf"))}, {"gemm": 275}, "latency = inf is not a time"),
    ("gemm latency negative", {"gemm": _at_m64("latency", -1.0)}, {"gemm": 275}, "latency = -1.0 is not a time"),
    ("gemm latency 1e308", {"gemm": _at_m64("latency", 1e308)}, {"gemm": 275}, "latency = 1e+308 is not a time"),
    ("gemm latency bool", {"gemm": lambda f: f.with_columns(latency=pl.lit(True))}, {},
     "gemm_perf.parquet: every row (300) left out, the first at row 1: latency = True is not a time"),
    ("gemm m text", {"gemm": lambda f: f.with_columns(m=pl.col("m").cast(pl.Utf8) + "x")}, {},
     "m = '1x' is not a whole number"),
    ("gemm m fraction", {"gemm": lambda f: f.with_columns(m=pl.col("m") + 0.5)}, {}, "m = 1.5 is not a whole number"),
    ("gemm m 1e300", {"gemm": lambda f: f.with_columns(m=pl.when(pl.col("m") == 1).then(1e300).otherwise(pl.col("m")))},
     {"gemm": 275}, "m = 1e+300 is not a whole number"),
    ("gemm m null", {"gemm": lambda f: f.with_columns(m=pl.when(pl.col("m") == 1).then(None).otherwise(pl.col("m")))},
     {"gemm": 275}, "m = None is not a whole number"),
    ("gemm dtype null", {"gemm": lambda f: f.with_columns(gemm_dtype=pl.lit(None, pl.Utf8))}, {},
     "gemm_dtype = None is not a label"),
    ("gemm header only", {"gemm": lambda f: f.head(0)}, {}, "gemm_perf.parquet: no rows; the table is skipped"),
    ("all-reduce size 2**62", {"ar": lambda f: f.with_columns(message_size=pl.lit(2**62))}, {"allreduce": 0},
     "message_size = 4611686018427387904 is not a whole number in [1, 1099511627776]"),
    ("all-reduce 0 GPUs", {"ar": lambda f: f.with_columns(num_gpus=pl.lit(0))}, {"allreduce": 0}, "num_gpus = 0"),
    ("all-reduce latency nan", {"ar": lambda f: f.with_columns(latency=pl.lit(float("nan")))}, {"allreduce": 0},
     "latency = nan"),
    ("decode step negative", {"with_attn": True, "attn": lambda f: f.with_columns(step=pl.lit(-(10**6)))},
     {"attn_decode": 0, "attn_prefill": 0}, "step = -1000000 is not a whole number in [0, 2147483648]"),
    ("attention no heads", {"with_attn": True, "attn": lambda f: f.with_columns(num_heads=pl.lit(0))},
     {"attn_decode": 0, "attn_prefill": 0}, "num_heads = 0 is not a whole number"),
    ("moe ep 0", {"with_moe": True, "moe": lambda f: f.with_columns(moe_ep_size=pl.lit(0))}, {"moe": 0},
     "moe_ep_size = 0"),
    ("moe top-k 0", {"with_moe": True, "moe": lambda f: f.with_columns(topk=pl.lit(0), num_experts=pl.lit(0))},
     {"moe": 0}, "topk = 0 is not a whole number"),
    ("moe distribution null", {"with_moe": True, "moe": lambda f: f.with_columns(distribution=pl.lit(None, pl.Utf8))},
     {"moe": 0}, "distribution = None is not a label"),
    ("moe latency negative", {"with_moe": True, "moe": lambda f: f.with_columns(latency=-pl.col("latency"))},
     {"moe": 0}, "latency = -0.01 is not a time"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "args", "kept", "note"), _BAD_ROWS, ids=[c[0] for c in _BAD_ROWS])
def test_bad_rows_are_left_out_counted_and_said(
    tmp_path: Path, case: str, args: dict[str, Any], kept: dict[str, int], note: str
) -> None:
    src = _aic(tmp_path / "m", **args)
    res, doc = _calibrate(src, tmp_path / "p")
    skipped = [line for line in res.stderr.splitlines() if line.startswith("skipped: ")]
    assert any(note in line for line in skipped), res.stderr
    assert any(note in s for s in doc["skipped"])
    want = {"gemm": _GEMM_ROWS, "allreduce": _AR_ROWS}
    if args.get("with_attn"):
        want |= {"attn_decode": _ATTN_ROWS, "attn_prefill": _ATTN_ROWS}
    if args.get("with_moe"):
        want["moe"] = _MOE_ROWS
    if not kept:  # every GEMM row left out: no gemm table
        kept = {"gemm": 0}
    want |= kept
    assert _rows(doc) == {k: v for k, v in want.items() if v}
    # the table's notes are in the profile too
    meta = tomllib.loads((tmp_path / "p" / "h100-sxm" / "profile.toml").read_text())
    assert note in meta["selection"]["notes"]
    # validate reads the same rows: valid JSON, no NaN, the same notes
    val = _cli("validate", "--measurements", str(src), "--store", str(tmp_path / "s"), "--json")
    _no_traceback(val)
    assert val.exit_code == 0, val.stderr
    vdoc = _strict_json(val.stdout)
    assert any(note in s for s in vdoc["skipped"])


# ----------------------------------------------------------------------------------- 4. repeats


def test_repeats_that_disagree_are_said_and_the_median_is_used(tmp_path: Path) -> None:
    # three measurements of every shape: x1, x1.1 and x1000; the median is the x1.1 one
    def thrice(f: pl.DataFrame) -> pl.DataFrame:
        return pl.concat([f, *(f.with_columns(latency=pl.col("latency") * x) for x in (1.1, 1000.0))])

    src = _aic(tmp_path / "m", gemm=thrice)
    res, doc = _calibrate(src, tmp_path / "p")
    note = "gemm_perf.parquet: 300 GEMM shape(s) measured more than once with times over 2x apart (max/min), e.g. "
    assert any(line.startswith("note: ") and note in line for line in res.stderr.splitlines()), res.stderr
    assert any(note in n for n in doc["notes"])
    assert _rows(doc)["gemm"] == 3 * _GEMM_ROWS  # kept as measured
    from pipeline.costmodel.profile.tables import load_profile_dir

    prof = load_profile_dir(tmp_path / "p" / "h100-sxm")
    got = prof.gemm_time("bf16", 2048, 4096, np.array([64.0]))[0]
    assert got == pytest.approx(1.1 * 1e-6 * 64**0.7 * 2048**0.5 * 4096**0.3 * 1e-3, rel=1e-9)
    val = _cli("validate", "--measurements", str(src), "--store", str(tmp_path / "s"), "--json")
    assert val.exit_code == 0 and any(note in n for n in _strict_json(val.stdout)["notes"])
    # repeats that agree (within 2x) are not said
    ok = _aic(tmp_path / "ok", gemm=lambda f: pl.concat([f, f.with_columns(latency=pl.col("latency") * 1.5)]))
    res, doc = _calibrate(ok, tmp_path / "p2")
    assert doc["notes"] == [] and "note: " not in res.stderr


def test_mixed_batch_repeats_enter_at_their_median(tmp_path: Path) -> None:
    from pipeline.costmodel.profile.sources import read_measurements

    src = _llmss(tmp_path / "m", attn_rows=["128,0,4,512,1000", "128,0,4,512,2000"])
    meas = read_measurements(src)
    row = meas.get("attn_mixed").filter(
        (pl.col("chunk") == 128) & (pl.col("n_decode") == 4) & (pl.col("kv_decode") == 512)
    )
    assert row["time_s"].to_list() == [pytest.approx(1000e-6)]  # median of 8.328, 1000 and 2000 us
    assert any("1 batch(s) measured more than once" in n for n in meas.notes)


# ----------------------------------------------------------------------------------- 5. families missing


@pytest.mark.parametrize("gemm", ["absent", "empty", "all rows bad"])
def test_a_gpu_without_gemm_rows_is_judged_on_what_it_has(tmp_path: Path, gemm: str) -> None:
    if gemm == "absent":
        src = _aic(tmp_path / "m", with_gemm=False, with_moe=True)
    elif gemm == "empty":
        src = _aic(tmp_path / "m", gemm=lambda f: f.head(0), with_moe=True)
    else:
        src = _aic(tmp_path / "m", gemm=lambda f: f.with_columns(latency=pl.lit(0.0)), with_moe=True)
    _, doc = _calibrate(src, tmp_path / "p")
    assert _rows(doc) == {"allreduce": _AR_ROWS, "moe": _MOE_ROWS}
    assert any(k.startswith("collectives") for k in doc["profiles"][0]["heldout"])
    val = _cli("validate", "--measurements", str(src), "--store", str(tmp_path / "s"), "--json")
    _no_traceback(val)
    assert val.exit_code == 0, val.stderr
    checks = {r["check"] for r in _strict_json(val.stdout)["profile_heldout"]}
    assert "collectives" in checks and "gemm" not in checks


def test_judges_skip_families_with_no_rows() -> None:
    from pipeline.costmodel.profile.heldout import judge
    from pipeline.costmodel.profile.sources import Measurements

    assert judge(Measurements(), "h100-sxm").height == 0


# ----------------------------------------------------------------------------------- 6. LLMServingSim


@pytest.mark.parametrize(
    ("folder", "why"),
    [
        ("tp0", "TP 0 is not in [1, 1024]"),
        ("tp-1", "not a tp<N> folder (N a whole number in [1, 1024])"),
        ("tp3", "TP 3 does not divide the model's 32 attention heads"),
        ("tp99999999999999999999", "TP 99999999999999999999 is not in [1, 1024]"),
    ],
)
def test_a_bundle_with_an_impossible_tp_is_skipped(tmp_path: Path, folder: str, why: str) -> None:
    src = _llmss(tmp_path / "m", folder)
    said = f"{folder}: {why}; the bundle is skipped"
    _one_error(_cli("calibrate", "--measurements", str(src), "--out", str(tmp_path / "p")), "no GPU found", said)
    assert not (tmp_path / "p").exists()
    val = _cli("validate", "--measurements", str(src), "--store", str(tmp_path / "s"), "--json")
    _one_error(val, said)
    # beside a good bundle: the good one is read, the bad one named
    _llmss(src, "tp1")
    _, doc = _calibrate(src, tmp_path / "p2")
    assert any(said in s for s in doc["skipped"])
    assert _rows(doc)["gemm"] == 4 * len(_TOKENS)


@pytest.mark.parametrize(
    ("case", "kwargs", "note", "model_ops"),
    [
        ("nan", {"cell": lambda op, t, v: "nan" if t == 64 else v},
         "dense.csv: 5 of 65 row(s) left out, the first at line 8: time_us = 'nan' is not a time", 63),
        ("text", {"cell": lambda op, t, v: "fast" if t == 64 else v}, "time_us = 'fast' is not a time", 63),
        ("1e308", {"cell": lambda op, t, v: "1e308" if t == 64 else v}, "time_us = '1e308' is not a time", 63),
        ("header only", {"cell": None, "header": True}, "dense.csv: no rows; the table is skipped", 3),
        ("negative kv_prefill", {"kv_prefill": -5},
         "attention.csv: every row (45) left out, the first at line 2: kv_prefill = '-5'", 68),
    ],
)  # fmt: skip
def test_bad_llmservingsim_cells_are_left_out(
    tmp_path: Path, case: str, kwargs: dict[str, Any], note: str, model_ops: int
) -> None:
    src = _llmss(tmp_path / "m", **kwargs)
    if case == "header only":
        dense = next(src.rglob("dense.csv"))
        dense.write_text("layer,tokens,time_us\n")
    _, doc = _calibrate(src, tmp_path / "p")
    assert any(note in s for s in doc["skipped"]), doc["skipped"]
    assert _rows(doc)["model_ops"] == model_ops


# ----------------------------------------------------------------------------------- 7. no NaN anywhere


def test_summaries_and_profile_toml_never_hold_nan() -> None:
    from pipeline.costmodel.profile.build import meta_toml
    from pipeline.costmodel.profile.heldout import heldout_summary, summarise

    errors = pl.DataFrame(
        {
            "check": ["gemm"] * 4,
            "gpu": ["h100-sxm"] * 4,
            "source": ["x"] * 4,
            "shape": ["s"] * 4,
            "tokens": [1.0, 2.0, 3.0, 4.0],
            "token_range": ["1-127"] * 4,
            "measured_s": [1.0, 1.0, float("nan"), 1.0],
            "predicted_s": [1.1, 1.0, 1.0, float("inf")],
            "error": [0.1, 0.0, float("nan"), float("inf")],
            "trained_on": ["t"] * 4,
        }
    )
    s = summarise(errors)
    assert s["rows"].to_list() == [2]
    assert all(math.isfinite(v) for v in (s["median_abs"][0], s["p90_abs"][0]))
    text = meta_toml(
        "h100-sxm", {}, [], {"gemm": 1}, {}, {"a": float("nan"), "b": 1.0},
        {"gemm, 1-127": {"rows": 3, "median_abs_error": float("nan")}, **heldout_summary(errors)},
    )  # fmt: skip
    assert "nan" not in text.lower() and "b = 1.0" in text
    assert tomllib.loads(text)["heldout"]["gemm, 1-127"]["rows"] == 2


def test_validate_json_of_a_set_with_nan_latencies_is_strict_json(tmp_path: Path) -> None:
    def nan_latency(f: pl.DataFrame) -> pl.DataFrame:
        return f.with_columns(latency=pl.lit(float("nan")))

    src = _aic(tmp_path / "m", gemm=_at_m64("latency", float("nan")), ar=nan_latency)
    val = _cli("validate", "--measurements", str(src), "--store", str(tmp_path / "s"), "--json")
    _no_traceback(val)
    assert val.exit_code == 0, val.stderr
    doc = _strict_json(val.stdout)
    assert {r["check"] for r in doc["profile_heldout"]} == {"gemm"}
    assert all(math.isfinite(r["p90_abs"]) for r in doc["profile_heldout"])


# ----------------------------------------------------------------------------------- 8. Splitwise

_SPLITWISE = """model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel
llama-3.1-8b,my-l40s,128,1,128,33.53461309765997,31.161360018177692,1
llama-3.1-8b,my-l40s,256,1,128,36.944393543649866,31.161360018177692,1
llama-3.1-8b,my-l40s,512,1,128,53.691061557603845,31.161360018177692,1
llama-3.1-8b,my-l40s,1024,1,128,103.07708702722648,31.28024565326063,1
llama-3.1-8b,my-l40s,2048,1,128,204.86935581146287,31.52803457396047,1
llama-3.1-8b,my-l40s,4096,1,128,417.6637933476253,32.02361241536015,1
llama-3.1-8b,my-l40s,8192,1,128,880.0922682907086,33.014768098159514,1
llama-3.1-8b,my-l40s,128,2,128,36.945355797683035,31.170549638718473,1
llama-3.1-8b,my-l40s,256,2,128,53.692023811637014,31.18223752783458,1
llama-3.1-8b,my-l40s,512,2,128,103.02830047035422,31.3061319881845,1
llama-3.1-8b,my-l40s,1024,2,128,201.8003514095995,31.553920908884344,1
llama-3.1-8b,my-l40s,2048,2,128,405.3848889780723,32.04949875028402,1
llama-3.1-8b,my-l40s,4096,2,128,830.973764050397,33.04065443308339,1
llama-3.1-8b,my-l40s,8192,2,128,1755.8307139365638,35.022965798682115,1
llama-3.1-8b,my-l40s,128,4,128,53.69394831970337,31.234010197682345,1
llama-3.1-8b,my-l40s,256,4,128,103.03022497842058,31.357904658032272,1
llama-3.1-8b,my-l40s,512,4,128,201.70277829585504,31.605693578732108,1
llama-3.1-8b,my-l40s,1024,4,128,399.2468801743456,32.10127142013179,1
llama-3.1-8b,my-l40s,2048,4,128,806.4159553112911,33.092427102931154,1
llama-3.1-8b,my-l40s,4096,4,128,1657.5937054559406,35.07473846852988,1
llama-3.1-8b,my-l40s,8192,4,128,3507.307605228274,39.03936119972734,1
"""


def test_splitwise_conflicting_repeats_are_said_and_huge_counts_left_out(tmp_path: Path) -> None:
    table = tmp_path / "perf_model.csv"
    table.write_text(
        _SPLITWISE
        + "llama-3.1-8b,my-l40s,128,1,128,9999999,9999999,1\n"  # a repeat 300,000x slower
        + "llama-3.1-8b,my-l40s,2147483647,2147483647,2147483647,1.0,1.0,1\n"  # 2^31 tokens in 1 ms
    )
    fit = ("calibrate", "--hardware", "l40s", "--json", "--measurements")
    res = _cli(*fit, str(table), "--out", str(tmp_path / "x.toml"))
    _no_traceback(res)
    assert res.exit_code == 0, res.stderr
    doc = _strict_json(res.stdout)
    assert any(
        "1 configuration(s) measured more than once with times over 2x apart (max/min)" in s
        and "prompt_size=128, batch_size=1, token_size=128" in s
        and "the median of the repeats is used" in s
        for s in doc["skipped"]
    ), doc["skipped"]
    assert any(
        "1 row(s) left out, the first at line 24: prompt_size = '2147483647' is not a whole number in [1, 16777216]"
        in s
        for s in doc["skipped"]
    ), doc["skipped"]
    # the huge row is not fitted on; the repeated configuration counts once
    clean = tmp_path / "clean.csv"
    clean.write_text(_SPLITWISE)
    ref = _strict_json(_cli(*fit, str(clean), "--out", str(tmp_path / "y.toml")).stdout)
    assert doc["n_train"] + doc["n_holdout"] == ref["n_train"] + ref["n_holdout"]


def test_all_reduce_rows_of_other_dtypes_are_not_read(tmp_path: Path) -> None:
    # message_size counts elements: only 16-bit rows are 2 bytes each. int8 / float32 rows of the
    # same table must not be read as bf16; a table without the dtype column is read as 16-bit
    # and said (the collector's default).
    from pipeline.costmodel.profile.sources import read_measurements

    root = tmp_path / "m"
    _aic(root)
    path = root / "aiconfigurator-vllm-ops" / "h100_sxm" / "comm" / "vllm" / "0.24.0" / "custom_allreduce_perf.parquet"
    f = pl.read_parquet(path)
    pl.concat([f, f.with_columns(allreduce_dtype=pl.lit("int8"), latency=pl.col("latency") * 100)]).write_parquet(path)
    ar = read_measurements(root).get("allreduce")
    assert ar.height == f.height
    f.drop("allreduce_dtype").write_parquet(path)
    m = read_measurements(root)
    assert m.get("allreduce").height == f.height
    assert any("no allreduce_dtype column" in n for n in m.notes)


def test_repeats_with_no_majority_leave_the_file_out(tmp_path: Path) -> None:
    """Every dense.csv row again at 100x its time (a unit mix-up, µs against ms): the median of two
    repeats 100x apart is a time nobody measured, so the file is left out and said, while the
    bundle's other files are read (hostile round 13)."""
    from pipeline.costmodel.profile.sources import read_measurements

    src = _llmss(tmp_path / "m")
    dense = next(src.rglob("dense.csv"))
    rows = dense.read_text().splitlines()
    scaled = [f"{op},{t},{float(v) * 100}" for op, t, v in (r.split(",") for r in rows[1:])]
    dense.write_text("\n".join(rows + scaled) + "\n")
    meas = read_measurements(src)
    said = [n for n in meas.skipped if "dense.csv" in n]
    assert len(said) == 1 and "65 of the 65 operator sizes measured more than once have no majority" in said[0]
    assert "the file is left out" in said[0]
    assert meas.get("model_ops").filter(pl.col("source").str.contains("dense.csv")).height == 0
    assert meas.get("gemm").height == 0  # the bundle's GEMMs come from dense.csv
    assert meas.get("attn_mixed").height > 0  # attention.csv is still read
    # one of three repeats off (x1, x1.1, x1000): the median is a measured time, kept and noted
    src2 = _llmss(tmp_path / "m2")
    dense2 = next(src2.rglob("dense.csv"))
    rows = dense2.read_text().splitlines()
    extra = [f"{op},{t},{float(v) * x}" for op, t, v in (r.split(",") for r in rows[1:]) for x in (1.1, 1000.0)]
    dense2.write_text("\n".join(rows + extra) + "\n")
    meas2 = read_measurements(src2)
    assert not [n for n in meas2.skipped if "dense.csv" in n]
    assert meas2.get("model_ops").filter(pl.col("source").str.contains("dense.csv")).height == 3 * 65
