"""Capacity planning: the cheapest fleet that meets the latency SLOs on real traffic.

``plan(store, options)`` takes one date of canonical requests for a model, picks the window to size
for (the busiest ``window_s`` seconds by token volume, after a warm-up, or the whole day), and for
every hardware × TP × weight precision that fits the model finds the **minimum replica count** whose
replay of that window meets every SLO target. Latency falls as replicas are added (more capacity,
same traffic), so the count is searched, not swept: from an analytic lower bound (fresh prefill
and decode demand of the window over one replica's capacity, priced by its cost model), galloping up (+1, +2, +4, ...)
until the SLO is met, then by bisection, so the answer ``n`` always comes with a replay at ``n − 1`` that
misses. Configurations run in parallel processes (``executor="local"``) or on a Ray cluster
(``executor="ray"``, optional extra).

Outputs, under ``STORE/plans/<plan_id>/`` (the id digests the inputs; a re-run rewrites the same
bytes): ``plan.parquet`` (schema ``plan``: one row per configuration, ranked by $/day, with the
Pareto front of cost vs p99 TTFT), ``search.parquet`` (``plan_search``: every replay the search
ran) and ``plan.json`` (options, SLO, window, the chosen configuration and its sizing). The
chosen configuration's cost split and API-equivalent cost go to ``STORE/costs/<plan_id>/``
(pipeline.economics.cost).

SLO semantics: a target ``ttft_p99 <= L`` is met when at least 99 % of the measured requests have
TTFT <= L. A rejected request (longer than ``max_model_len``, or needing more KV than a replica
has) counts as missing every target, and a configuration that rejects any measured request does
not meet the SLO unless ``max_rejected`` (``--max-rejected 0.1%``) allows that share: rejections
do not depend on the replica count, so such a configuration fails at once with the count by
reason.

The package: ``window`` (what to size for), ``search`` (one configuration's minimum replicas),
``executors`` (local processes or Ray) and ``stage`` (the command's work and its outputs).
"""

from pipeline.common.defaults import DEFAULT_MAX_REPLICAS, DEFAULT_WARMUP_S, DEFAULT_WINDOW_S
from pipeline.plan.search import (
    Candidate,
    CandidateResult,
    Evaluation,
    Task,
    candidate_fleet,
    evaluate,
    min_replicas,
    search_candidate,
)
from pipeline.plan.stage import PlanOptions, PlanResult, candidates, pareto_front, plan
from pipeline.plan.window import Window, select_window

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_WARMUP_S",
    "DEFAULT_WINDOW_S",
    "Candidate",
    "CandidateResult",
    "Evaluation",
    "PlanOptions",
    "PlanResult",
    "Task",
    "Window",
    "candidate_fleet",
    "candidates",
    "evaluate",
    "min_replicas",
    "pareto_front",
    "plan",
    "search_candidate",
    "select_window",
]
