"""Model names in logs (pipeline/catalog/names.py): which catalog model a logged ``model`` names,
the project's ``[models]`` aliases, and every place a logged name meets a catalog id (plan's
traffic, replay's MODEL MIX warning, the prefix-cache isolation key of classify and replay)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_accounting import requests_frame

from pipeline.catalog.names import CatalogName, NameMatch, canonical_model_names, resolve_model_name
from pipeline.classify import prefix as P
from pipeline.classify.accounting import Capacity, ClassifyOptions, account
from pipeline.cli import main
from pipeline.common.errors import ConfigError
from pipeline.ingest.project import find_project

ROOT = Path(__file__).resolve().parent.parent
L70 = "meta-llama/Llama-3.1-70B-Instruct"

# (as logged, catalog model, rule): real names from vLLM, LiteLLM, gateways and quantized copies
REAL_NAMES = [
    ("llama-3.1-70b", "llama-3.1-70b", "id"),
    ("LLAMA-3.1-70B", "llama-3.1-70b", "id"),
    ("azure/llama-3.1-70b", "llama-3.1-70b", "id"),
    ("meta-llama/Llama-3.1-70B", "llama-3.1-70b", "hf_id"),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b", "hf_id"),
    ("hosted_vllm/meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b", "hf_id"),
    ("qwen/qwen3-8b", "qwen3-8b", "hf_id"),
    ("openai/gpt-oss-120b", "gpt-oss-120b", "hf_id"),
    ("hosted_vllm/openai/gpt-oss-120b", "gpt-oss-120b", "hf_id"),
    (L70, "llama-3.1-70b", "variant"),
    ("hosted_vllm/meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", "variant"),
    ("openai/meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", "variant"),
    ("openrouter/meta-llama/llama-3.1-70b-instruct", "llama-3.1-70b", "variant"),
    ("together_ai/meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo", "llama-3.1-70b", "variant"),
    ("fireworks_ai/accounts/fireworks/models/llama-v3p1-70b-instruct", "llama-3.1-70b", "variant"),
    ("vertex_ai/meta/llama-3.1-70b-instruct-maas", "llama-3.1-70b", "variant"),
    ("Llama-3.1-70B-Instruct-FP8", "llama-3.1-70b", "variant"),
    ("RedHatAI/Llama-3.1-70B-Instruct-FP8", "llama-3.1-70b", "variant"),
    ("neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w4a16", "llama-3.1-70b", "variant"),
    ("bedrock/meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", "variant"),
    ("deepinfra/meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b", "variant"),
    ("unsloth/Llama-3.1-8B-Instruct-bnb-4bit", "llama-3.1-8b", "variant"),
    ("groq/llama-3.3-70b-versatile", "llama-3.3-70b", "variant"),
    ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b", "variant"),
    ("codellama/CodeLlama-7b-Instruct-hf", "codellama-7b", "variant"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b", "variant"),
    ("Qwen/Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b", "variant"),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "qwen2.5-7b", "variant"),
    ("Qwen/Qwen3-8B-FP8", "qwen3-8b", "variant"),
    ("Qwen/Qwen3-30B-A3B-FP8", "qwen3-30b-a3b", "variant"),
    ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3", "variant"),
    # names that are no catalog model: kept as logged
    ("unknown", None, "none"),
    ("gpt-4o", None, "none"),
    ("openai/gpt-4o", None, "none"),
    ("mistralai/Mistral-7B-Instruct-v0.3", None, "none"),  # v0.3 is not the catalog's v0.1
    ("google/gemma-2-9b-it", None, "none"),
    ("llama-70b", None, "none"),
    ("", None, "none"),
    ("///", None, "none"),
    ("x/" * 300 + "Llama-3.1-70B", None, "none"),  # past MAX_NAME_CHARS: no catalog model's name
    ("Llama-3.1-70B" + "-FP8" * 9, None, "none"),  # past MAX_DROPPED suffixes
    ("Llama-3.1-70B" + "-FP8" * 8, "llama-3.1-70b", "variant"),
]


@pytest.mark.parametrize(("logged", "model", "how"), REAL_NAMES)
def test_real_model_names_resolve_to_the_catalog(logged: str, model: str | None, how: str) -> None:
    got = resolve_model_name(logged, aliases={})
    assert (got.model, got.how) == (model, how), got.describe()


def test_the_match_says_what_was_read_past() -> None:
    got = resolve_model_name("hosted_vllm/meta-llama/Meta-Llama-3.1-70B-Instruct-FP8", aliases={})
    assert got.describe() == (
        "'hosted_vllm/meta-llama/Meta-Llama-3.1-70B-Instruct-FP8' -> llama-3.1-70b (variant; "
        "'hosted_vllm/meta-llama/' read past; 'Meta-Llama-' read as 'Llama-'; dropped '-FP8', '-Instruct')"
    )
    assert resolve_model_name("meta-llama/Llama-3.1-70B", aliases={}).describe() == (
        "'meta-llama/Llama-3.1-70B' -> llama-3.1-70b (hf_id)"
    )
    assert resolve_model_name("gpt-4o", aliases={}).describe() == "'gpt-4o' names no catalog model"


# a catalog where a variant-free name fits two models: never a guess
TWO = [
    CatalogName("foo-7b-instruct", "acme/Foo-7B-Instruct"),
    CatalogName("foo-7b-chat", "acme/Foo-7B-Chat"),
    CatalogName("bar", "acme/Bar-7B"),
    CatalogName("bar-other", "other/Bar-7B"),
]


@pytest.mark.parametrize(
    ("logged", "model", "how", "candidates"),
    [
        ("acme/Foo-7B-Instruct", "foo-7b-instruct", "hf_id", ()),
        ("vllm/acme/Foo-7B-Chat-AWQ", "foo-7b-chat", "variant", ()),  # '-AWQ' dropped: one model
        ("Foo-7B-Instruct-FP8", "foo-7b-instruct", "variant", ()),
        ("Foo-7B", None, "ambiguous", ("foo-7b-chat", "foo-7b-instruct")),
        ("acme/Foo-7B-FP8", None, "ambiguous", ("foo-7b-chat", "foo-7b-instruct")),
        ("other/Bar-7B", "bar-other", "hf_id", ()),  # the whole Hugging Face id decides
        ("acme/Bar-7B", "bar", "hf_id", ()),
        ("mirror/Bar-7B", None, "ambiguous", ("bar", "bar-other")),
        ("mirror/bar", "bar", "id", ()),  # a catalog id behind a prefix
    ],
)
def test_a_name_that_fits_two_models_resolves_to_none_and_names_both(
    logged: str, model: str | None, how: str, candidates: tuple[str, ...]
) -> None:
    got = resolve_model_name(logged, TWO, aliases={})
    assert (got.model, got.how, got.candidates) == (model, how, candidates)
    if how == "ambiguous":
        assert got.describe().endswith(
            "could be " + ", ".join(candidates) + ": not resolved (a [models] alias decides)"
        )


def test_aliases_come_first_and_decide_an_ambiguous_name() -> None:
    aliases = {"Foo-7B": "foo-7b-chat", "prod-70b": "llama-3.1-70b"}
    assert resolve_model_name("Foo-7B", TWO, aliases) == NameMatch("Foo-7B", "foo-7b-chat", "alias")
    got = resolve_model_name("hosted_vllm/PROD-70B", aliases=aliases)
    assert (got.model, got.how) == ("llama-3.1-70b", "alias")
    # an alias wins over the catalog's own reading of the name
    assert resolve_model_name(L70, aliases={L70: "llama-3.3-70b"}).model == "llama-3.3-70b"


def test_canonical_names_keep_what_resolves_to_nothing() -> None:
    names = ["llama-3.1-70b", L70, "hosted_vllm/" + L70, "unknown", "gpt-4o"]
    assert canonical_model_names(names, aliases={}) == {
        "llama-3.1-70b": "llama-3.1-70b",
        L70: "llama-3.1-70b",
        "hosted_vllm/" + L70: "llama-3.1-70b",
        "unknown": "unknown",
        "gpt-4o": "gpt-4o",
    }


# --------------------------------------------------------------------------------------------
# [models] in rooftrace.toml


def test_project_models_table_is_read_and_checked(tmp_path: Path) -> None:
    project = tmp_path / "rooftrace.toml"
    project.write_text('[models]\n"my-70b-deployment" = "llama-3.1-70b"\n"team/Small" = "llama-3.1-8b"\n')
    assert dict(find_project(tmp_path).models) == {"my-70b-deployment": "llama-3.1-70b", "team/Small": "llama-3.1-8b"}
    (tmp_path / "sub").mkdir()
    assert dict(find_project(tmp_path / "sub").models)["my-70b-deployment"] == "llama-3.1-70b"
    project.write_text('store = "s"\n')
    assert dict(find_project(tmp_path).models) == {}
    bad = {
        '[models]\n"my-70b" = "llama-9b"\n': "[models] 'my-70b' = 'llama-9b': no catalog model 'llama-9b'; known: [",
        '[models]\n"my-70b" = 7\n': "[models] 'my-70b' must name a catalog model id (text), got 7",
        '[models]\n"" = "llama-3.1-70b"\n': "[models] '': an alias must be a model name as logged",
        'models = "llama-3.1-70b"\n': "models must be a table of aliases",
    }
    for text, message in bad.items():
        project.write_text(text)
        with pytest.raises(ConfigError) as err:
            find_project(tmp_path)
        line = str(err.value)
        assert line.startswith(f"{project}: ") and message in line and "\n" not in line, line


def test_a_bad_alias_is_one_error_line_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rooftrace.toml").write_text('[models]\n"my-70b" = "llama-9b"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROOFTRACE_STORE", raising=False)
    res = CliRunner().invoke(main, ["replay"])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    assert f"{tmp_path / 'rooftrace.toml'}: [models] 'my-70b' = 'llama-9b': no catalog model" in res.output


# --------------------------------------------------------------------------------------------
# the prefix-cache isolation key: two spellings of one deployment are one domain


def test_isolation_salt_of_a_catalog_id_is_unchanged_and_spellings_share_it() -> None:
    frame = requests_frame(
        [
            {"t": 0, "model": "llama-3.1-70b", "tenant": "a", "recorded_input_tokens": 8},
            {"t": 1, "model": L70, "tenant": "a", "recorded_input_tokens": 8},
            {"t": 2, "model": "hosted_vllm/" + L70, "tenant": "a", "recorded_input_tokens": 8},
            {"t": 3, "model": "gpt-4o", "tenant": "a", "recorded_input_tokens": 8},
            {"t": 4, "model": "unknown", "tenant": None, "recorded_input_tokens": 8},
        ]
    )
    salts = P.isolation_salts(frame, P.DEFAULT_ISOLATION).tolist()
    cols = list(P.DEFAULT_ISOLATION)

    def before(model: str, tenant: str | None) -> int:  # the salt as it was computed before names resolved
        values = {"model": model, "adapter": None, "tenant": tenant}
        return P.key64(json.dumps([[c, values[c]] for c in cols]))

    assert salts == [
        before("llama-3.1-70b", "a"),
        before("llama-3.1-70b", "a"),
        before("llama-3.1-70b", "a"),
        before("gpt-4o", "a"),
        before("unknown", None),
    ]
    assert len(set(salts)) == 3


def _two_spellings(second: str) -> list[dict[str, object]]:
    # 4-token blocks: the second request repeats the first's two full blocks (8 tokens)
    return [
        {"t": 10, "model": "llama-3.1-70b", "recorded_input_tokens": 10, "prefix_block_hashes": [1, 2, 3],
         "prefix_block_size": 4},
        {"t": 50, "model": second, "recorded_input_tokens": 12, "prefix_block_hashes": [1, 2, 9],
         "prefix_block_size": 4},
    ]  # fmt: skip


def test_classify_counts_one_cache_for_two_spellings_of_one_deployment() -> None:
    same = account(requests_frame(_two_spellings("hosted_vllm/" + L70)))
    assert same.requests["simulated_cache_hit_tokens"].to_list() == [0, 8]
    assert same.requests["model"].to_list() == ["llama-3.1-70b", "hosted_vllm/" + L70]  # kept as logged
    assert same.curve["model"].unique().sort().to_list() == ["llama-3.1-70b"]  # one cache, one curve
    other = account(requests_frame(_two_spellings("gpt-4o")))
    assert other.requests["simulated_cache_hit_tokens"].to_list() == [0, 0]
    # a cache sized in bytes reads the catalog's KV bytes per token through the resolved name:
    # llama-3.1-70b is 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 327,680 B/token, so
    # 4 blocks of 4 tokens need 5,242,880 bytes
    sized = account(requests_frame(_two_spellings(L70)), ClassifyOptions(capacity=Capacity(bytes=4 * 4 * 327_680)))
    assert sized.requests["simulated_cache_hit_tokens"].to_list() == [0, 8]
    assert sized.summary["capacity_blocks"] == {"llama-3.1-70b": 4}


# --------------------------------------------------------------------------------------------
# replay and plan on a log that names the model by its Hugging Face id: no flags


def _fleet(path: Path, model: str, tp: int) -> Path:
    text = (ROOT / "fleets" / "default.toml").read_text()
    text = text.replace('model = "llama-3.1-8b"', f'model = "{model}"').replace("tp = 1", f"tp = {tp}")
    text = text.replace("replicas = 2", "replicas = 1").replace("max_model_len = 16384", "max_model_len = 131072")
    path.write_text(text.replace('name = "default"', f'name = "{model.replace(".", "")}"'))
    return path


@pytest.fixture(scope="module")
def hf_named_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gateway log naming llama-3.1-70b as vLLM and LiteLLM do (written once, read only)."""
    log = tmp_path_factory.mktemp("hf_named") / "gateway.jsonl.gz"
    models = f"{L70},hosted_vllm/{L70}"
    args = ["synth", "--format", "openai", "--requests", "240", "--hours", "0.05", "--models", models]
    res = CliRunner().invoke(main, [*args, "--seed", "3", "--out", str(log)])
    assert res.exit_code == 0, res.output
    return log


@pytest.fixture
def hf_named_project(hf_named_log: Path, tmp_path: Path) -> Path:
    """A project of its own whose fleet serves llama-3.1-70b and whose store holds that log."""
    _fleet(tmp_path / "l70.toml", "llama-3.1-70b", 4)
    (tmp_path / "rooftrace.toml").write_text('store = "store"\nfleet = "l70.toml"\n')
    res = CliRunner().invoke(main, ["ingest", str(hf_named_log), "--store", str(tmp_path / "store")])
    assert res.exit_code == 0, res.output
    return tmp_path


def test_replay_of_a_log_naming_the_hf_id_serves_it_as_the_catalog_model(
    hf_named_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(hf_named_project)
    monkeypatch.delenv("ROOFTRACE_STORE", raising=False)
    res = CliRunner().invoke(main, ["replay", "--json"])  # no flags: the project's 70b fleet
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    config = json.loads((Path(doc["run_dir"]) / "config.json").read_text())
    assert config["resolved"]["fleet"]["model"] == "llama-3.1-70b"
    assert doc["requests"] == doc["finished"] == 240
    assert not [w for w in doc["health"]["warnings"] if "MODEL MIX" in w], doc["health"]["warnings"]
    assert "MODEL MIX" not in res.stderr
    # the same day on the 8b fleet: a mix, each logged name said with the model it is
    small = _fleet(hf_named_project / "l8.toml", "llama-3.1-8b", 1)
    res = CliRunner().invoke(main, ["replay", "--fleet", str(small), "--json"])
    assert res.exit_code == 0, res.output
    mix = [w for w in json.loads(res.stdout)["health"]["warnings"] if "MODEL MIX" in w]
    assert len(mix) == 1 and mix[0].startswith("MODEL MIX: 240 of 240 requests (100")
    assert f"hosted_vllm/{L70} = llama-3.1-70b: " in mix[0] and f"{L70} = llama-3.1-70b: " in mix[0]


def test_plan_picks_the_hf_named_requests_without_traffic_model(
    hf_named_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(hf_named_project)
    monkeypatch.delenv("ROOFTRACE_STORE", raising=False)
    args = ["plan", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4", "--window", "day"]
    res = CliRunner().invoke(main, [*args, "--jobs", "1", "--slo", "batch", "--json"])
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    names = doc["traffic_names"]
    assert set(names) == {L70, f"hosted_vllm/{L70}"} and sum(names.values()) == 240
    assert doc["traffic_model"] == "llama-3.1-70b" and doc["window"]["measured_requests"] == 240
    assert f"note: traffic for llama-3.1-70b: {names[L70]:,} logged as '{L70}'" in res.stderr
    # another catalog model: no requests, and the names there said with what they resolve to
    res = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "1"])
    assert res.exit_code == 1
    assert "no requests for model 'llama-3.1-8b'" in res.output and f"'{L70} (= llama-3.1-70b)'" in res.output


def test_plan_help_example_runs_on_the_demo_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan --help`'s example, as printed, on the store `rooftrace demo` writes (its log only)."""
    from pipeline.ingest.project import sample_dir
    from pipeline.publish.nightly import DEMO_LOG

    text = CliRunner().invoke(main, ["plan", "--help"]).output
    example = next(line.strip() for line in text.splitlines() if line.strip().startswith("rooftrace plan "))
    argv = example.split()[1:]
    assert argv[:3] == ["plan", "--model", "llama-3.1-8b"], example
    monkeypatch.chdir(ROOT)  # "in the checkout": --fleet fleets/demo.toml
    store = tmp_path / "store"
    res = CliRunner().invoke(main, ["ingest", str(sample_dir() / DEMO_LOG), "--store", str(store)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, [*argv, "--store", str(store), "--jobs", "1", "--hardware", "h100-sxm", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["chosen"] is not None and doc["traffic_names"] == {"meta-llama/Llama-3.1-8B-Instruct": 3000}
    assert np.isfinite(doc["chosen"]["usd_per_day"])


def test_catalog_resolve_says_what_a_logged_name_stands_for() -> None:
    from click.testing import CliRunner

    from pipeline.cli import main

    ok = CliRunner().invoke(main, ["catalog", "resolve", "hosted_vllm/meta-llama/Llama-3.1-70B-Instruct", "--json"])
    assert ok.exit_code == 0, ok.output
    (doc,) = json.loads(ok.stdout)
    assert (doc["logged"], doc["model"]) == ("hosted_vllm/meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b")
    assert "'hosted_vllm/meta-llama/' read past" in doc["detail"] and "-Instruct" in doc["detail"]
    # a name that names no model: said, exit 1; a terminal escape in it is shown escaped
    bad = CliRunner().invoke(main, ["catalog", "resolve", "llama-3.1-8b", "gpt-4o\x1b]0;x\x07"])
    assert bad.exit_code == 1
    lines = bad.stdout.splitlines()
    assert lines[0] == "'llama-3.1-8b' -> llama-3.1-8b (id)"
    assert "names no catalog model" in lines[1] and "\x1b" not in lines[1]
