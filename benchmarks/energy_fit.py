"""Fit the power model's draws (pipeline/catalog/power.toml) on the ML.ENERGY v3 batch sweeps and
report energy-per-output-token errors on the held-out rows; check against Argonne's
LLM-Inference-Bench power table.

    ROOFTRACE_SHARED_DATA=/path/to/shared python benchmarks/energy_fit.py          # prints the fit and the errors

Rows used: ML.ENERGY ``lm-arena-chat`` rows of catalog models whose deployment is plain tensor
parallelism (tensor_parallel = num_gpus) on H100 (h100-sxm) and B200 (b200). Held out: every row
of the models in HELD_OUT_MODELS, and every row at the batch sizes (max_num_seqs) in
HELD_OUT_BATCHES; the draws are fitted on the rest (per GPU, bounded least squares; idle_w and
max_w are fixed from their sources). Features, from the cost model's mean steady-state step
(decode batch = avg_batch_size at a context of PROMPT_TOKENS + half the mean output, with the
prompts' prefill spread over the steps): its MFU and MBU against the datasheet peaks and the
shares of its time in communication and in the fixed per-step overhead.

Energy per output token is reported two ways on the held-out rows:
- ``power``: predicted GPU power × GPUs / the row's measured output throughput (the power
  model's own error);
- ``replay``: predicted power × GPUs × the cost model's step time / tokens per step (what a replay
  computes: the power model and the step-time model together).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.costmodel.model import CostModel  # noqa: E402
from pipeline.costmodel.steps import StepBatch  # noqa: E402
from pipeline.economics.energy import BOUNDS, MAX_DRAW, load_power  # noqa: E402
from pipeline.replay.fleet import EngineSettings, FleetConfig, resolve  # noqa: E402

CATALOG = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-14B": "qwen3-14b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b",
    "meta-llama/Llama-3.1-405B-Instruct-FP8": "llama-3.1-405b",
}
GPUS = {"H100": "h100-sxm", "B200": "b200"}
DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
HELD_OUT_MODELS = ("qwen3-14b", "llama-3.3-70b")
HELD_OUT_BATCHES = (16, 128)
#: Mean prompt tokens assumed for LM Arena chat prompts (the files do not give input lengths).
PROMPT_TOKENS = 256.0
#: Batch sizes a replay runs (vLLM's default max_num_seqs is 256 on these GPUs): errors reported there.
REPLAY_BATCHES = 256


def _rows(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open() as f:
        for row in csv.DictReader(f):
            model = CATALOG.get(row["model_id"])
            if model is None or row["gpu_model"] not in GPUS or row["tensor_parallel"] != row["num_gpus"]:
                continue
            out.append(
                {
                    "model": model,
                    "gpu": GPUS[row["gpu_model"]],
                    "dtype": DTYPES[row["weight_precision"]],
                    "tp": int(row["num_gpus"]),
                    "batch": int(row["max_num_seqs"]),
                    "avg_batch": float(row["avg_batch_size"]),
                    "out_len": float(row["avg_output_len"]),
                    "throughput": float(row["output_throughput_tokens_per_sec"]),
                    "power_w": float(row["avg_power_watts_per_gpu"]),
                    "j_per_token": float(row["energy_per_token_joules"]),
                }
            )
    return out


_MODELS: dict[tuple[str, str, str, int, int], CostModel] = {}


def cost_model(model: str, gpu: str, dtype: str, tp: int, max_len: int = 8192) -> CostModel:
    key = (model, gpu, dtype, tp, max_len)
    if key not in _MODELS:
        cfg = FleetConfig(
            name="fit",
            model=model,
            hardware=gpu,
            tp=tp,
            weight_dtype=dtype,
            engine=EngineSettings(max_model_len=max_len),
        )
        _MODELS[key] = CostModel.of(resolve(cfg))
    return _MODELS[key]


def steady_step(cm: CostModel, batch: float, prompt: float, out_len: float) -> dict[str, float]:
    """The mean step of a server kept full at ``batch`` requests of ``prompt`` in / ``out_len``
    out: ``batch`` decodes at the mean context, plus the prompts' prefill spread over the steps
    (batch × prompt / out_len tokens a step, in batch / out_len sequences)."""
    pre = batch * prompt / out_len
    seqs = batch / out_len

    def one(x: float) -> np.ndarray[Any, Any]:
        return np.array([float(x)])

    step = StepBatch(
        one(pre),
        one(seqs),
        one(seqs * prompt * (prompt + 1) / 2),
        one(pre),
        one(batch),
        one(batch * (prompt + out_len / 2)),
    )
    return features(cm(step))


def features(c: Any) -> dict[str, float]:
    """The power model's inputs of one priced step (a StepCost of one row)."""
    total = float(c.compute_s[0] + c.memory_s[0] + c.comm_s[0] + c.overhead_s[0])
    return {
        "time_s": float(c.time_s[0]),
        "compute": float(c.mfu[0]),
        "memory": float(c.mbu[0]),
        "communication": float(c.comm_s[0]) / total,
        "overhead": float(c.overhead_s[0]) / total,
    }


def predict_w(spec: Any, draw: dict[str, float], r: dict[str, Any]) -> float:
    """Power of one GPU (W) at a row's features with the given draws."""
    return float(spec.idle_w + (spec.max_w - spec.idle_w) * min(1.0, sum(draw[k] * r[k] for k in BOUNDS)))


def featured_rows(base: Path, gpus: tuple[str, ...] = tuple(GPUS.values())) -> list[dict[str, Any]]:
    """The ML.ENERGY rows used, with the cost model's features and whether each is held out."""
    rows = [r for r in _rows(base / "measurements" / "llm-serving-energy" / "mlenergy_v3_lm-arena-chat.csv")]
    rows = [r for r in rows if r["gpu"] in gpus]
    for r in rows:
        cm = cost_model(r["model"], r["gpu"], r["dtype"], r["tp"])
        r.update(steady_step(cm, r["avg_batch"], PROMPT_TOKENS, r["out_len"]))
        r["held_out"] = r["model"] in HELD_OUT_MODELS or r["batch"] in HELD_OUT_BATCHES
    return rows


def fit_draws(rows: list[dict[str, Any]], spec: Any) -> dict[str, float]:
    """The draws fitted on the rows not held out (bounded least squares on measured power)."""
    train = [r for r in rows if not r["held_out"]]
    x = np.array([[r[k] for k in BOUNDS] for r in train])
    y = np.array([(r["power_w"] - spec.idle_w) / (spec.max_w - spec.idle_w) for r in train])
    return dict(zip(BOUNDS, lsq_linear(x, y, bounds=(0.0, MAX_DRAW)).x, strict=True))


def heldout_errors(rows: list[dict[str, Any]], spec: Any, draw: dict[str, float]) -> dict[str, np.ndarray]:
    """Relative errors of J per output token on the held-out rows at batch <= REPLAY_BATCHES:
    ``power`` (predicted W x GPUs / measured throughput) and ``replay`` (with the cost model's step time)."""
    held = [r for r in rows if r["held_out"] and r["batch"] <= REPLAY_BATCHES]
    power = [predict_w(spec, draw, r) * r["tp"] / r["throughput"] / r["j_per_token"] - 1 for r in held]
    replay = [predict_w(spec, draw, r) * r["tp"] * r["time_s"] / r["avg_batch"] / r["j_per_token"] - 1 for r in held]
    return {"power": np.array(power), "replay": np.array(replay)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="the shared data folder (default: $ROOFTRACE_SHARED_DATA)")
    args = ap.parse_args()
    base = Path(args.data or os.environ.get("ROOFTRACE_SHARED_DATA") or "")
    if not base.is_dir():
        raise SystemExit("give --data or set ROOFTRACE_SHARED_DATA")
    rows = featured_rows(base)
    power = load_power()
    for gpu in sorted({r["gpu"] for r in rows}):
        spec = power[gpu]
        mine = [r for r in rows if r["gpu"] == gpu]
        train = [r for r in mine if not r["held_out"]]
        draw = fit_draws(mine, spec)
        print(
            f"{gpu}: fitted on {len(train)} rows ({sorted({r['model'] for r in train})}), draws "
            + ", ".join(f"{k} {v:.3f}" for k, v in draw.items())
        )
        print("  catalog now: " + ", ".join(f"{k} {spec.draw[k]:.3f}" for k in BOUNDS))
        for label, d in (("fitted", draw), ("catalog", dict(spec.draw))):
            errs = heldout_errors(mine, spec, d)
            ep, er = np.abs(errs["power"]), np.abs(errs["replay"])
            print(
                f"  [{label}] held-out rows (batch <= {REPLAY_BATCHES}): {ep.size}; J/output-token error "
                f"power-model mean |e| {ep.mean():.1%} max {ep.max():.1%}; replay (with step time) mean |e| "
                f"{er.mean():.1%} median {np.median(er):.1%} max {er.max():.1%}"
            )
        # the direction of the batch sweep: J/token at batch 8 over batch 64, measured vs predicted
        for model in sorted({r["model"] for r in mine}):
            by = {r["batch"]: r for r in mine if r["model"] == model and r["dtype"] == "bf16"}
            if 8 in by and 64 in by:
                meas = by[8]["j_per_token"] / by[64]["j_per_token"]
                pred = [
                    predict_w(spec, draw, by[b]) * by[b]["tp"] * by[b]["time_s"] / by[b]["avg_batch"] for b in (8, 64)
                ]
                print(
                    f"  {model} tp{by[8]['tp']}: J/token batch 8 / batch 64 measured {meas:.2f}, "
                    f"replay {pred[0] / pred[1]:.2f}"
                )
    argonne(base, power)


def argonne(base: Path, power: Any) -> None:
    """Argonne LLM-Inference-Bench Fig. 16 (vLLM, 1 GPU, 1024 in / 1024 out, static batches):
    mean GPU power predicted from a static batch's steps (one prefill, then 1024 decode steps)
    against the measured mean (the file's avg_power, read as mW)."""
    path = base / "measurements" / "argonne-llm-inference-bench" / "Plots" / "Fig_16_a_b" / "power_results.csv"
    models = {"meta-llama/Llama-2-7b-hf": "llama-2-7b", "meta-llama/Meta-Llama-3-8B": "llama-3.1-8b"}
    gpus = {"Nvidia H100 GPU": "h100-sxm", "Nvidia A100 GPU": "a100-80gb-sxm"}
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("Framework") == "vLLM" and r["Hardware"] in gpus]
    print("Argonne LLM-Inference-Bench Fig 16 (vLLM, 1 GPU, 1024/1024): mean power, predicted vs measured")
    for r in rows:
        gpu, model = gpus[r["Hardware"]], models.get(r["Model"])
        if model is None or gpu not in power:
            continue
        spec = power[gpu]
        cm = cost_model(model, gpu, "bf16", 1, 4096)
        b, n = float(r["Batch Size"]), 1024.0
        energy = time = 0.0
        # prefill of the batch in chunks of 8192 tokens, then n - 1 decode steps at growing context
        for chunk in range(int(b * n // 8192) + (1 if (b * n) % 8192 else 0)):
            toks = min(8192.0, b * n - chunk * 8192.0)
            seqs = toks / n
            c = cm(StepBatch(*(np.array([v]) for v in (toks, seqs, seqs * n * (n + 1) / 2, toks, 0.0, 0.0))))
            p = predict_w(spec, dict(spec.draw), features(c))
            energy += p * c.time_s[0]
            time += c.time_s[0]
        ctx = np.arange(n + 1, 2 * n)
        c = cm(StepBatch(*(np.zeros(ctx.size) for _ in range(4)), np.full(ctx.size, b), b * ctx))
        t = np.maximum(c.time_s, 1e-300)
        total = c.compute_s + c.memory_s + c.comm_s + c.overhead_s
        p = spec.power_w(c.mfu, c.mbu, c.comm_s / total, c.overhead_s / total)
        energy += float((p * t).sum())
        time += float(c.time_s.sum())
        meas = float(r["avg_power"]) / 1000.0
        pred = energy / time
        print(
            f"  {gpu} {model} batch {int(b):>3}: predicted {pred:6.1f} W, "
            f"measured {meas:6.1f} W ({pred / meas - 1:+.1%})"
        )


if __name__ == "__main__":
    main()
