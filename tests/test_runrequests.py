"""The per-request side of a run, streamed (pipeline/replay/runrequests.py): pods' results spooled to a
file and read back in request order, the requests table written a chunk at a time, and the
summary computed from the written rows equal to the one computed in memory."""

from __future__ import annotations

import itertools
from dataclasses import fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.common.errors import RooftraceError
from pipeline.engine.model import EngineResult
from pipeline.replay.runrequests import RESULT_DTYPE, MemoryColumns, ResultSpool, RunRequests, StoredColumns


def _random_result(rng: np.random.Generator, n: int) -> EngineResult:
    res = EngineResult.empty(n)
    res.arrival_s[:] = np.sort(rng.uniform(0, 100, n))
    res.replica[:] = rng.integers(-1, 9, n)
    for name in ("scheduled_s", "first_token_s", "finish_s", "max_itl_s"):
        v = rng.uniform(0, 200, n)
        v[rng.random(n) < 0.2] = np.nan
        getattr(res, name)[:] = v
    res.preemptions[:] = rng.integers(0, 4, n)
    res.cache_hit_tokens[:] = rng.integers(0, 10**12, n)
    res.prefill_tokens[:] = rng.integers(0, 10**12, n)
    res.reject_reason[:] = rng.integers(0, 3, n)
    return res


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    pods=st.integers(1, 12),
    chunk=st.integers(1, 80),
    seed=st.integers(0, 2**32 - 1),
)
def test_spooled_pods_read_back_in_request_order(tmp_path_factory: pytest.TempPathFactory, n: int, pods: int,
                                                  chunk: int, seed: int) -> None:  # fmt: skip
    """Any cut of the requests into pods, handed over in any pod order: the chunks read back
    are the gathered results, bit for bit, and cover every request once."""
    rng = np.random.default_rng(seed)
    whole = _random_result(rng, n)
    pod_of = rng.integers(0, pods, n)
    spool = ResultSpool(tmp_path_factory.mktemp("spool") / "s.spool", n)
    for p in rng.permutation(pods).tolist():
        rows = np.flatnonzero(pod_of == p).astype(np.int64)
        if rows.size:
            spool.add(rows, EngineResult(**{f.name: getattr(whole, f.name)[rows] for f in fields(EngineResult)}))
    ends = []
    for a, b, got in spool.chunks(chunk):
        ends.append((a, b))
        for f in fields(EngineResult):
            np.testing.assert_array_equal(getattr(got, f.name), getattr(whole, f.name)[a:b], err_msg=f.name)
            assert getattr(got, f.name).dtype == getattr(whole, f.name).dtype
    assert ends[0][0] == 0 and ends[-1][1] == n and all(b == c for (_, b), (c, _) in itertools.pairwise(ends))
    spool.remove()
    assert not spool.path.exists()


def test_spool_refuses_what_it_cannot_put_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    res = _random_result(rng, 4)
    spool = ResultSpool(tmp_path / "s.spool", 6)
    with pytest.raises(ValueError, match="increasing"):
        spool.add(np.array([3, 1, 2, 5]), res)
    with pytest.raises(ValueError, match="4 results"):
        spool.add(np.array([0, 1]), res)
    spool.add(np.array([0, 1, 2, 3]), res)
    with pytest.raises(ValueError, match="twice"):
        spool.add(np.array([3, 4, 5, 2])[np.argsort([3, 4, 5, 2])], res)
    with pytest.raises(ValueError, match="2 requests have no result"):
        next(spool.chunks())
    spool.add(np.array([4, 5]), _random_result(rng, 2))
    with spool.path.open("r+b") as fh:  # cut short behind the spool's back
        fh.truncate(5 * RESULT_DTYPE.itemsize)
    with pytest.raises(RooftraceError, match="end early"):
        list(spool.chunks(3))
    spool.remove()


def _small_run(tmp_path: Path, replicas: int, max_model_len: int, rate: float) -> tuple[object, object]:
    from test_shard import _round_robin_store

    from pipeline.replay.fleet import load_fleet, resolve
    from pipeline.replay.run import ReplayOptions, run_replay

    store, fleet_path = _round_robin_store(tmp_path, 500, seed=3, replicas=replicas)
    text = fleet_path.read_text().replace("max_model_len = 16384", f"max_model_len = {max_model_len}")
    fleet_path.write_text(text)
    fleet = resolve(load_fleet(fleet_path), str(fleet_path))
    requests = store.read_requests(store.resolve_date(None))
    return requests, run_replay(requests, fleet, ReplayOptions(rate_scale=rate))


@pytest.mark.parametrize(("replicas", "max_model_len", "rate"), [(3, 16384, 1.0), (1, 8192, 400.0)])
def test_summary_from_the_written_rows_equals_the_one_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replicas: int, max_model_len: int, rate: float
) -> None:
    """The store-level replay computes its summary from requests.parquet as written (a column at
    a time): every figure, percentiles, overload and SLO verdict included, equals the in-memory
    summary; the second case has rejected requests and an overloaded fleet."""
    from pipeline.common import schemas
    from pipeline.common.schemas import read_parquet
    from pipeline.replay import runrequests
    from pipeline.replay.run import requests_table, summarize, summary_of
    from pipeline.replay.slo import parse_slo

    requests, run = _small_run(tmp_path, replicas, max_model_len, rate)
    monkeypatch.setattr(runrequests, "CHUNK_ROWS", 64)
    monkeypatch.setattr(schemas, "ROW_GROUP_ROWS", 100)
    said: list[str] = []
    out = RunRequests(tmp_path / "run", requests.get_column("request_id").to_arrow(), run.work, 17, said.append)
    out.write_result(run.result)
    assert said == [f"replay: writing the run's requests table ({run.work.n:,} rows) and its summary"]
    path = out.finish()
    slo = parse_slo("ttft_p90=0.5s,tpot_p50=20ms,queue_p99=1s")
    stored = summary_of(StoredColumns(path), run.step_sums(), run, slo)
    assert stored == summarize(run, slo)
    if max_model_len < 16384:  # the case meant to show failures shows them
        assert stored["rejected"] > 0 and stored["health"]["overload"]["detected"], stored["health"]
    for name in ("reject_code", "ttft_s", "finish_s", "preemptions", "output_tokens"):
        got, want = StoredColumns(path).get(name), MemoryColumns(run.result, run.work).get(name)
        np.testing.assert_array_equal(got, want, err_msg=name)
    out.commit()
    table = read_parquet(tmp_path / "run" / "requests.parquet", "replay_requests")
    assert table.equals(schemas.conform(requests_table(requests, run, 17), "replay_requests"))
    assert pa.types.is_timestamp(table.schema.field("arrival").type)
