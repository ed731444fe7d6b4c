"""Hostile input to ``synth``, ``calibrate`` and ``catalog import-hf``: one error line naming the
option or field and what is allowed, a non-zero exit, no traceback and nothing written."""

from __future__ import annotations

import csv
import importlib
import json
import math
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pipeline.cli import main
from pipeline.common.errors import ConfigError
from tests.test_fuzz_cli import SPLITWISE_ROW


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(main, args)


def error_line(result: Result) -> str:
    """The one error line of a failed command (Click's usage errors say ``Error:``, rooftrace's
    ``error:``); fails unless there is exactly one and no traceback."""
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def written(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# --- synth: option bounds -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--requests", "99999999999999999999", "1<=x<=10000000"),  # was an OverflowError
        ("--requests", "1000000000000", "1<=x<=10000000"),  # was TiB of memory
        ("--requests", "0", "1<=x<=10000000"),
        ("--tenants", "99999999999999", "1<=x<=100000"),  # was TiB of memory
        ("--seed", "-1", "0<=x<=9223372036854775807"),  # was numpy's ValueError
        ("--seed", str(2**63), "0<=x<=9223372036854775807"),
        ("--hours", "nan", "not a finite number"),  # was a polars error
        ("--hours", "1e308", "0.001<=x<=8784"),
        ("--hours", "inf", "0.001<=x<=8784"),
        ("--hours", "0", "0.001<=x<=8784"),
        ("--cv", "inf", "0.05<=x<=20"),  # was a ZeroDivisionError
        ("--cv", "1e308", "0.05<=x<=20"),
        ("--cv", "nan", "not a finite number"),
        ("--cv", "-inf", "0.05<=x<=20"),
    ],
)
def test_synth_option_out_of_range(tmp_path: Path, option: str, value: str, says: str) -> None:
    result = invoke(["synth", "--requests", "50", option, value, "--out", str(tmp_path / "x.jsonl")])
    line = error_line(result)
    assert option in line and says in line, line
    assert written(tmp_path) == []


def test_synth_bounds_of_the_cli_are_the_library_s() -> None:
    cli = importlib.import_module("pipeline.cli.synth")
    lib = importlib.import_module("pipeline.synth.generate")  # (pipeline.synth.generate is also a function)

    assert cli.MAX_REQUESTS == lib.MAX_REQUESTS
    assert cli.MAX_TENANTS == lib.MAX_TENANTS
    assert cli.MAX_HOURS * 3600.0 == lib.MAX_DURATION_S
    assert (cli.MIN_CV, cli.MAX_CV) == (lib.MIN_CV, lib.MAX_CV)
    assert cli.MAX_SEED == lib.MAX_SEED


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("requests", 10**20, "requests must be an integer in 1..10,000,000"),
        ("requests", 0, "requests must be an integer in 1..10,000,000"),
        pytest.param("requests", 10**5000, "a number too long to show", id="requests-5000-digits"),
        ("tenants", 10**14, "tenants must be an integer in 1..100,000"),
        ("seed", -1, "seed must be an integer in 0..9,223,372,036,854,775,807"),
        ("duration_s", math.nan, "duration_s must be a finite number"),
        ("duration_s", 1e308, "duration_s must be a finite number"),
        pytest.param("duration_s", 10**400, "duration_s must be a finite number", id="duration_s-int-past-float"),
        ("cv", math.inf, "cv must be a finite number in 0.05..20"),
        ("cv", 0.0, "cv must be a finite number in 0.05..20"),
        ("date", "2025-02-30", "date must be YYYY-MM-DD"),
    ],
)
def test_synth_config_refuses_values_out_of_range(field: str, value: object, says: str) -> None:
    from pipeline.synth import SynthConfig

    with pytest.raises(ConfigError, match=says):
        SynthConfig(**{field: value})  # type: ignore[arg-type]


def test_synth_extreme_values_inside_the_bounds_work(tmp_path: Path) -> None:
    for i, extra in enumerate(
        (
            ["--cv", "20"],
            ["--cv", "0.05", "--hours", "8784"],
            ["--hours", "0.001", "--tenants", "100000"],
            ["--seed", str(2**63 - 1)],
        )
    ):
        out = tmp_path / f"{i}.jsonl"
        result = invoke(["synth", "--requests", "40", *extra, "--out", str(out)])
        assert result.exit_code == 0, (extra, result.output)
        assert len(out.read_text().splitlines()) == 40


def test_synth_out_of_memory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.synth

    def no_memory(cfg: object) -> None:
        raise MemoryError

    monkeypatch.setattr(pipeline.synth, "generate", no_memory)
    line = error_line(invoke(["synth", "--requests", "10000000", "--out", str(tmp_path / "x.jsonl")]))
    assert line == "error: synth: out of memory for 10,000,000 requests (about 1.4 KiB each); lower --requests"
    assert written(tmp_path) == []


def test_synth_arrivals_past_2100(tmp_path: Path) -> None:
    """Sessions whose later turns run past the last day ingest accepts: refused, not a log whose
    last rows are quarantined (it was a log of '+10000-...' times at 9999-12-31)."""
    out = tmp_path / "x.jsonl"
    line = error_line(
        invoke(
            ["synth", "--requests", "5000", "--flat", "--date", "2099-12-31", "--hours", "23.999", "--out", str(out)]
        )
    )
    assert "run past 2100-01-01 UTC" in line and "hours" in line
    assert written(tmp_path) == []


# --- outputs under a regular file ----------------------------------------------------------------


@pytest.mark.parametrize("fmt, name", [("openai", "x.jsonl"), ("csv", "sub/x.csv")])
def test_synth_out_under_a_file(tmp_path: Path, fmt: str, name: str) -> None:
    """A parent of --out that is a regular file (it was a FileExistsError traceback)."""
    (tmp_path / "storefile").write_text("keep")
    out = tmp_path / "storefile" / name
    line = error_line(invoke(["synth", "--requests", "20", "--format", fmt, "--out", str(out)]))
    assert line == f"error: cannot write {out}: {tmp_path / 'storefile'} is a file, not a folder"
    assert written(tmp_path) == ["storefile"] and (tmp_path / "storefile").read_text() == "keep"


#: One Splitwise perf_model.csv row; four prompt sizes make a table calibrate fits.


@pytest.fixture
def splitwise_csv(tmp_path: Path) -> Path:
    path = tmp_path / "meas" / "perf_model.csv"
    path.parent.mkdir()
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, list(SPLITWISE_ROW))
        writer.writeheader()
        for k in (1, 2, 3, 4):
            writer.writerow(dict(SPLITWISE_ROW, prompt_size=512 * k, prompt_time=196.25 * k))
    return path


@pytest.mark.parametrize("name", ["x.toml", "sub/x.toml"])
def test_calibrate_out_under_a_file(tmp_path: Path, splitwise_csv: Path, name: str) -> None:
    (tmp_path / "storefile").write_text("keep")
    out = tmp_path / "storefile" / name
    args = ["calibrate", "--measurements", str(splitwise_csv), "--hardware", "a100-80gb-sxm", "--out", str(out)]
    line = error_line(invoke(args))
    assert line == f"error: cannot write {out}: {tmp_path / 'storefile'} is a file, not a folder"
    assert (tmp_path / "storefile").read_text() == "keep"
    # the same table, written where it can be: an entry the catalog reads back
    good = tmp_path / "fitted.toml"
    args[-1] = str(good)
    assert invoke(args).exit_code == 0
    assert invoke(["fit", "--model", "llama-3.1-8b", "--hardware", str(good)]).exit_code == 0


def test_calibrate_profiles_out_under_a_file(tmp_path: Path) -> None:
    """The profile-building path already answered one line; kept so."""
    from test_measured_fleets import _tiny_aiconfigurator

    src = _tiny_aiconfigurator(tmp_path / "meas")
    (tmp_path / "storefile").write_text("keep")
    line = error_line(invoke(["calibrate", "--measurements", str(src), "--out", str(tmp_path / "storefile" / "p")]))
    assert "cannot write the profile" in line


# --- catalog import-hf ---------------------------------------------------------------------------

TINY_HF = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "cfg" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(dict(TINY_HF, intermediate_size=128)))
    return path


def test_import_hf_out_needs_hf_id(tmp_path: Path, tiny_config: Path) -> None:
    """Without --hf-id the entry has an empty hf_id the catalog refuses: not written (it was)."""
    out = tmp_path / "out" / "tiny.toml"
    line = error_line(invoke(["catalog", "import-hf", str(tiny_config), "--out", str(out)]))
    assert "--hf-id" in line and "hf_id" in line
    assert not out.parent.exists()
    # printing the entry (no --out) stays a preview
    result = invoke(["catalog", "import-hf", str(tiny_config), "--name", "tiny"])
    assert result.exit_code == 0 and 'name = "tiny"' in result.output


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("hidden_size", 10**26, "hidden_size must be an integer in 0..16,777,216"),
        ("vocab_size", 2**24 + 1, "vocab_size must be an integer in 0..16,777,216"),
        ("max_position_embeddings", 2**31, "max_position_embeddings must be an integer in 0..2,147,483,647"),
    ],
)
def test_import_hf_sizes_are_bounded(tmp_path: Path, tiny_config: Path, key: str, value: int, says: str) -> None:
    tiny_config.write_text(json.dumps(dict(TINY_HF, intermediate_size=128, **{key: value})))
    out = tmp_path / "m.toml"
    line = error_line(invoke(["catalog", "import-hf", str(tiny_config), "--hf-id", "org/m", "--out", str(out)]))
    assert says in line, line
    assert not out.exists()


def test_import_hf_json_number_past_int_digit_limit(tmp_path: Path, tiny_config: Path) -> None:
    tiny_config.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    line = error_line(invoke(["catalog", "import-hf", str(tiny_config), "--hf-id", "org/m"]))
    assert str(tiny_config) in line and "invalid JSON" in line


@pytest.mark.parametrize("name", ["../../evil", "a/b", "", ".hidden", "x" * 65, "sp ace"])
@pytest.mark.parametrize("out", [False, True])
def test_import_hf_name_must_be_a_catalog_name(tmp_path: Path, tiny_config: Path, name: str, out: bool) -> None:
    args = ["catalog", "import-hf", str(tiny_config), "--hf-id", "org/m", "--name", name]
    if out:
        args += ["--out", str(tmp_path / "dest" / "m.toml")]
    line = error_line(invoke(args))
    assert f"name {name!r} must be 1-64 letters, digits" in line
    assert not (tmp_path / "dest").exists()


def test_import_hf_name_taken_from_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "My Model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(TINY_HF, intermediate_size=128)))
    line = error_line(invoke(["catalog", "import-hf", str(folder / "config.json")]))
    assert "name 'my model' must be" in line and "pass a name" in line


def test_import_hf_out_under_a_file(tmp_path: Path, tiny_config: Path) -> None:
    (tmp_path / "storefile").write_text("keep")
    out = tmp_path / "storefile" / "m.toml"
    line = error_line(invoke(["catalog", "import-hf", str(tiny_config), "--hf-id", "org/m", "--out", str(out)]))
    assert line == f"error: cannot write {out}: {tmp_path / 'storefile'} is a file, not a folder"


def test_import_hf_in_the_models_folder_is_named_after_the_entry(
    tmp_path: Path, tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.catalog import entries

    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setattr(entries, "models_dir", lambda: models)
    args = ["catalog", "import-hf", str(tiny_config), "--hf-id", "org/m", "--name", "tiny"]
    line = error_line(invoke([*args, "--out", str(models / "other.toml")]))
    assert "must be tiny.toml" in line
    assert written(models) == []
    assert invoke([*args, "--out", str(models / "tiny.toml")]).exit_code == 0
    assert written(models) == ["tiny.toml"]


def test_import_hf_text_with_control_characters_round_trips(tmp_path: Path, tiny_config: Path) -> None:
    """A quote, backslash, newline or DEL in --hf-id or a config value is escaped: the written
    entry is TOML that loads back (a raw newline made a file the catalog could not parse)."""
    hf_id = 'org/a"b\\c\nd\x7f'
    tiny_config.write_text(
        json.dumps(dict(TINY_HF, intermediate_size=128, model_type="x\ty", quantization_config={"a b": "fp8"}))
    )
    out = tmp_path / "m.toml"
    result = invoke(["catalog", "import-hf", str(tiny_config), "--hf-id", hf_id, "--name", "m", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = tomllib.loads(out.read_text())
    assert doc["hf_id"] == hf_id and doc["config"]["model_type"] == "x\ty"
    assert doc["config"]["quantization_config"] == {"a b": "fp8"}
    assert invoke(["fit", "--model", str(out), "--hardware", "h100-sxm", "--context", "128"]).exit_code == 0


@pytest.mark.parametrize("depth", [300, 900])
def test_import_hf_deeply_nested_value(tmp_path: Path, tiny_config: Path, depth: int) -> None:
    """A list nested a few hundred deep reads as JSON: written if the catalog reads it back, else
    one line (it was a RecursionError while writing the TOML)."""
    text = json.dumps(dict(TINY_HF, intermediate_size=128))
    tiny_config.write_text(text[:-1] + ', "architectures": ' + "[" * depth + "]" * depth + "}")
    out = tmp_path / "m.toml"
    result = invoke(["catalog", "import-hf", str(tiny_config), "--hf-id", "org/m", "--out", str(out)])
    if result.exit_code == 0:
        assert invoke(["fit", "--model", str(out), "--hardware", "h100-sxm", "--context", "128"]).exit_code == 0
    else:
        assert "nested too deeply" in error_line(result) and not out.exists()


@pytest.mark.parametrize("name", ["../hardware/h100-sxm", "../../../../etc/evil", "a/b"])
def test_catalog_names_never_leave_the_catalog(name: str) -> None:
    line = error_line(invoke(["fit", "--model", name, "--hardware", "h100-sxm"]))
    assert line.startswith(f"error: no model named {name!r}") and "1-64 letters" in line


@pytest.mark.parametrize(
    ("date", "hours"), [("1970-01-01", "1"), ("0001-01-01", "1"), ("9999-12-31", "8000"), ("2099-12-31", "48")]
)
def test_synth_refuses_days_ingest_would_quarantine(tmp_path: Path, date: str, hours: str) -> None:
    """`synth --date 1970-01-01` wrote a log whose every row ingest then quarantined."""
    out = tmp_path / "d.jsonl"
    res = CliRunner().invoke(main, ["synth", "--date", date, "--hours", hours, "--requests", "10", "--out", str(out)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "2000-01-01 .. 2100-01-01 UTC, the range ingest accepts" in res.stderr and not out.exists()
