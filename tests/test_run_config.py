"""The run configuration pinned: for representative requests (a frozen method, full fine-tuning,
few-shot, --epochs, extra fairseq flags, --fp16, two devices), the config dict, its hash (the run
folder's name) and the fairseq-train command that scripts/run.sh plans stay exactly what they were
when the run folders on disk were made; and every committed run record is reproduced by planning its
own command again. Dry runs: nothing is trained or prepared."""

import dataclasses
import functools
import hashlib
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fairseq_idpg import run as main_job
from fairseq_idpg.run.identity import NAMED_WITH_UNCHANGED_FLAGS, SETTINGS_BEFORE_HASHING, settings_before_hashing
from fairseq_idpg.run_config import RunConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def standin(standin_stub):
    return standin_stub


def planned(argv, work):
    """(config, run folder, the launcher + fairseq-train command) of ``scripts/run.sh ARGV --dry-run``."""
    p = main_job.plan(main_job.parse_args([*argv, "--dry-run", "--work-dir", str(work)]))
    return p.config, p.folder, p.train


def normalized(config, command, work, standin, folder):
    """What does not depend on where the checkout, the model, the work folder and the interpreter are."""
    config = json.loads(json.dumps(config))
    config["model"].update(path="MODEL/model.pt", sha256="S" if config["model"]["sha256"] else None)
    config["model"]["dict_sha256"] = "D" if config["model"]["dict_sha256"] else None
    config["model"]["weights_sha256"] = "W" if config["model"]["weights_sha256"] else None
    config["data"]["folder"] = config["data"]["folder"].replace(str(work), "WORK")
    (config["data"]["provenance"] or {})["raw"] = "RAW"
    words = " ".join(command).replace(folder.name, "RUN").replace(str(work), "WORK").replace(str(standin), "MODEL")
    words = words.replace(str(REPO), "REPO").replace(sys.executable, "PYTHON")
    return config, hashlib.sha256(words.encode()).hexdigest()[:8]


# request -> (run folder's lr/seed, config_hash of the normalized config, the layout, the command's digest)
GOLDEN = {
    # the authors' start of IDPG's biases and IDPG Table 1's prompts (START_CHANGED): was ef69a6c8 and 26bf3ef8
    "frozen": (["SST-2", "--method", "m-idpg-phm"], "lr5e-3.seed1", "13413ca5", (1, 32, 1), "dc3b84d2"),
    "finetune": (["RTE"], "lr5e-5.seed1", "1721fa1d", (1, 16, 1), "032bc109"),
    "few-shot": (["CR", "--method", "dpt", "--few-shot", "775", "--data-seed", "1", "--max-update", "600"],
                 "lr5e-3.seed1", "89c9afff", (1, 16, 1), "09612777"),
    "epochs": (["RTE", "--method", "lora", "--model", "roberta.large", "--few-shot", "100", "--epochs", "50",
                "--total-batch", "16"], "lr2e-4.seed1", "c4adb854", (1, 16, 1), "dca19e0b"),
    "extra-flags": (["SST-2", "--method", "lora", "--validate-interval-updates", "3", "--dropout", "0.2"],
                    "lr2e-4.seed1", "2b65c105", (1, 16, 1), "821a21c7"),
    "fp16": (["MNLI", "--method", "inducer-lora", "--model", "roberta.large", "--fp16"],
             "lr2e-4.seed1", "7db198e5", (1, 16, 1), "176d36c7"),
    "nproc2": (["RTE", "--method", "lora", "--lr", "1e-3", "--total-batch", "32", "--nproc", "2", "--update-freq",
                "4", "--max-tokens", "4400", "--seed", "7"], "lr1e-3.seed7", "db8c3ff0", (2, 4, 4), "e7187572"),
    "dev-from-train": (["RTE", "--method", "prompt-tuning-5", "--dev-from-train", "500", "--data-seed", "3"],
                       "lr5e-3.seed1", "11af59b6", (1, 16, 1), "92857632"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_config_hash_and_command_are_those_of_existing_runs(shared_data, standin, tmp_path, case):
    argv, prefix, digest, layout, command_digest = GOLDEN[case]
    config, folder, command = planned(argv, tmp_path / "work")
    # a dry run prepares no data, and the hash covers the prepared rows: the name waits for them
    assert folder.name == f"{prefix}.<hash>"
    ours, command_ours = normalized(config, command, tmp_path / "work", standin, folder)
    assert (main_job.config_hash(ours), tuple(ours["layout"].values()), command_ours) == (
        digest,
        layout,
        command_digest,
    ), case


def committed_records():
    names = subprocess.run(["git", "grep", "-lz", '"run": "lr'], capture_output=True, text=True, cwd=REPO).stdout
    return sorted(REPO / name for name in names.split("\0") if name.endswith(".json"))  # labels have spaces


def test_committed_records_are_named_by_their_config_hash():
    records = committed_records()
    assert len(records) >= 81
    for path in records:
        record = json.loads(path.read_text())
        assert record["run"].rsplit(".", 1)[1] == main_job.config_hash(record["config"]), path


def test_committed_records_carry_the_weights_digest_a_fresh_clone_matches():
    """A fresh clone builds its own stand-in (other file bytes, the same weights): a record is matched
    there by its weights' digest, so a record without one would be trained again. Only the few-shot
    study's records predate the digest (their stand-in build, and so the digest, is gone)."""
    predate = "standin-fewshot"
    lacking = [p for p in committed_records() if "weights_sha256" not in json.loads(p.read_text())["config"]["model"]]
    assert lacking and all(p.relative_to(REPO).parts[2] == predate for p in lacking), [
        str(p) for p in lacking if p.relative_to(REPO).parts[2] != predate
    ]


# Where IDPG's output biases, IDPG Table 1's prompts and its adapter baselines start changed to the authors'
# effective start (their RobertaModel's init_bert_params; docs/idpg.md, "Where training starts"; docs/blocks.md):
# records made before have the settings below (None: the key did not exist); runs with the new start have new
# folders.
_PROMPT_START_BEFORE = {"prompt_init": "uniform", "prompt_init_scale": 0.5}
START_CHANGED = {
    **{name: _PROMPT_START_BEFORE for name in ("prompt-tuning-5", "prompt-tuning-134", "p-tuning-v2-5")},
    **{name: {"idpg_bias_init": None} for name in ("s-idpg-phm", "s-idpg-dnn", "m-idpg-phm", "m-idpg-dnn",
                                                  "m-idpg-phm-glove", "m-idpg-phm-lowrank")},
    **{name: {"adapter_init": None} for name in ("houlsby-adapter", "compacter")},
}  # fmt: skip


def before_start_change(method, settings):
    """A method's settings as they were before START_CHANGED (None: the key did not exist)."""
    settings = dict(settings)
    for key, value in START_CHANGED.get(method, {}).items():
        assert key in settings, (method, key)  # the change is still there to undo
        if value is None:
            del settings[key]
        else:
            settings[key] = value
    return settings


def as_recorded(config, record):
    """``config`` with the model file and folders of the machine the record ran on (and, for a record made
    before START_CHANGED, the settings its method had then)."""
    if record["method"] in START_CHANGED and "settings" in config["method"]:
        recorded = record["config"]["method"].get("settings") or settings_before_hashing()[record["method"]]
        new_start = (
            "idpg_bias_init" in recorded or recorded.get("prompt_init") == "normal" or "adapter_init" in recorded
        )
        if not new_start:
            config["method"]["settings"] = before_start_change(record["method"], config["method"]["settings"])
    config["model"].update({k: record["config"]["model"][k] for k in ("path", "sha256", "dict_sha256")})
    if "weights_sha256" in record["config"]["model"]:
        config["model"]["weights_sha256"] = record["config"]["model"]["weights_sha256"]
    else:  # recorded before the weights' digest, whose model file is no longer here to compute it
        del config["model"]["weights_sha256"]
    config["data"]["folder"] = record["config"]["data"]["folder"]
    config["data"]["provenance"]["raw"] = record["config"]["data"]["provenance"]["raw"]
    if "settings" not in record["config"]["method"]:  # recorded before the model settings: they were these
        assert config["method"]["settings"] == settings_before_hashing()[record["method"]], record["run"]
        del config["method"]["settings"]
    return config


def test_committed_records_are_planned_again_from_their_command(shared_data, standin, tmp_path):
    """Each committed record's command, planned now, gives its config (the model file and the folders
    are those of the machine it ran on) and so its run folder's name; so does its config read back as
    a request (``RunConfig.from_config``)."""
    for path in committed_records():
        record = json.loads(path.read_text())
        argv = record["command"].split()[1:]
        if "--work-dir" in argv:  # where it ran (absent: the checkout, the default); flags may follow it
            at = argv.index("--work-dir")
            argv = argv[:at] + argv[at + 2 :]
        config, folder, _ = planned(argv, tmp_path)
        assert as_recorded(config, record) == record["config"], path
        assert f"{folder.name.rsplit('.', 1)[0]}.{main_job.config_hash(config)}" == record["run"]
        request = RunConfig.from_config(record["config"], work_dir=str(tmp_path), dry_run=True)
        again = main_job.plan(request, log=main_job.quiet)
        assert as_recorded(again.config, record) == record["config"], path


# ---------------------------------------------------------------------------------------- a new option
def test_bf16_reaches_fairseq_train_and_leaves_other_runs_their_folder(shared_data, standin, tmp_path, capsys):
    """--bf16 (one field and one line of the command): in the fairseq-train command and in config.json,
    so a bf16 run has its own folder, while a run without it keeps the hash it always had."""
    argv, prefix, digest, *_ = GOLDEN["frozen"]
    config, folder, command = planned([*argv, "--bf16"], tmp_path / "work")
    assert "--bf16" in command[command.index("--") :] and "--fp16" not in command
    other = main_job.config_hash(planned(argv, tmp_path / "work")[0])  # (a dry run names neither: no data)
    assert config["bf16"] is True and main_job.config_hash(config) != other
    plain, _, command = planned(argv, tmp_path / "work")
    assert "bf16" not in plain and "--bf16" not in command
    assert main_job.config_hash(normalized(plain, command, tmp_path / "work", standin, folder)[0]) == digest
    assert RunConfig.from_config(config).bf16 and RunConfig.from_argv(["RTE", "--bf16"]).argv()[-1] == "--bf16"
    capsys.readouterr()
    assert main_job.main(["RTE", "--bf16", "--fp16", "--work-dir", str(tmp_path / "w")]) == 2
    assert capsys.readouterr().err == (
        "run.sh: error: --bf16 and --fp16 exclude each other (one mixed precision at a time)\n"
    )


def test_compile_layers_reaches_fairseq_train_and_keeps_the_runs_folder(shared_data, standin, tmp_path, capsys):
    """--compile-layers (--compile-backend): how the run computes, not what: in the fairseq-train command, not in
    config.json, so the run keeps its folder (the pinned hash); a sweep's row gives it as a run.sh flag."""
    argv, prefix, digest, *_ = GOLDEN["frozen"]
    config, folder, command = planned([*argv, "--compile-layers", "--compile-backend", "aot_eager"], tmp_path / "w")
    train = command[command.index("--") :]
    assert train[train.index("--compile-layers") :][:3] == ["--compile-layers", "--compile-backend", "aot_eager"]
    plain, plain_folder, plain_command = planned(argv, tmp_path / "w")
    assert folder.name == plain_folder.name and config == plain and folder.name.startswith(prefix)
    assert main_job.config_hash(normalized(config, command, tmp_path / "w", standin, folder)[0]) == digest
    recorded = {*config, *config["method"]["settings"]}
    assert "--compile-layers" not in plain_command and not {"compile_layers", "compile_backend"} & recorded
    request = RunConfig("SST-2", "m-idpg-phm").with_flags(["--compile-layers"])
    assert request.compile_layers and request.extra_args == () and RunConfig.from_argv(request.argv()) == request
    capsys.readouterr()
    assert main_job.main(["RTE", "--compile-backend", "inductor", "--work-dir", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == (
        "run.sh: error: --compile-backend chooses the backend of --compile-layers: give both\n"
    )
    assert main_job.main(["RTE", "--compile-layers", "--work-dir", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == (
        "run.sh: error: --compile-layers compiles a frozen backbone's layers; --method finetune trains it\n"
    )
    assert not (tmp_path / "x").exists()


def test_request_round_trips_through_its_command_line():
    """argv() is the request again; a sweep's args apply run.sh flags (the last wins) and keep the rest."""
    request = RunConfig("RTE", "lora", seed=2, lr=1e-3, few_shot=16, data_seed=9).with_flags(
        ["--total-batch", "8", "--dropout", "0.2", "--lr", "2e-3", "--bf16"]
    )
    assert (request.total_batch, request.lr, request.bf16, request.extra_args) == (8, 2e-3, True, ("--dropout", "0.2"))
    assert RunConfig.from_argv(request.argv()) == request
    assert request.argv()[:7] == ["RTE", "--method", "lora", "--model", "standin", "--seed", "2"]
    assert RunConfig.from_argv(["rte"]).argv() == ["rte", "--method", "finetune", "--model", "standin", "--seed", "1"]


# ---------------------------------------------------------------------------------------- identity
def test_the_settings_of_runs_named_before_them_are_frozen():
    """settings_before_hashing.json keeps the folders of runs named before the model settings were hashed:
    editing it would rename them (or reuse a changed run's result), so it never changes."""
    digest = hashlib.sha256(SETTINGS_BEFORE_HASHING.read_bytes()).hexdigest()
    assert digest[:16] == "922786dd5b58f331"


def test_a_new_block_leaves_every_existing_record_its_settings(monkeypatch):
    """A block added after runs were named (its own options, with defaults) shapes none of the existing
    records' models: a record's settings hold the options of the blocks it turns on, so every record keeps
    its settings, and its runs their folders."""
    from fairseq_idpg import blocks
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.options import option
    from fairseq_idpg.run.identity import model_settings

    monkeypatch.setattr(blocks, "BLOCKS", dict(blocks.BLOCKS))  # the registration is undone after the test

    @blocks.register_block("scale", "a new block: learned scales of the queries", slots=("q",))
    @dataclasses.dataclass
    class ScaleConfig(blocks.BlockConfig):
        scale_rank: int = option(0, "its rank (0: off)", size=True)
        scale_init: float = option(0.5, "its initial value")

        def active(self):
            return self.scale_rank > 0

    assert {"scale_rank", "scale_init"} <= set(blocks.block_defaults())
    now = {n: before_start_change(n, model_settings(METHODS[n])) for n in settings_before_hashing()}
    assert now == settings_before_hashing()


def test_a_changed_preset_or_default_is_another_run(shared_data, standin, tmp_path, monkeypatch):
    """Everything the model is built with is in config.json and its hash: a record's preset (IDPG's m = 16 ->
    32), a family default the record relies on (the generator's dropout), an option given on top of the
    preset; where M(x) is cached is not."""
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.models.roberta_idpg import DEFAULTS

    def name():  # the folder's hash (a dry run prints <hash> until the data is prepared)
        return main_job.config_hash(planned(argv, tmp_path)[0])

    argv = GOLDEN["frozen"][0]
    config, folder, _ = planned(argv, tmp_path)
    assert config["method"]["settings"]["idpg_hidden"] == 16 and config["method"]["settings"]["idpg_dropout"] == 0.1
    record, first = METHODS["m-idpg-phm"], name()
    monkeypatch.setitem(METHODS, record.name, dataclasses.replace(record, preset={**record.preset, "idpg_hidden": 32}))
    changed, other = planned(argv, tmp_path)[0], name()
    assert changed["method"]["settings"]["idpg_hidden"] == 32 and other != first
    monkeypatch.setitem(METHODS, record.name, record)
    monkeypatch.setitem(DEFAULTS, "idpg_dropout", 0.2)
    changed, default = planned(argv, tmp_path)[0], name()
    assert changed["method"]["settings"]["idpg_dropout"] == 0.2 and default not in (first, other)
    monkeypatch.setitem(DEFAULTS, "idpg_dropout", 0.1)
    monkeypatch.setitem(DEFAULTS, "idpg_cache", "memory")
    assert name() == first
    lowrank = dataclasses.replace(record, name="m-idpg-phm", options={**record.options, "idpg_layer_bias_rank": 2})
    monkeypatch.setitem(METHODS, record.name, lowrank)
    assert name() not in (first, other, default)


def folder_of(argv, work):
    """The run folder ``scripts/run.sh ARGV`` trains in, its hash filled in (a dry run prints <hash> until the data
    is prepared)."""
    config, folder, _ = planned(argv, work)
    return folder.with_name(folder.name.replace("<hash>", main_job.config_hash(config)))


def test_a_setting_spelled_as_a_flag_a_preset_or_a_default_is_one_run(shared_data, standin, tmp_path):
    """One model and training, one folder: LoRA's rank as its record's preset gives it or as a flag of that value,
    a family default left unsaid or given, a run option at its default or the recipe's value; a flag that changes
    the model is another run, and what it leaves as it is does not enter config.json beside it."""
    lora, work = ["RTE", "--method", "lora"], tmp_path / "work"
    spellings = {
        "preset": lora,
        "flag at the preset's value": [*lora, "--lora-rank", "16"],
        "flags at the family's defaults": [*lora, "--lora-dropout", "0.1", "--lora-alpha=32"],
        "the preset named again": [*lora, "--blocks-preset", "lora"],
        "a block left off": [*lora, "--adapter-dim", "8"],
        "the last value given wins": [*lora, "--lora-rank", "8", "--lora-rank", "16"],
        "run options at their defaults": [*lora, "--seed", "1", "--data-seed", "1", "--nproc", "1"],
        "the recipe's lr and batch": [*lora, "--lr", "2e-4", "--total-batch", "16"],
    }
    folders = {how: folder_of(argv, work) for how, argv in spellings.items()}
    assert folders == {how: folders["preset"] for how in spellings}
    rank8 = folder_of([*lora, "--lora-rank", "8"], work)
    assert rank8 != folders["preset"] and folder_of([*lora, "--lora-rank", "8", "--lora-alpha", "32"], work) == rank8
    config = planned([*lora, "--lora-dropout", "0.1", "--lora-rank", "8", "--dropout", "0.2"], work)[0]
    assert config["extra_args"] == ["--lora-rank", "8", "--dropout", "0.2"]
    # where IDPG's M(x) is kept: how the model computes, not what
    idpg = GOLDEN["frozen"][0]
    assert folder_of([*idpg, "--idpg-cache", "memory", "--idpg-sharing", "M"], work) == folder_of(idpg, work)


def test_a_spelling_named_before_keeps_its_name_and_takes_in_its_twin(shared_data, standin, tmp_path):
    """examples/idpg/ablation-multilayer.yaml's layer0-M-m256 gives m-idpg-phm its own --idpg-sharing M: its runs
    were named with that flag, and keep the name (the spec's pinned names, below); the same run spelled without it
    is named as they are."""
    (named,) = NAMED_WITH_UNCHANGED_FLAGS["m-idpg-phm"]
    at = named.index("--idpg-sharing")
    argv = ["SST-2", "--method", "m-idpg-phm", "--fp16"]
    without = [*argv, *named[:at], *named[at + 2 :]]
    with_flag, twin = folder_of([*argv, *named], tmp_path), folder_of(without, tmp_path)
    assert twin == with_flag and planned(without, tmp_path)[0]["extra_args"] == list(named)
    assert folder_of([*argv, *named[:at], "--idpg-sharing", "S", *named[at + 2 :]], tmp_path) != with_flag


def as_prepared(work, task="RTE"):
    """The ``data`` of a plan: RTE prepared by hand (its task.json's info), so the run's name is known without
    preparing anything."""
    from fairseq_idpg.data.task_info import TaskInfo

    provenance = {"raw": "/data/RTE", "raw_sha256": {"train.tsv": "0" * 64}, "bpe": "wordpiece", "few_shot": None,
                  "dev_from_train": None, "seed": None}  # fmt: skip
    info = TaskInfo(task, 2, False, True, "accuracy", {"train": 160, "valid": 48}, provenance=provenance)
    return main_job.Data(work / "data-bin" / task, info, provenance)


def test_a_run_named_before_unchanged_flags_were_left_out_is_found_there(standin, tmp_path, capsys, monkeypatch):
    """A run spelled with a flag that changes nothing (LoRA's rank at its preset's value) and finished before such
    flags were left out of config.json was named by its extra flags as given: planned again, by run.sh or a
    sweep, it is found in that folder, said in one line, and not trained again (its record is this run's too);
    interrupted, it resumes there; without that folder the run gets the name it has now."""
    from records_support import write_finished_run

    from fairseq_idpg import sweep, sweep_progress

    work = tmp_path / "work"
    seams = {"backbone": main_job.backbone_at(standin), "data": as_prepared(work)}
    request = main_job.parse_args(["RTE", "--method", "lora", "--lora-rank", "16", "--work-dir", str(work)])

    def planned_now(request=request):
        capsys.readouterr()
        p = main_job.plan(request, **seams)
        return p, capsys.readouterr().out

    now, out = planned_now()
    assert now.complete and now.config["extra_args"] == [] and now.note is None and "earlier name" not in out
    before = {**now.config, "extra_args": ["--lora-rank", "16"]}
    earlier = now.folder.with_name(main_job.run_name(2e-4, 1, main_job.config_hash(before)))
    assert earlier != now.folder
    earlier.mkdir(parents=True)
    (earlier / "config.json").write_text(json.dumps(before))  # a run refused before it trained: not this one
    assert planned_now()[0].folder == now.folder

    write_finished_run(earlier, before, task="RTE", method="lora", dev=70.0)
    note = f"note: found under its earlier name {earlier} (named before flags that change nothing were left out)"
    p, out = planned_now()
    assert (p.folder, p.config, p.finished, p.note) == (earlier, before, True, note)
    lines = out.splitlines()  # the task and method, the note, the budget, the run folder really used
    assert lines[1] == note and lines[-1] == f"run folder: {earlier}" and len(lines) == 4
    assert planned_now(dataclasses.replace(request, extra_args=()))[0].folder == now.folder  # spelled otherwise
    (earlier / "results.json").rename(earlier / "checkpoint_last.pt")  # interrupted: resumed where it is
    assert planned_now()[0].folder == earlier

    # a sweep: the same note and folder; the run's record, from another checkout, found without the folder
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: s\nmodel: standin\ntasks: [RTE]\nmethods: [{label: lora16, method: lora, "
                    "args: [--lora-rank, 16]}]\nlrs: recipe\nseeds: [1]\n")  # fmt: skip
    monkeypatch.setattr(sweep, "plan", functools.partial(main_job.plan, **seams))
    (run,) = sweep.load_spec(spec).runs
    opts = types.SimpleNamespace(work_dir=str(work), dry_run=True)
    capsys.readouterr()
    ((_, p),) = sweep._plan_runs([run], "standin", opts)
    assert p.folder == earlier and capsys.readouterr().out == f"{run.name}: {note}\n"
    records = tmp_path / "records"
    sweep_progress.record_dir(run, records).mkdir(parents=True)
    (sweep_progress.record_dir(run, records) / f"{earlier.name}.json").write_text(json.dumps({"config": before}))
    shutil.rmtree(earlier)
    ((_, p),) = sweep._plan_runs([run], "standin", opts)
    assert p.folder == now.folder and p.note is None and sweep.recorded(run, p, records) is not None


def test_a_fairseq_flag_that_became_a_run_option_keeps_its_folder(shared_data, standin, tmp_path, capsys):
    """--validate-interval-updates went to fairseq-train as an extra flag when GOLDEN["extra-flags"] was
    pinned (its hash, test above); as a run option (typed, checked, read by run.sh) it stays in extra_args
    where it was given, so that run keeps its folder, and the same request made as a sweep's row is equal."""
    argv = GOLDEN["extra-flags"][0]
    request = RunConfig.from_argv(argv)
    assert request.validate_interval_updates == 3 and request.save_interval_updates is None
    assert request.extra_args == ("--validate-interval-updates", "3", "--dropout", "0.2")
    assert RunConfig("SST-2", "lora").with_flags(argv[3:]) == request and RunConfig.from_argv(request.argv()) == request
    assert RunConfig.from_argv([*argv, "--validate-interval-updates", "5"]).validate_interval_updates == 5
    field_only = RunConfig("SST-2", "lora", validate_interval_updates=3)
    assert field_only.extra_args == ("--validate-interval-updates", "3")
    config, folder, command = planned(argv, tmp_path / "work")
    assert config["extra_args"] == list(request.extra_args) and "validate_interval_updates" not in config
    assert RunConfig.from_config(config).validate_interval_updates == 3
    for bad, message in (("0", "--validate-interval-updates must be > 0, got 0"),
                         ("x", "argument --validate-interval-updates: invalid int value: 'x'")):  # fmt: skip
        assert main_job.main(["RTE", "--validate-interval-updates", bad, "--work-dir", str(tmp_path / "w")]) == 2
        assert capsys.readouterr().err == f"run.sh: error: {message}\n"
    assert not (tmp_path / "w").exists()


# run.sh's options that fairseq-train also has, typed apart from extra_args (each hashed under its own key, or not
# at all) before the rule that such an option is ``fairseq=True``: a run that passed one through was named by
# extra_args, and one given it typed since is named by its own key; either way its folder stays what it is.
TYPED_APART_BEFORE = {"seed", "lr", "head_lr", "max_update", "batch_size", "update_freq", "max_tokens", "fp16", "bf16",
                      "compile_layers", "compile_backend"}  # fmt: skip


def fairseq_train_flags():
    """The flags fairseq-train accepts with this plugin's task, blocks model and optimizer."""
    from fairseq import options

    parser = options.get_training_parser()
    components = ["--task", "peft_sentence_prediction", "--arch", "roberta_blocks", "--optimizer", "adam_head_lr"]
    components += ["--lr-scheduler", "polynomial_decay", "--criterion", "sentence_prediction_metrics"]
    input_args = ["DATA", "--user-dir", str(REPO / "fairseq_idpg"), *components]
    options.parse_args_and_arch(parser, input_args=input_args, parse_known=True)  # adds the components' flags
    return set(parser._option_string_actions)


def typed_apart_from_extra_args(cls, accepted):
    """The run options of ``cls`` (a ``RunConfig``) that fairseq-train accepts too (``accepted``: its flags) and that
    do not stay in extra_args where they are given (``fairseq=True``)."""
    from fairseq_idpg.options import flag

    flags = {f.name for f, _ in cls.options() if f.default is not dataclasses.MISSING and flag(f.name) in accepted}
    return {name for name in flags if not cls.__dataclass_fields__[name].metadata["fairseq"]}


def with_option(name, **kind):
    """RunConfig with one more run option, ``name`` (a float), declared with ``kind`` (``fairseq=True``...)."""
    from typing import Optional

    from fairseq_idpg.options import POSITIVE, option

    field = option(None, "fairseq-train's own flag", "devices", check=POSITIVE, **kind)
    return dataclasses.make_dataclass("Typed", [(name, Optional[float], field)], bases=(RunConfig,), frozen=True)


def test_a_new_run_option_that_fairseq_train_has_stays_in_extra_args():
    """Every run option that fairseq-train also has, but those typed before the rule, is ``fairseq=True``: a run
    could pass its flag through before it was typed, and stays named by its extra_args (``config=True`` would
    hash it apart, and rename those runs: next test)."""
    accepted = fairseq_train_flags()
    assert typed_apart_from_extra_args(RunConfig, accepted) == TYPED_APART_BEFORE
    config_option = with_option("fp16_init_scale", config=True)
    assert typed_apart_from_extra_args(config_option, accepted) == TYPED_APART_BEFORE | {"fp16_init_scale"}
    assert typed_apart_from_extra_args(with_option("fp16_init_scale", fairseq=True), accepted) == TYPED_APART_BEFORE


def test_a_flag_passed_through_then_typed_keeps_its_runs_folder(shared_data, standin, tmp_path, capsys):
    """examples/idpg/ablation-generator.yaml passes --fp16-init-scale through to fairseq-train. Made a run option
    (typed, checked) with ``fairseq=True``, the same command plans the same config.json, folder and fairseq-train
    command; declared ``config=True`` instead, it would name another folder."""
    argv = ["SST-2", "--method", "s-idpg-phm", "--fp16", "--fp16-init-scale", "4", "--threshold-loss-scale", "1"]
    argv += ["--dry-run", "--work-dir", str(tmp_path / "work")]

    def plan(cls):
        p = main_job.plan(cls.from_argv(argv), log=main_job.quiet)
        return p.config, main_job.config_hash(p.config), p.train

    passed_through, typed = RunConfig.from_argv(argv), with_option("fp16_init_scale", fairseq=True).from_argv(argv)
    assert passed_through.extra_args == typed.extra_args and typed.fp16_init_scale == 4.0
    assert plan(with_option("fp16_init_scale", fairseq=True)) == plan(RunConfig)
    assert plan(with_option("fp16_init_scale", config=True))[1] != plan(RunConfig)[1]
    with pytest.raises(main_job.RunError, match="^--fp16-init-scale must be > 0, got 0.0$"):
        with_option("fp16_init_scale", fairseq=True).from_argv(["SST-2", "--fp16-init-scale", "0"]).validate()


# ---------------------------------------------------------------------------------------- the example specs
# each example spec's distinct configurations (task, method, flags, data budget, head lr: the first run of each),
# planned dry and normalized: the digest of their hashes, as at 84cf402 (before the model settings entered
# config.json and run.py became a package); supplementary.yaml's model folder is made by its stage 1, so its
# runs are refused here (the refusal is part of the digest); the specs with IDPG or IDPG Table 1's prompts changed
# with START_CHANGED (new folders for the new start)
SPEC_RUN_NAMES = {
    "examples/baselines2026/glue.yaml": "85433450ada0",  # split-dev as pyreft: a split per seed (was 1cb24626e1a0)
    "examples/baselines2026/vera-protocol.yaml": "887d75b75596",
    "examples/dpt/glue.yaml": "b077b0080826",
    "examples/dpt/smoke.yaml": "ac42aa59b577",
    "examples/idpg/ablation-generator.yaml": "d75f0b194bac",
    "examples/idpg/ablation-multilayer.yaml": "c6752c1dd372",
    "examples/idpg/ablation-position.yaml": "4bccef5f9c58",
    "examples/idpg/fused-standin.yaml": "a9478f0f40f5",
    "examples/idpg/smoke.yaml": "368f62b28a7b",
    "examples/idpg/supplementary.yaml": "13ee6e0ce334",
    "examples/idpg/table1.yaml": "4b6da10731df",  # its Adapter row with GELU, as the IDPG authors' adapter
    "examples/idpg/table3-standin.yaml": "b16bd6e88bf4",
    "examples/idpg/table3.yaml": "a91a57052aca",
    "examples/inducer/ablations.yaml": "b6073a51ae39",
    "examples/inducer/nlu.yaml": "2493d6e50dd9",
    "examples/inducer/smoke.yaml": "3e451466ed75",
    "examples/study/standin-baselines2026.yaml": "3642c21f28eb",
    "examples/study/standin-dpt-diagnosis.yaml": "bf0091aebfc2",
    "examples/study/standin-dpt-glue.yaml": "c484166c3823",
    "examples/study/standin-fewshot.yaml": "26b5d6713e6d",
    "examples/study/standin-fused-dropout.yaml": "e69d0ae46033",
    "examples/study/standin-idpg-start.yaml": "a61fce1cc5c0",  # SST-2 and CR added (MR's names kept)
    "examples/study/standin-inducer-diagnosis.yaml": "caace858e830",
    "examples/study/standin-inducer-nlu.yaml": "f5233eb90d06",
    "examples/study/standin-sidpg-diagnosis.yaml": "b05ab13a1d0b",
}


def test_the_example_specs_keep_their_run_names(shared_data, standin, tmp_path):
    from fairseq_idpg.sweep_spec import load_spec

    found = {}
    for path in sorted(REPO.glob("examples/*/*.yaml")):
        spec, names = load_spec(path), {}
        for run in spec.runs:
            request = run.request(spec.model, tmp_path / "work", True)
            key = (request.task, request.method, request.extra_args, request.few_shot, request.dev_from_train,
                   request.head_lr)  # fmt: skip
            if key not in names:
                try:
                    config = main_job.plan(request, log=main_job.quiet).config
                    names[key] = main_job.config_hash(normalized(config, [], tmp_path / "work", standin, tmp_path)[0])
                except main_job.RunError as e:
                    names[key] = "refused: " + str(e)[:40]
        digest = hashlib.sha256(json.dumps(sorted(names.values())).encode()).hexdigest()[:12]
        found[str(path.relative_to(REPO))] = digest
    assert found == SPEC_RUN_NAMES
