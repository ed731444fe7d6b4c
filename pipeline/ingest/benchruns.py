"""Result files of the benchmark clients users run against their servers, read as *bench runs*.

A bench run is the requests one client run sent (in the order it sent them: their input and
output tokens and, where the file has them, the times they were sent), the latencies it observed
(TTFT, end-to-end, the per-request mean inter-token latency and the per-token gaps where given)
and the client's methodology: a closed loop of C clients, an open loop at a stated rate (Poisson,
gamma with a burstiness, constant), or everything at once. ``rooftrace validate --runs`` replays
each under its own methodology (pipeline/calibrate/benchruns.py; docs/benchruns.md).

Three shapes are read, each as the tool writes it (fields looked up in the tools' own source):

- **vLLM** ``vllm bench serve --save-result --save-detailed`` (vllm/benchmarks/serve.py): one JSON
  object per run — ``input_lens``, ``output_lens``, ``ttfts``, ``itls`` (per request, the list of
  gaps between streamed chunks), ``latencies``, ``start_times``, ``errors``, and the run's
  ``model_id``, ``request_rate`` (a number or ``"inf"``), ``burstiness``, ``max_concurrency``,
  ``ramp_up_strategy``, ``duration``; ``--append-result`` puts one object per line (a sweep).
  Times in seconds. A failed request has an error text and latency 0.
- **GuideLLM** benchmarks JSON (``{"benchmarks": [...]}``, guidellm/benchmark/schemas): one
  benchmark per strategy of the profile (synchronous, concurrent, throughput, constant, poisson;
  a sweep is several), its ``requests`` split into ``successful`` / ``errored`` / ``incomplete``,
  each with ``prompt_tokens``, ``output_tokens``, ``time_to_first_token_ms``,
  ``inter_token_latency_ms``, ``request_latency`` (s) and its start time (``start_time`` up to
  v0.3, ``request_start_time`` / ``info.timings.request_start`` after); the strategy under
  ``args.strategy`` (v0.2–0.3) or ``config.strategy`` (v0.4 on).
- **AIPerf** ``profile_export.jsonl`` (aiperf/common/models/record_models.py): one record per
  request, ``metadata`` (``request_start_ns``, ``benchmark_phase``) and ``metrics``
  (``{"value", "unit"}``: ``input_sequence_length``, ``output_sequence_length``,
  ``time_to_first_token``, ``request_latency``, ``inter_token_latency``,
  ``inter_chunk_latency``), ``error`` for a failed one; the load generator's settings are in
  ``profile_export_aiperf.json`` beside it (``input_config.loadgen``: ``concurrency``,
  ``request_rate``, ``request_rate_mode``).

Bad input is one line naming the file and the field (:class:`BenchRunError`), never a traceback;
a file of another shape is refused with the shapes known (:data:`KNOWN_SHAPES`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.common.errors import RooftraceError

#: What ``validate --runs`` reads, as its refusals list them.
KNOWN_SHAPES = (
    "vLLM `vllm bench serve --save-result --save-detailed` JSON (one object per run, or one per line "
    "with --append-result)",
    'GuideLLM benchmarks JSON ({"benchmarks": [...]} with per-request stats)',
    'AIPerf per-request export profile_export.jsonl (one {"metadata", "metrics"} record per line)',
)
#: The largest result file read (a detailed vLLM run of 100,000 requests is about 1 GB of text).
MAX_FILE_BYTES = 4 * 1024**3
#: Tokens of one request beyond any model's context window: refused as a damaged count.
MAX_TOKENS = 100_000_000
#: A latency beyond a week is no benchmark measurement: refused as a damaged value.
MAX_LATENCY_S = 7 * 86_400.0
#: Files of the tools' output folders that hold no run of their own (read with their run, or not at all).
COMPANIONS = ("profile_export_aiperf.json", "inputs.json")
#: The columns of :attr:`BenchRun.requests`, in this order.
REQUEST_COLUMNS = ("sent_s", "input_tokens", "output_tokens", "ttft_s", "e2e_s", "itl_mean_s")
#: Seed of the arrivals generated for an open-loop run whose file has no send times.
ARRIVAL_SEED = 0


class BenchRunError(RooftraceError):
    """A result file that cannot be read as a bench run: one line naming the file and field."""


@dataclass(frozen=True)
class Methodology:
    """How the client sent its requests.

    ``mode``: ``closed`` (``concurrency`` clients, each sending its next request when the last
    one finished; the first ones started over ``ramp_s``), ``open`` (requests at their own times:
    the file's send times where it has them, ``arrivals = "sent"``, else generated from the stated
    process, ``"generated"``) or ``offline`` (everything at once)."""

    mode: str
    concurrency: int | None = None
    rate_per_s: float | None = None
    #: The open loop's process as the tool names it: poisson, gamma, constant, ramp-up, ...
    process: str | None = None
    burstiness: float | None = None
    arrivals: str | None = None
    ramp_s: float = 0.0

    def describe(self) -> str:
        if self.mode == "closed":
            c = self.concurrency or 1
            text = f"closed loop, {c} client{'s' if c != 1 else ''}"
            return text + (f", ramp {self.ramp_s:g} s" if self.ramp_s else "")
        if self.mode == "offline":
            return "all at once"
        what = self.process or "open loop"
        if self.rate_per_s is not None:
            what += f" at {self.rate_per_s:g} req/s"
        if self.burstiness is not None and self.process in ("poisson", "gamma"):
            what += f" (burstiness {self.burstiness:g})"
        return what + (", times as sent" if self.arrivals == "sent" else ", times generated")


@dataclass(frozen=True)
class BenchRun:
    """One client run: its successful requests in the order sent, their observed latencies, the
    client's methodology and the run's model as the file names it."""

    name: str
    path: Path
    tool: str
    model: str | None
    methodology: Methodology
    #: One row per successful request, in the order sent (REQUEST_COLUMNS): ``sent_s`` seconds
    #: from the first send (null where the file has no send times), tokens, observed ``ttft_s``,
    #: ``e2e_s`` and the request's mean inter-token latency ``itl_mean_s`` (null where not given).
    requests: pl.DataFrame
    #: Every gap between streamed tokens (or chunks) of the successful requests, seconds; None
    #: where the file has no per-token gaps (GuideLLM keeps only each request's mean).
    itls_s: npt.NDArray[np.float64] | None
    #: Requests the client counted as failed (errored, incomplete, cancelled): not replayed.
    failed: int = 0
    notes: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        return self.requests.height


# -- reading files -------------------------------------------------------------------------------


def find_runs(path: Path | str) -> list[BenchRun]:
    """Every bench run in ``path``: a result file, or a folder searched for ``*.json`` and
    ``*.jsonl`` files (in name order; the tools' companion files and vLLM's ``*.pytorch.json``
    are read with their run or skipped). A file of another shape is refused."""
    root = Path(path)
    if not root.exists():
        raise BenchRunError(f"{root}: no such file or folder of benchmark results")
    if root.is_file():
        return read_runs(root, root.name)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
    runs: list[BenchRun] = []
    for f in files:
        if f.name.endswith(".pytorch.json") or f.name in COMPANIONS:
            continue
        runs += read_runs(f, f.relative_to(root).as_posix())
    if not runs:
        raise BenchRunError(
            f"{root}: no benchmark result files (*.json, *.jsonl) in it; known: {'; '.join(KNOWN_SHAPES)}"
        )
    return runs


def read_runs(path: Path, name: str | None = None) -> list[BenchRun]:
    """The bench runs of one result file (several for a vLLM ``--append-result`` file or a
    GuideLLM sweep), named ``name`` (default: the file name), ``name#k`` for the k-th of several."""
    name = name if name is not None else path.name
    records = _load(path)
    first = records[0]
    if isinstance(first, dict) and "benchmarks" in first and len(records) == 1:
        runs = _guidellm(path, name, first)
    elif isinstance(first, dict) and "metadata" in first and "metrics" in first:
        runs = [_aiperf(path, name, records)]
    elif isinstance(first, dict) and ("ttfts" in first or "input_lens" in first):
        runs = [_vllm(path, f"{name}#{k + 1}" if len(records) > 1 else name, r, k, len(records))
                for k, r in enumerate(records)]  # fmt: skip
    elif isinstance(first, dict) and ("mean_ttft_ms" in first or "max_concurrency" in first):
        raise BenchRunError(
            f"{path}: a vLLM bench serve result without its per-request fields (input_lens, output_lens, ttfts, "
            "itls): run `vllm bench serve` with --save-result --save-detailed"
        )
    else:
        keys = sorted(first)[:8] if isinstance(first, dict) else type(first).__name__
        raise BenchRunError(
            f"{path}: not a benchmark result rooftrace reads (found {keys}); known: {'; '.join(KNOWN_SHAPES)}"
        )
    return runs


def evidence_text(path: Path, limit: int, error: type[Exception], what: str, known: Sequence[str]) -> str:
    """The text of an evidence file a user brings (a benchmark result, step telemetry): at most
    ``limit`` bytes of UTF-8, not empty; else one ``error`` naming the file and why (``what`` it is
    not, and the ``known`` layouts when it is empty)."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise error(f"{path}: {size:,} bytes, larger than the {limit:,} read")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); not {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not text.strip():
        raise error(f"{path}: empty file; known: {'; '.join(known)}")
    return text


def _load(path: Path) -> list[Any]:
    """The file's JSON value, or its JSON Lines records (one value per non-empty line)."""
    text = evidence_text(path, MAX_FILE_BYTES, BenchRunError, "a benchmark result", KNOWN_SHAPES)
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise BenchRunError(
                f"{path}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}; truncated?)"
            ) from None
    except RecursionError:
        raise BenchRunError(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise BenchRunError(f"{path}: not readable JSON ({str(exc).splitlines()[0]})") from None
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise BenchRunError(
                f"{path}: line {i}: not valid JSON at column {exc.colno} ({exc.msg}; one JSON value per line expected, "
                "truncated?)"
            ) from None
        except RecursionError:
            raise BenchRunError(f"{path}: line {i}: JSON nested too deeply") from None
        except ValueError as exc:
            raise BenchRunError(f"{path}: line {i}: not readable JSON ({str(exc).splitlines()[0]})") from None
    return records


# -- checked values -------------------------------------------------------------------------------


def _where(path: Path, field: str) -> str:
    return f"{path}: {field}"


def _number(path: Path, field: str, v: Any, lo: float = 0.0, hi: float = MAX_LATENCY_S) -> float:
    """A finite number in [lo, hi] (booleans and text refused)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BenchRunError(f"{_where(path, field)} must be a number, got {_shown(v)}")
    if isinstance(v, int) and abs(v) > 1e300:
        raise BenchRunError(f"{_where(path, field)} = {_shown(v)} is out of range (at most {hi:g})")
    x = float(v)
    if not math.isfinite(x):
        raise BenchRunError(f"{_where(path, field)} must be finite, got {_shown(v)}")
    if x < lo:
        raise BenchRunError(f"{_where(path, field)} is negative ({x:g}): a latency or count is >= {lo:g}")
    if x > hi:
        raise BenchRunError(f"{_where(path, field)} = {x:g} is out of range (at most {hi:g})")
    return x


def _tokens(path: Path, field: str, v: Any) -> int:
    """A whole token count in [0, MAX_TOKENS] (an integral float, as JSON may write it, taken)."""
    x = _number(path, field, v, 0.0, float(MAX_TOKENS))
    if x != int(x):
        raise BenchRunError(f"{_where(path, field)} must be a whole number of tokens, got {x:g}")
    return int(x)


def _shown(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, float) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _list(path: Path, obj: dict[str, Any], key: str, n: int | None, required: bool = True) -> list[Any] | None:
    """``obj[key]`` as a list of ``n`` values (the run's request count), or None when absent and not required."""
    if key not in obj or obj[key] is None:
        if required:
            raise BenchRunError(f"{_where(path, key)} missing: the per-request field is needed (--save-detailed)")
        return None
    v = obj[key]
    if not isinstance(v, list):
        raise BenchRunError(f"{_where(path, key)} must be a list (one value per request), got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise BenchRunError(
            f"{_where(path, key)} has {len(v):,} values but input_lens has {n:,}: lists of one run differ in length"
        )
    return v


def _frame(rows: dict[str, list[Any]]) -> pl.DataFrame:
    """The requests frame (REQUEST_COLUMNS) from column lists, ordered by send time where known."""
    frame = pl.DataFrame(
        {c: rows[c] for c in REQUEST_COLUMNS},
        schema={
            "sent_s": pl.Float64,
            "input_tokens": pl.Int64,
            "output_tokens": pl.Int64,
            "ttft_s": pl.Float64,
            "e2e_s": pl.Float64,
            "itl_mean_s": pl.Float64,
        },
    )
    if frame.height and frame.get_column("sent_s").null_count() == 0:
        first = frame.get_column("sent_s").min()
        frame = frame.with_columns(pl.col("sent_s") - first).sort("sent_s", maintain_order=True)
    return frame


def _check_e2e(path: Path, field: str, ttft: float, e2e: float) -> None:
    if e2e + 1e-9 < ttft:
        raise BenchRunError(f"{_where(path, field)} = {e2e:g} s is below the request's TTFT {ttft:g} s")


# -- vLLM ------------------------------------------------------------------------------------------


def _vllm(path: Path, name: str, obj: Any, k: int, count: int) -> BenchRun:
    where = path if count == 1 else Path(f"{path} (line {k + 1})")
    if not isinstance(obj, dict):
        raise BenchRunError(f"{where}: a vLLM result is a JSON object, got {type(obj).__name__}")
    lens = _list(where, obj, "input_lens", None)
    assert lens is not None
    n = len(lens)
    if n == 0:
        raise BenchRunError(f"{_where(where, 'input_lens')} is empty: the run has no requests")
    outs = _list(where, obj, "output_lens", n)
    ttfts = _list(where, obj, "ttfts", n)
    itls = _list(where, obj, "itls", n, required=False)
    lat = _list(where, obj, "latencies", n, required=False)
    starts = _list(where, obj, "start_times", n, required=False)
    errors = _list(where, obj, "errors", n, required=False)
    if lat is None and itls is None:
        raise BenchRunError(f"{where}: neither latencies nor itls: the end-to-end latency cannot be formed")
    assert outs is not None and ttfts is not None
    cols: dict[str, list[Any]] = {c: [] for c in REQUEST_COLUMNS}
    gaps: list[float] = []
    failed = 0
    for i in range(n):
        err = errors[i] if errors is not None else None
        if err not in (None, "") or (lat is not None and lat[i] == 0 and ttfts[i] == 0):
            failed += 1
            continue
        ttft = _number(where, f"ttfts[{i}]", ttfts[i])
        own: list[float] = []
        if itls is not None:
            if not isinstance(itls[i], list):
                raise BenchRunError(f"{_where(where, f'itls[{i}]')} must be a list of gaps, got {_shown(itls[i])}")
            own = [_number(where, f"itls[{i}][{j}]", g) for j, g in enumerate(itls[i])]
        e2e = _number(where, f"latencies[{i}]", lat[i]) if lat is not None else ttft + math.fsum(own)
        _check_e2e(where, f"latencies[{i}]", ttft, e2e)
        cols["input_tokens"].append(_tokens(where, f"input_lens[{i}]", lens[i]))
        cols["output_tokens"].append(_tokens(where, f"output_lens[{i}]", outs[i]))
        cols["sent_s"].append(_number(where, f"start_times[{i}]", starts[i], 0.0, math.inf) if starts else None)
        cols["ttft_s"].append(ttft)
        cols["e2e_s"].append(e2e)
        cols["itl_mean_s"].append(math.fsum(own) / len(own) if own else None)
        gaps += own
    if failed == n:
        raise BenchRunError(f"{where}: every one of its {n:,} requests failed (errors): nothing to replay")
    frame = _frame(cols)
    model = obj.get("model_id") if isinstance(obj.get("model_id"), str) else None
    return BenchRun(name, path, "vllm", model, _vllm_method(where, obj, starts is not None), frame,
                    np.asarray(gaps, np.float64) if itls is not None else None, failed)  # fmt: skip


def _vllm_method(path: Path, obj: dict[str, Any], sent: bool) -> Methodology:
    """vLLM's client: ``max_concurrency`` C with ``request_rate`` inf is a closed loop of C
    (every request a task waiting on one semaphore of C, taken in order); a finite rate is an
    open loop (gamma intervals of shape ``burstiness``, Poisson at 1); inf without a cap sends
    everything at once. A finite rate capped by C, or a ramp-up, is replayed at the send times."""
    rate_raw = obj.get("request_rate", "inf")
    rate = math.inf if rate_raw in ("inf", "Infinity", None) else _number(path, "request_rate", rate_raw, 0.0, math.inf)
    if rate_raw not in ("inf", "Infinity", None) and rate == 0:
        raise BenchRunError(f'{_where(path, "request_rate")} must be > 0 or "inf", got 0')
    burst = (
        _number(path, "burstiness", obj.get("burstiness", 1.0), 0.0, 1e6) if obj.get("burstiness") is not None else 1.0
    )
    cap = obj.get("max_concurrency")
    conc = int(_tokens(path, "max_concurrency", cap)) if cap is not None else None
    if conc == 0:
        raise BenchRunError(f"{_where(path, 'max_concurrency')} must be >= 1, got 0")
    ramp = obj.get("ramp_up_strategy")
    if ramp is None and math.isinf(rate):
        return Methodology("closed", concurrency=conc) if conc is not None else Methodology("offline")
    process = f"ramp-up {ramp}" if ramp is not None else ("poisson" if burst == 1.0 else "gamma")
    m = Methodology("open", rate_per_s=None if math.isinf(rate) else rate, process=process, burstiness=burst,
                    arrivals="sent" if sent else "generated")  # fmt: skip
    if not sent and (ramp is not None or conc is not None):
        why = "a ramp-up" if ramp is not None else f"a rate capped by max_concurrency {conc}"
        raise BenchRunError(
            f"{path}: {why} without start_times cannot be replayed (the send times are not in the file); "
            "save it with a vLLM that writes start_times"
        )
    return m


# -- GuideLLM ------------------------------------------------------------------------------------------


def _dig(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(k)
    return obj


def _guidellm(path: Path, name: str, doc: dict[str, Any]) -> list[BenchRun]:
    benches = doc.get("benchmarks")
    if not isinstance(benches, list) or not benches:
        raise BenchRunError(f"{_where(path, 'benchmarks')} must be a non-empty list of benchmarks")
    out = []
    for k, b in enumerate(benches):
        field = f"benchmarks[{k}]"
        if not isinstance(b, dict):
            raise BenchRunError(f"{_where(path, field)} must be an object, got {_shown(b)}")
        out.append(_guidellm_one(path, f"{name}#{k + 1}" if len(benches) > 1 else name, b, field, doc))
    return out


def _guidellm_one(path: Path, name: str, b: dict[str, Any], field: str, doc: dict[str, Any]) -> BenchRun:
    reqs = b.get("requests")
    if not isinstance(reqs, dict) or not isinstance(reqs.get("successful"), list):
        raise BenchRunError(f"{_where(path, field + '.requests.successful')} missing: the per-request stats are needed")
    ok = reqs["successful"]
    failed = sum(len(reqs.get(s) or []) for s in ("errored", "incomplete") if isinstance(reqs.get(s), list))
    totals = b.get("request_totals")
    listed = _dig(totals, "successful")
    if (isinstance(listed, int) and listed > len(ok)) or b.get("request_samples") is not None:
        raise BenchRunError(
            f"{_where(path, field + '.requests')}: the requests were sampled (GuideLLM --output-sampling): the file "
            f"lists {len(ok):,} of {listed if isinstance(listed, int) else 'more'} successful requests, and a replay "
            "needs every request the client sent"
        )
    if not ok:
        raise BenchRunError(f"{_where(path, field + '.requests.successful')} is empty: nothing to replay")
    cols: dict[str, list[Any]] = {c: [] for c in REQUEST_COLUMNS}
    for i, r in enumerate(ok):
        f = f"{field}.requests.successful[{i}]"
        if not isinstance(r, dict):
            raise BenchRunError(f"{_where(path, f)} must be an object, got {_shown(r)}")
        start = r.get("start_time", r.get("request_start_time", _dig(r, "info", "timings", "request_start")))
        start_s = _number(path, f + ".start_time", start, 0.0, math.inf)
        if r.get("time_to_first_token_ms") is not None:
            ttft = (
                _number(path, f + ".time_to_first_token_ms", r["time_to_first_token_ms"], hi=MAX_LATENCY_S * 1e3) / 1e3
            )
        else:
            first = r.get("first_token_time", _dig(r, "info", "timings", "first_token_iteration"))
            ttft = _number(path, f + ".first_token_time", first, 0.0, math.inf) - start_s
            ttft = _number(path, f + ".time_to_first_token", ttft)
        if r.get("request_latency") is not None:
            e2e = _number(path, f + ".request_latency", r["request_latency"])
        else:
            end = r.get("end_time", _dig(r, "info", "timings", "request_end"))
            e2e = _number(path, f + ".request_latency", _number(path, f + ".end_time", end, 0.0, math.inf) - start_s)
        _check_e2e(path, f + ".request_latency", ttft, e2e)
        itl = r.get("inter_token_latency_ms")
        cols["sent_s"].append(start_s)
        cols["input_tokens"].append(_tokens(path, f + ".prompt_tokens", r.get("prompt_tokens")))
        cols["output_tokens"].append(_tokens(path, f + ".output_tokens", r.get("output_tokens")))
        cols["ttft_s"].append(ttft)
        cols["e2e_s"].append(e2e)
        cols["itl_mean_s"].append(
            _number(path, f + ".inter_token_latency_ms", itl, hi=MAX_LATENCY_S * 1e3) / 1e3 if itl is not None else None
        )
    strategy = _dig(b, "config", "strategy") or _dig(b, "args", "strategy")
    model = (
        _dig(b, "config", "backend", "model")
        or _dig(b, "worker", "backend_model")
        or _dig(doc, "args", "model")
        or _dig(b, "config", "requests", "model")
    )
    return BenchRun(name, path, "guidellm", model if isinstance(model, str) else None,
                    _guidellm_method(path, field, strategy), _frame(cols), None, failed)  # fmt: skip


def _guidellm_method(path: Path, field: str, s: Any) -> Methodology:
    """GuideLLM's strategies: synchronous is one client; concurrent is ``streams`` clients, the
    first ones started ``rampup_duration`` · i / streams apart (rooftrace's ramp puts client c at
    c · R / (C − 1), so R = rampup · (C − 1) / C); throughput sends every request at once, at most
    ``max_concurrency`` in flight (a closed loop of that many); constant and poisson are open loops
    at ``rate``, replayed at the requests' own start times."""
    f = field + ".strategy"
    if not isinstance(s, dict) or not isinstance(s.get("type_"), str):
        raise BenchRunError(f"{_where(path, f)} missing: the client's strategy (its type_) is needed")
    kind = s["type_"]
    if kind == "synchronous":
        return Methodology("closed", concurrency=1)
    if kind in ("concurrent", "throughput"):
        key = "streams" if kind == "concurrent" else "max_concurrency"
        if s.get(key) is None:
            if kind == "throughput":
                return Methodology("offline")
            raise BenchRunError(f"{_where(path, f + '.streams')} missing")
        c = _tokens(path, f"{f}.{key}", s[key])
        if c < 1:
            raise BenchRunError(f"{_where(path, f + '.' + key)} must be >= 1, got 0")
        rampup = _number(path, f + ".rampup_duration", s.get("rampup_duration") or 0.0, 0.0, 86_400.0)
        return Methodology("closed", concurrency=c, ramp_s=rampup * (c - 1) / c if c > 1 else 0.0)
    if kind in ("constant", "poisson"):
        rate = _number(path, f + ".rate", s.get("rate"), 0.0, math.inf)
        return Methodology("open", rate_per_s=rate, process=kind, burstiness=1.0 if kind == "poisson" else None,
                           arrivals="sent")  # fmt: skip
    raise BenchRunError(
        f"{_where(path, f + '.type_')} {kind!r} unknown; known: synchronous, concurrent, throughput, constant, poisson"
    )


# -- AIPerf ------------------------------------------------------------------------------------------

_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "seconds": 1.0}


def _metric(path: Path, field: str, metrics: dict[str, Any], name: str, time: bool) -> Any:
    """A metric's value (seconds for a time, converted from its unit), None when absent."""
    m = metrics.get(name)
    if m is None:
        return None
    if not isinstance(m, dict) or "value" not in m:
        raise BenchRunError(f'{_where(path, f"{field}.metrics.{name}")} must be {{"value", "unit"}}, got {_shown(m)}')
    v = m["value"]
    if not time:
        return v
    unit = m.get("unit", "ms")
    if unit not in _TIME_UNITS:
        raise BenchRunError(
            f"{_where(path, f'{field}.metrics.{name}.unit')} {unit!r} is not a time unit (ns, us, ms, s)"
        )
    scale = _TIME_UNITS[unit]
    if isinstance(v, list):
        return [_number(path, f"{field}.metrics.{name}.value[{j}]", x, hi=MAX_LATENCY_S / scale) * scale
                for j, x in enumerate(v)]  # fmt: skip
    return _number(path, f"{field}.metrics.{name}.value", v, hi=MAX_LATENCY_S / scale) * scale


def _aiperf(path: Path, name: str, records: Sequence[Any]) -> BenchRun:
    cols: dict[str, list[Any]] = {c: [] for c in REQUEST_COLUMNS}
    gaps: list[float] = []
    start_ns: list[int] = []
    has_gaps = False
    failed = warmup = 0
    for i, rec in enumerate(records):
        f = f"line {i + 1}"
        if not isinstance(rec, dict) or not isinstance(rec.get("metadata"), dict):
            raise BenchRunError(f"{_where(path, f)}: an AIPerf record has metadata and metrics, got {_shown(rec)}")
        meta = rec["metadata"]
        if meta.get("benchmark_phase", "profiling") != "profiling":
            warmup += 1
            continue
        metrics = rec.get("metrics")
        if rec.get("error") is not None or meta.get("was_cancelled") or not isinstance(metrics, dict):
            failed += 1
            continue
        start = meta.get("request_start_ns", meta.get("timestamp_ns"))
        _number(path, f + ".metadata.request_start_ns", start, 0.0, math.inf)
        start_ns.append(int(start))
        ttft = _metric(path, f, metrics, "time_to_first_token", True)
        e2e = _metric(path, f, metrics, "request_latency", True)
        if ttft is None or e2e is None:
            missing = "time_to_first_token" if ttft is None else "request_latency"
            raise BenchRunError(
                f"{_where(path, f + '.metrics.' + missing)} missing (a streaming run is needed for TTFT)"
            )
        _check_e2e(path, f + ".metrics.request_latency", ttft, e2e)
        isl = _metric(path, f, metrics, "input_sequence_length", False)
        osl = _metric(path, f, metrics, "output_sequence_length", False)
        if osl is None:
            osl = _metric(path, f, metrics, "output_token_count", False)
        chunks = _metric(path, f, metrics, "inter_chunk_latency", True)
        itl = _metric(path, f, metrics, "inter_token_latency", True)
        cols["input_tokens"].append(_tokens(path, f + ".metrics.input_sequence_length", isl))
        cols["output_tokens"].append(_tokens(path, f + ".metrics.output_sequence_length", osl))
        cols["ttft_s"].append(ttft)
        cols["e2e_s"].append(e2e)
        cols["itl_mean_s"].append(itl)
        if isinstance(chunks, list):
            has_gaps = True
            gaps += chunks
    if not cols["ttft_s"]:
        raise BenchRunError(f"{path}: no successful profiling request ({failed:,} failed, {warmup:,} warm-up)")
    first_ns = min(start_ns)  # epoch nanoseconds: differences taken in integers, then seconds
    cols["sent_s"] = [(t - first_ns) * 1e-9 for t in start_ns]
    method, model, note = _aiperf_method(path)
    notes: tuple[str, ...] = (note,) if note else ()
    if warmup:
        notes += (f"{warmup:,} warm-up records not replayed",)
    return BenchRun(name, path, "aiperf", model, method, _frame(cols),
                    np.asarray(gaps, np.float64) if has_gaps else None, failed, notes)  # fmt: skip


def _aiperf_method(path: Path) -> tuple[Methodology, str | None, str | None]:
    """The load generator's settings from ``profile_export_aiperf.json`` beside the export:
    ``concurrency`` without a ``request_rate`` is a closed loop (concurrency_burst); a rate is an
    open loop (constant or poisson), replayed at the records' send times. Without that file the
    records are replayed at their send times, said in a note."""
    side = path.with_name("profile_export_aiperf.json")
    sent = Methodology("open", process="as sent", arrivals="sent")
    if not side.is_file():
        return sent, None, f"no {side.name} beside it: replayed at the records' send times"
    doc = _load(side)[0]
    loadgen = _dig(doc, "input_config", "loadgen")
    names = _dig(doc, "input_config", "endpoint", "model_names")
    model = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    if not isinstance(loadgen, dict):
        return sent, model, f"{side.name} has no input_config.loadgen: replayed at the records' send times"
    rate, conc = loadgen.get("request_rate"), loadgen.get("concurrency")
    if rate is not None:
        r = _number(side, "input_config.loadgen.request_rate", rate, 0.0, math.inf)
        mode = loadgen.get("request_rate_mode") or "poisson"
        return Methodology("open", rate_per_s=r, process=str(mode), arrivals="sent"), model, None
    c = _tokens(side, "input_config.loadgen.concurrency", conc if conc is not None else 1)
    if c < 1:
        raise BenchRunError(f"{_where(side, 'input_config.loadgen.concurrency')} must be >= 1, got 0")
    ramp = loadgen.get("concurrency_ramp_duration")
    ramp_s = _number(side, "input_config.loadgen.concurrency_ramp_duration", ramp, 0.0, 86_400.0) if ramp else 0.0
    return Methodology("closed", concurrency=c, ramp_s=ramp_s if c > 1 else 0.0), model, None


# -- arrivals -----------------------------------------------------------------------------------------


def arrivals_s(run: BenchRun) -> npt.NDArray[np.float64]:
    """Each request's arrival for the replay, seconds from the first: the send times where the
    run has them, else (an open loop without them) generated from the stated process as vLLM's
    client draws it — gamma intervals of shape ``burstiness`` and mean 1 / rate, their sum scaled
    to n / rate — with a fixed seed; for a closed loop or everything at once only the order
    counts (0, 1, 2, ... µs)."""
    m, n = run.methodology, run.n
    sent = run.requests.get_column("sent_s")
    if m.mode == "open" and sent.null_count() == 0:
        times: npt.NDArray[np.float64] = np.asarray(sent.to_numpy(), dtype=np.float64)
        return times
    if m.mode == "open":
        rate = m.rate_per_s or 1.0
        burst = m.burstiness or 1.0
        rng = np.random.default_rng(ARRIVAL_SEED)
        gaps = rng.gamma(shape=burst, scale=1.0 / (rate * burst), size=n)
        t: npt.NDArray[np.float64] = np.cumsum(gaps, dtype=np.float64)
        t *= (n / rate) / t[-1]
        t -= t[0]
        return t
    return np.arange(n, dtype=np.float64) * 1e-6
