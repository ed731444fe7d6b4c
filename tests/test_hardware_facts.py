"""GPU facts are catalog data: peer-to-peer access, the extra reserved memory and whether the
prior applies are keys of the hardware entry (with a source each), and the GPUs ``plan`` searches
by default are pipeline/catalog/plan.toml's list. A new GPU is one TOML file: fit, plan, the
all-reduce choice, the prior and the collective donors treat it by its own keys."""

from __future__ import annotations

import re
import shutil
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.catalog import entries, hardware_to_toml, list_hardware, load_hardware, load_model
from pipeline.catalog.entries import hardware_dir, load_hardware_file, parse_hardware
from pipeline.common import defaults
from pipeline.common.errors import ConfigError
from pipeline.costmodel.fit import GiB, fit, non_torch_bytes_per_gpu
from pipeline.costmodel.profile.cost import _allreduce_backend, step_cost_for
from pipeline.costmodel.profile.prior import collective_donor
from pipeline.costmodel.roofline import Deployment
from pipeline.plan import PlanOptions
from pipeline.plan.search import candidate_fleet
from pipeline.plan.stage import candidates
from pipeline.replay.fleet import load_fleet, resolve

ROOT = Path(__file__).resolve().parents[1]
CATALOG_HW = hardware_dir()


def _facts(text: str, name: str, add: dict[str, str], sources: dict[str, str] | None = None) -> str:
    """``text`` (a catalog entry) renamed ``name`` with top-level keys ``add`` set (TOML values)
    and their sources (default: one per key)."""
    text = re.sub(r'^name = ".*"$', f'name = "{name}"', text, count=1, flags=re.M)
    # drop the facts the entry sets, in its top level and its [sources] (the last table)
    text = re.sub(r"^(peer_to_peer|extra_reserved_bytes|prior_applies) = .*\n", "", text, flags=re.M)
    head, tables = text.split("\n[", 1)
    text = head + "".join(f"\n{k} = {v}" for k, v in add.items()) + "\n\n[" + tables
    assert text.rstrip().rsplit("\n[", 1)[1].startswith("sources]")
    srcs = {k: f"test: {k} of a new GPU" for k in add} if sources is None else sources
    return text.rstrip("\n") + "\n" + "".join(f'{k} = "{v}"\n' for k, v in srcs.items())


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary copy of the catalog's hardware folder, used by name lookups."""
    folder = tmp_path / "hardware"
    shutil.copytree(CATALOG_HW, folder)
    monkeypatch.setattr(entries, "hardware_dir", lambda: folder)
    load_hardware.cache_clear()
    yield folder
    load_hardware.cache_clear()


# -- the catalog's own entries: the facts that were Python constants ----------------------------


def test_catalog_facts_are_the_former_constants() -> None:
    specs = {name: load_hardware(name) for name in list_hardware()}
    # the former NO_P2P = {"rtx-4090"}
    assert {n for n, hw in specs.items() if not hw.peer_to_peer} == {"rtx-4090"}
    # the former EXTRA_RESERVED_BYTES = {"rtx-4090": 0.67 GiB}, to the bit
    assert {n: hw.extra_reserved_bytes for n, hw in specs.items() if hw.extra_reserved_bytes} == {
        "rtx-4090": 0.67 * 2**30
    }
    assert specs["rtx-4090"].extra_reserved_bytes == 719407022.08
    # the former PRIOR_VENDORS = {"nvidia"}: the prior applies exactly to the NVIDIA entries
    assert {n for n, hw in specs.items() if not hw.prior_applies} == {"mi300x", "mi325x"}
    assert all(hw.prior_applies == (hw.vendor == "nvidia") for hw in specs.values())
    # each is cited in the entry's [sources], the way the other keys are
    assert "peer-to-peer" in specs["rtx-4090"].sources["peer_to_peer"]
    assert "0.67 GiB" in specs["rtx-4090"].sources["extra_reserved_bytes"]
    assert "CUDA kernels" in specs["mi300x"].sources["prior_applies"]
    assert "peer_to_peer" not in specs["h100-sxm"].sources


def test_rtx_4090_keeps_its_reserve_and_nccl() -> None:
    hw = load_hardware("rtx-4090")
    # single GPU: 256 MiB non-torch (vLLM >= 0.18) + 0.67 GiB; TP over PCIe: + the PCIe increment
    assert non_torch_bytes_per_gpu(1, "0.19.0", hw.extra_reserved_bytes, hw.link_kind) == 268435456 + 719407022.08
    m = load_model("llama-3.1-8b")
    assert _allreduce_backend(Deployment(model=m, hardware=hw, tp=2)) == "nccl"
    assert _allreduce_backend(Deployment(model=m, hardware=load_hardware("l40s"), tp=2)) == "custom"


def test_optional_fact_keys_need_a_source_and_a_sane_value(tmp_path: Path) -> None:
    l4 = (CATALOG_HW / "l4.toml").read_text()

    def load(text: str) -> None:
        path = tmp_path / "x.toml"
        path.write_text(text)
        parse_hardware(tomllib.loads(text), str(path))

    with pytest.raises(ConfigError, match=r"\[sources\]: missing key\(s\) \['peer_to_peer'\]") as info:
        load(_facts(l4, "l4", {"peer_to_peer": "false"}, sources={}))
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['prior_applies'\]; the entry sets no prior_applies"):
        load(_facts(l4, "l4", {}, sources={"prior_applies": "why"}))
    with pytest.raises(ConfigError, match=r"extra_reserved_bytes must be in \[0, memory_bytes\)"):
        load(_facts(l4, "l4", {"extra_reserved_bytes": "25769803776"}))
    with pytest.raises(ConfigError, match=r"extra_reserved_bytes must be >= 0, got -1"):
        load(_facts(l4, "l4", {"extra_reserved_bytes": "-1"}))
    with pytest.raises(ConfigError, match=r"peer_to_peer must be true or false, got 'no'") as info:
        load(_facts(l4, "l4", {"peer_to_peer": '"no"'}))
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"prior_applies must be true or false"):
        load(_facts(l4, "l4", {"prior_applies": "1"}))


def test_calibrate_writes_the_facts_back(tmp_path: Path) -> None:
    # `calibrate` writes a new entry from a HardwareSpec: the facts and their sources survive
    for name in ("rtx-4090", "mi300x", "h100-sxm"):
        hw = load_hardware(name)
        path = tmp_path / f"{name}.toml"
        path.write_text(hardware_to_toml(hw))
        back = load_hardware_file(path)
        assert (back.peer_to_peer, back.extra_reserved_bytes, back.prior_applies) == (
            hw.peer_to_peer,
            hw.extra_reserved_bytes,
            hw.prior_applies,
        )
        assert back.sources == hw.sources


# -- a new GPU is one file ----------------------------------------------------------------------


def test_a_new_gpu_file_is_fitted_by_its_own_reserve(catalog: Path) -> None:
    l4 = (CATALOG_HW / "l4.toml").read_text()
    (catalog / "newcard.toml").write_text(_facts(l4, "newcard", {"extra_reserved_bytes": str(2**30)}))
    (catalog / "plaincard.toml").write_text(_facts(l4, "plaincard", {}))
    assert {"newcard", "plaincard"} <= set(list_hardware())
    m = load_model("llama-3.1-8b")
    new = fit(Deployment(model=m, hardware=load_hardware("newcard")), context=8192)
    plain = fit(Deployment(model=m, hardware=load_hardware("plaincard")), context=8192)
    assert new.non_torch_bytes_per_gpu - plain.non_torch_bytes_per_gpu == 2**30
    # Llama-3.1-8B bf16: 2 (K, V) x 8 heads x 128 x 2 B x 32 layers = 128 KiB a token, 2 MiB a
    # 16-token block: 1 GiB more reserved is 512 blocks fewer
    assert plain.kv_capacity_blocks - new.kv_capacity_blocks == 512


def test_a_new_gpu_file_picks_its_all_reduce_prior_and_donor_by_its_own_keys(catalog: Path) -> None:
    m = load_model("llama-3.1-8b")
    l4 = (CATALOG_HW / "l4.toml").read_text()
    (catalog / "p2pcard.toml").write_text(_facts(l4, "p2pcard", {}))
    (catalog / "nop2pcard.toml").write_text(_facts(l4, "nop2pcard", {"peer_to_peer": "false"}))
    assert _allreduce_backend(Deployment(model=m, hardware=load_hardware("p2pcard"), tp=2)) == "custom"
    assert _allreduce_backend(Deployment(model=m, hardware=load_hardware("nop2pcard"), tp=2)) == "nccl"

    # the prior applies unless the file says not (any vendor: the key decides, not the name)
    (catalog / "noprior.toml").write_text(_facts(l4, "noprior", {"prior_applies": "false"}))
    other = re.sub(r'^vendor = ".*"$', 'vendor = "othervendor"', l4, count=1, flags=re.M)
    (catalog / "otherprior.toml").write_text(_facts(other, "otherprior", {"prior_applies": "true"}))

    def tier(name: str) -> str:
        cost = step_cost_for(Deployment(model=m, hardware=load_hardware(name)), max_tokens=512, max_num_seqs=16)
        return str(cost.describe["tier"])

    assert tier("p2pcard") == "prior"
    assert tier("noprior") == "roofline"
    assert tier("otherprior") == "prior"

    # NVLink collectives are lent between peer-to-peer GPUs only: an H100 SXM copy borrows the
    # measured H100 SXM's curves; without peer-to-peer it borrows none, and an H100 SXM entry
    # that says it has none lends none (the H200, same link, lends instead)
    h100 = (CATALOG_HW / "h100-sxm.toml").read_text()
    (catalog / "nvcard.toml").write_text(_facts(h100, "nvcard", {}))
    (catalog / "nvnop2p.toml").write_text(_facts(h100, "nvnop2p", {"peer_to_peer": "false"}))
    donor = collective_donor(load_hardware("nvcard"))
    assert donor is not None and donor[0] == "h100-sxm"
    assert collective_donor(load_hardware("nvnop2p")) is None
    (catalog / "h100-sxm.toml").write_text(_facts(h100, "h100-sxm", {"peer_to_peer": "false"}))
    load_hardware.cache_clear()
    donor = collective_donor(load_hardware("nvcard"))
    assert donor is not None and donor[0] == "h200"


def test_plan_searches_a_new_gpu_file_by_its_own_keys(catalog: Path) -> None:
    l4 = (CATALOG_HW / "l4.toml").read_text()
    (catalog / "newcard.toml").write_text(_facts(l4, "newcard", {"extra_reserved_bytes": str(2**30)}))
    base = load_fleet(ROOT / "fleets" / "default.toml", check_profile=False)
    opts = PlanOptions(model="llama-3.1-8b", hardware=("newcard", "l4"), tp=(1,))
    cands = candidates(opts, base)
    assert [c.hardware for c in cands] == ["newcard", "l4"]
    new, l4_fleet = (resolve(candidate_fleet(base, c), c.label) for c in cands)
    assert new.deployment.hardware.extra_reserved_bytes == 2**30
    assert new.memory.non_torch_bytes_per_gpu - l4_fleet.memory.non_torch_bytes_per_gpu == 2**30
    assert l4_fleet.memory.kv_capacity_blocks - new.memory.kv_capacity_blocks == 512


# -- the plan's default GPUs --------------------------------------------------------------------


def test_plan_defaults_are_the_catalog_list() -> None:
    listed = tomllib.loads((ROOT / "pipeline" / "catalog" / "plan.toml").read_text())["default_hardware"]
    assert listed == ["h100-sxm", "h200", "a100-80gb-sxm", "mi300x"]
    assert defaults.plan_default_hardware() == tuple(listed)
    assert PlanOptions(model="llama-3.1-8b").hardware == tuple(listed)
    assert set(listed) <= set(list_hardware())  # every default is a catalog GPU
    assert defaults.plan_default_hardware_text() == "h100-sxm,h200,a100-80gb-sxm,mi300x"


def test_plan_defaults_file_errors_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text('default_hardware = ["l4", "newcard", "l4"]\n')
    assert defaults.plan_default_hardware(path) == ("l4", "newcard")
    for text, expect in (
        ("default_hardware = []\n", "default_hardware must be a non-empty array of hardware names"),
        ('default_hardware = "h100-sxm"\n', "default_hardware must be a non-empty array"),
        ('default_hardware = ["h100-sxm", ""]\n', "default_hardware must be a non-empty array"),
        ("default_hardware = [\n", "cannot read the plan's default hardware"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(expect)) as info:
            defaults.plan_default_hardware(path)
        assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="cannot read"):
        defaults.plan_default_hardware(tmp_path / "missing.toml")


def test_plan_help_shows_the_catalog_defaults() -> None:
    from click.testing import CliRunner

    from pipeline.cli import main

    out = CliRunner().invoke(main, ["plan", "--help"]).output
    flat = " ".join(out.split())
    assert "h100-sxm,h200,a100-80gb- sxm,mi300x" in flat or "h100-sxm,h200,a100-80gb-sxm,mi300x" in flat


def test_replace_keeps_facts() -> None:
    # a fleet's [calibration] replaces factors on the spec: the facts stay the entry's
    hw = replace(load_hardware("rtx-4090"), compute_efficiency=0.5)
    assert (hw.peer_to_peer, hw.extra_reserved_bytes) == (False, 0.67 * GiB)
