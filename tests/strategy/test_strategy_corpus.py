"""Every malformed strategy file gets one clear line from `fleetlite strategy validate`, exit 2.

The corpus is tests/strategy_corpus/: one file per case, and expected_errors.yaml pairing each
with the line and the words its error must hold. valid/ holds files that must still pass.
"""
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetlite import cli
from fleetlite.strategy import files as strategy_files
from fleetlite.strategy.distributed_strategy import DistributedStrategy

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "strategy_corpus"
EXPECTED = yaml.safe_load((CORPUS / "expected_errors.yaml").read_text())
VALID = sorted((CORPUS / "valid").iterdir())
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
EMPTY_CASES = [name for name, case in EXPECTED.items() if "no strategy fields" in case["words"]]


def _made_by_the_test(name, directory, monkeypatch):
    """The cases git cannot hold: too large, not a plain file, unreadable, absent."""
    path = directory / name
    if name == "too_large.yaml":
        path.write_text("# padding\n" * (strategy_files.MAX_FILE_BYTES // 10 + 1))
    elif name == "fifo.yaml":
        os.mkfifo(path)
    elif name == "unreadable.yaml":
        path.write_text("amp: true\n")
        path.chmod(0)
        if os.geteuid() == 0:   # root reads any file: have open() refuse it as the kernel would for a user
            monkeypatch.setattr(strategy_files, "open", _refuse, raising=False)
    return path


def _refuse(path, *args, **kwargs):
    raise PermissionError(13, "Permission denied", str(path))


def _case_path(name, tmp_path, monkeypatch):
    if EXPECTED[name].get("content") == "made by the test":
        return _made_by_the_test(name, tmp_path, monkeypatch)
    return CORPUS / name


def test_the_corpus_and_its_index_agree():
    on_disk = {p.name for p in CORPUS.iterdir()} - {"expected_errors.yaml", "valid"}
    made = {name for name, case in EXPECTED.items() if case.get("content") == "made by the test"}
    assert on_disk == set(EXPECTED) - made


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_file_gets_one_line_naming_file_line_and_fix(name, tmp_path, monkeypatch, capsys):
    path = _case_path(name, tmp_path, monkeypatch)
    case = EXPECTED[name]
    assert cli.main(["strategy", "validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, err
    where = f"{path}:{case['line']}: " if case["line"] is not None else f"{path}: "
    assert err.startswith(f"fleetlite: error: {where}"), err
    for words in case["words"]:
        assert words in err, f"{words!r} not in {err!r}"
    assert len(err) < 2000, "a value quoted in an error must be shortened"


def test_the_command_exits_2_without_a_traceback(tmp_path):
    """One real process over the whole corpus: exit 2, one error line per file, no traceback."""
    paths = [str(CORPUS / name) for name, case in EXPECTED.items() if "content" not in case]
    result = subprocess.run([sys.executable, "-m", "fleetlite.cli", "strategy", "validate", *paths],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("fleetlite: error: ")]
    assert len(errors) == len(paths)
    for line, path in zip(errors, paths):
        assert line.startswith(f"fleetlite: error: {path}:"), line


@pytest.mark.parametrize("path", CONFIGS + VALID, ids=lambda p: p.name)
def test_valid_files_still_pass(path, capsys):
    assert cli.main(["strategy", "validate", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok")


@pytest.mark.parametrize("name", EMPTY_CASES)
def test_allow_empty_accepts_a_file_that_sets_nothing(name, capsys):
    assert cli.main(["strategy", "validate", "--allow-empty", str(CORPUS / name)]) == 0
    assert DistributedStrategy.load(CORPUS / name) == DistributedStrategy()


@pytest.mark.parametrize("path", CONFIGS + [p for p in VALID if p.suffix == ".yaml"], ids=lambda p: p.name)
def test_valid_yaml_round_trips_through_prototxt(path, tmp_path, capsys):
    original = DistributedStrategy.load(path)
    original.save(tmp_path / "s.prototxt")
    assert cli.main(["strategy", "validate", "--allow-empty", str(tmp_path / "s.prototxt")]) == 0
    assert DistributedStrategy.load(tmp_path / "s.prototxt") == original


def test_skipped_knobs_are_listed_not_passed_silently(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text("amp: true\nfind_unused_parameters: true\n")
    assert cli.main(["strategy", "validate", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: ok; compile will skip 1 knob(s) no pass acts on:"
    assert out[1] == ("  find_unused_parameters: not needed: in a static program an unused parameter simply has no "
                      "gradient (set: find_unused_parameters)")


def test_a_knob_fleetlite_does_not_implement_is_an_error_not_a_skip(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text("amp: true\npipeline_configs:\n  micro_batch_size: 2\n")
    assert cli.main(["strategy", "validate", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"fleetlite: error: {path}:3: pipeline: fleetlite does not implement it (set: "
        "pipeline_configs.micro_batch_size); pipeline parallelism is not data parallel: remove pipeline_configs\n")


def test_validate_and_explain_refuse_an_unimplemented_knob_alike_and_list_the_same_skips(tmp_path, capsys):
    refused, skipping = tmp_path / "refused.yaml", tmp_path / "skipping.yaml"
    refused.write_text("qat_configs: {weight_bits: 4}\n")
    skipping.write_text("lars: true\nfind_unused_parameters: true\n")
    assert cli.main(["strategy", "validate", str(refused)]) == 2
    by_validate = capsys.readouterr().err
    assert cli.main(["explain", "--strategy", str(refused)]) == 2
    assert by_validate == capsys.readouterr().err.replace("fleetlite: error: ", f"fleetlite: error: {refused}:1: ")
    assert "qat: fleetlite does not implement it (set: qat_configs.weight_bits); quantisation-aware training" in by_validate
    assert cli.main(["strategy", "validate", str(skipping)]) == 0
    listed = capsys.readouterr().out.splitlines()[1:]
    assert cli.main(["explain", "--strategy", str(skipping), "--world", "2"]) == 0
    table = capsys.readouterr().out
    assert [line.split(":")[0].strip() for line in listed] == ["find_unused_parameters"]
    assert re.search(r"find_unused_parameters\s+-\s+skipped\s+not needed", table)
    assert re.search(r"lars\s+UPDATE_REWRITE\s+applied", table)


def test_yaml_12_scalars_read_as_written():
    s = DistributedStrategy.load(CORPUS / "valid" / "yaml12_scalars.yaml")
    assert (s.lars_configs.epsilon, s.fuse_grad_size_in_MB, s.nccl_comm_num) == (1e-9, 16, 10)
    assert s.amp_configs.custom_black_varnames == ["no", "off", "yes"]
    assert (s.sync_batch_norm, s.fuse_all_reduce_ops) == (True, False)
