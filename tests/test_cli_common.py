"""One name per concept on the command line (pipeline/cli/common.py, ``old_option_name``): the
weight dtype is ``--weight-dtype`` in ``fit`` and ``plan``, as FLEET.toml's ``weight_dtype``;
the older ``fit --weights`` and ``plan --precision`` still work, hidden, and say so."""

from __future__ import annotations

import json

from cli_checks import cli

FIT = ["fit", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4", "--json"]


def test_fit_weight_dtype_and_its_old_name_agree() -> None:
    new = cli(*FIT, "--weight-dtype", "fp8")
    old = cli(*FIT, "--weights", "fp8")
    default = cli(*FIT)
    assert new.exit_code == old.exit_code == default.exit_code == 0, (new.stderr, old.stderr)
    assert json.loads(new.stdout) == json.loads(old.stdout) != json.loads(default.stdout)
    assert new.stderr == ""
    assert old.stderr.splitlines() == ["warning: --weights is deprecated; use --weight-dtype (the same values)"]
    # the same value by both names is fine; two different values are a usage error
    assert cli(*FIT, "--weight-dtype", "fp8", "--weights", "fp8").exit_code == 0
    both = cli(*FIT, "--weight-dtype", "bf16", "--weights", "fp8")
    assert both.exit_code == 2 and "--weight-dtype bf16 and --weights fp8 disagree" in both.stderr


def test_help_names_only_the_new_option() -> None:
    for command, old in (("fit", "--weights"), ("plan", "--precision")):
        text = cli(command, "--help").stdout
        assert "--weight-dtype" in text and old not in text, command


def test_plan_precision_still_reaches_the_plan(tmp_path: object) -> None:
    """--precision is read as --weight-dtype: an unknown dtype is refused in the same words."""
    new = cli("plan", "--model", "llama-3.1-8b", "--weight-dtype", "int3", "--store", str(tmp_path))
    old = cli("plan", "--model", "llama-3.1-8b", "--precision", "int3", "--store", str(tmp_path))
    assert new.exit_code == old.exit_code != 0
    err_new = [ln for ln in new.stderr.splitlines() if ln.startswith("error:")]
    err_old = [ln for ln in old.stderr.splitlines() if ln.startswith("error:")]
    assert err_new == err_old and err_new, (new.stderr, old.stderr)
    assert old.stderr.splitlines()[0] == "warning: --precision is deprecated; use --weight-dtype (the same values)"
