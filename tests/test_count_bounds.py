"""Every count that multiplies a round's work is bounded by what the data, the time and the machine allow, checked
before any work in one line naming the key or the flag (src.plan.bounds; the rounds' and collaborators' bounds are
tests/test_settings_at_start.py's)."""

from __future__ import annotations

import math
from collections import namedtuple

import pytest
import torch

from audit.config.fields import SettingsError
from src.plan import bounds
from test_settings_at_start import DEMO, demo, tool

HUGE = 10**12


def _members(dataset="digits", ratio=0.4, collaborators=2):
    return bounds.mean_shard(dataset, ratio, collaborators)


@pytest.mark.parametrize("flags, says", [
    (["--local_epochs", str(HUGE)], "--local_epochs: 1,000,000,000,000 epochs; at most 83,333: epochs of 12 batches of "
                                    "32 on the mean shard of 359 members make 12 optimizer steps a round each"),
    (["--reference_models", "1000000"], "--reference_models: 1,000,000 reference models; at most 83,333: the "
                                        "references (1 trained kind: independent) each about one local training"),
    (["--reference_models", "100000", "--rmia_references", "fine_tuned", "independent", "--local_epochs", "3"],
     "--reference_models: 100,000 reference models; at most 13,888: the references (2 trained kinds: fine_tuned, "
     "independent) each about one local training (3 epochs of 12 batches"),
])
def test_the_demos_training_counts_are_bounded_before_anything(tmp_path, capsys, flags, says):
    log_dir = tmp_path / "logs"
    code, err = demo([*DEMO, *flags, "--log_dir", str(log_dir)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert not log_dir.exists()


def test_the_demos_largest_counts_pass():
    # digits, the demo's default split: 359 members, 12 batches an epoch
    import cifar10_PM

    assert _members() == 359
    most = bounds.MAX_ROUND_STEPS // math.ceil(359 / 32)
    cifar10_PM.parse_args(["--dataset", "digits", "--local_epochs", str(most)])
    cifar10_PM.parse_args(["--dataset", "digits", "--reference_models", str(most)])


SET = "task_runner.settings"


@pytest.mark.parametrize("override, says", [
    ("tasks.train.kwargs.epochs=1000000000000", "tasks.train.kwargs.epochs: 1,000,000,000,000 epochs; at most "
                                                "500,000: epochs of 2 batches of 32 on the mean shard of 59 members"),
    (f"{SET}.per_collaborator={{collaborator2: {{epochs: 1000000000}}}}",
     f"{SET}.per_collaborator.collaborator2.epochs: 1,000,000,000 epochs; at most 500,000"),
    (f"{SET}.audit.rmia.reference_models=1000000", f"{SET}.audit.rmia.reference_models: 1,000,000 reference models; "
                                                   "at most 100,000: the references (1 trained kind: independent) "
                                                   "each about one local training (5 epochs of 2 batches"),
    (f"{SET}.audit.deanon={{enabled: true, shadows_per_user: 100000}}",
     f"{SET}.audit.deanon.shadows_per_user: 100,000 shadow updates per user; at most 9,090: the shadow updates of "
     "10 crowd users and this collaborator"),
    (f"{SET}.audit.canary={{enabled: true, count: 1000000000}}",
     f"{SET}.audit.canary.count: 1,000,000,000 canaries; at most 12,799,882: half of them join the shadow training of "
     "59 members (5 epochs at batch 32)"),
    (f"{SET}.gate={{action: dp_retrain, thresholds: {{mia_local_loss_exact_auc: 0.6}}, dp: {{max_retries: 1000}}}}",
     f"{SET}.gate.dp.max_retries: expected an integer in [1, 30] (each doubles the noise), got 1000"),
], ids=["epochs", "per-collaborator", "reference-models", "shadows", "canaries", "dp-retries"])
def test_the_plans_training_counts_are_bounded_before_any_folder(tmp_path, capsys, override, says):
    run_dir = tmp_path / "run"
    code, err = tool(["prepare", "--collaborators", "3", "--dir", str(run_dir), "--set", override], capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and err.startswith(f"error: {says}"), err
    assert not run_dir.exists()


def test_each_bound_is_the_round_steps_over_the_steps_of_one():
    data = {"dataset": "cifar10", "train_dataset_ratio": 0.4, "collaborator_count": 2, "batch_size": 64}
    members = _members("cifar10", 0.4, 2)
    assert members == 12_000  # 60,000 images x 0.4 / 2
    batches = math.ceil(members / 64)
    most = bounds.MAX_ROUND_STEPS // batches
    config = {"tasks": {"train": {"function": "train_task", "kwargs": {"epochs": most}}}}
    bounds.check_training_counts(config, data)  # at the bound
    config["tasks"]["train"]["kwargs"]["epochs"] = most + 1
    with pytest.raises(SettingsError, match=rf"^tasks\.train\.kwargs\.epochs: {most + 1:,} epochs; at most {most:,}"):
        bounds.check_training_counts(config, data)
    # a round's steps on the cheapest model measured, at the bound: the docs' figure
    assert bounds.CPU_MINUTES_AT_MAX == pytest.approx(10.0)


def test_rmia_references_kept_across_rounds_must_fit_the_temporary_folder(monkeypatch):
    import shutil

    from audit.config.rmia_settings import RMIASettings
    from audit.config.rmia_settings import REFERENCE_DISK_SHARE
    from audit.membership.rmia_step import check_references

    model = torch.nn.Linear(1000, 1000)  # 4.0 MB of float32 weights
    copy_bytes = 1001 * 1000 * 4
    Usage = namedtuple("Usage", "total used free")
    free = 2**30
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(free, 0, free))
    settings = RMIASettings(references=("global", "fine_tuned", "independent"), reference_models=2)
    check_references(model, (1000,), settings, "audit.rmia")  # 16 MB: in memory
    most = int(REFERENCE_DISK_SHARE * free // (2 * copy_bytes))
    check_references(model, (1000,), RMIASettings(reference_models=most * 2, references=("independent",)),
                     "audit.rmia")
    with pytest.raises(SettingsError) as err:
        check_references(model, (1000,), RMIASettings(references=("fine_tuned", "independent"),
                                                      reference_models=most + 1), "task_runner.settings.audit.rmia")
    assert str(err.value).startswith(f"task_runner.settings.audit.rmia.reference_models: {most + 1:,} reference models; "
                                     f"at most {most:,} here: 2 trained kinds x {most + 1:,} copies of the model (3.8 MB "
                                     "each) are kept across rounds")
