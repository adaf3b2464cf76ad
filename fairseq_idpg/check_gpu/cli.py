"""``scripts/check_gpu.sh`` / ``python -m fairseq_idpg.check_gpu``: see the package docstring."""

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from fairseq_idpg import check_gpu
from fairseq_idpg.check_gpu import DEFAULT_OUT, DISTRIBUTED_ATOL, DISTRIBUTED_RTOL
from fairseq_idpg.check_gpu.report import Check, Report, Timing
from fairseq_idpg.check_gpu.training import DISTRIBUTED_METHOD, FAMILIES, NO_DROPOUT, PRECISION_FLAGS
from fairseq_idpg.errors import ConfigError, one_line_errors, refuse

# shapes of the training runs and timings: (batch, tokens per sentence, updates)
GPU_SHAPES, CPU_SHAPES = (16, 128, 6), (4, 16, 3)
TINY = dict(layers=2, dim=32, heads=4, ffn=64)  # the CPU's backbone when no --model is given
PROG = "check_gpu.sh"


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=check_gpu.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    one_line_errors(p)
    p.add_argument("--model", help="standin, roberta.base, roberta.large or a folder with model.pt "
                   "(default: roberta.large on a GPU, a tiny random RoBERTa on the CPU)")  # fmt: skip
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"the JSON file (default {DEFAULT_OUT})")
    p.add_argument("--families", default=",".join(FAMILIES), help=f"of {', '.join(FAMILIES)} (default: all)")
    p.add_argument("--precisions", default="fp16,bf16", help="of fp32, fp16, bf16 (default fp16,bf16; "
                   "fp32 always runs: the half-precision runs are judged against it)")  # fmt: skip
    p.add_argument("--batch-size", type=int, help="sentences per device and update (GPU 16, CPU 4)")
    p.add_argument("--tokens", type=int, help="tokens per sentence, <s> and </s> included (GPU 128, CPU 16)")
    p.add_argument("--updates", type=int, help="updates per training run (GPU 6, CPU 3)")
    p.add_argument("--no-distributed", action="store_true", help="skip the 1-vs-2-device comparison")
    p.add_argument("--no-timings", action="store_true", help="skip the comparison with PEFT")
    p.add_argument("--cpu-timings", action="store_true", help="time on the CPU too (tiny sizes; one thread)")
    p.add_argument("--train-args", default="", help="more fairseq-train flags for every run, one string")
    p.add_argument("--work-dir", help="where data, logs and checkpoints go (default: a temporary folder, "
                   "kept when a check fails)")  # fmt: skip
    args = p.parse_args(argv)
    args.families = [f.strip() for f in args.families.split(",") if f.strip()]
    args.precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
    for flag, values, valid in (("--families", args.families, FAMILIES), ("--precisions", args.precisions,
                                                                         PRECISION_FLAGS)):  # fmt: skip
        wrong = [v for v in values if v not in valid]
        if wrong or not values:
            p.error(f"{flag} {','.join(wrong)}: valid are {', '.join(valid)}")
    for flag in ("batch_size", "tokens", "updates"):
        value = getattr(args, flag)
        if value is not None and value < (3 if flag == "tokens" else 1):
            p.error(f"--{flag.replace('_', '-')} must be >= {3 if flag == 'tokens' else 1}, got {value}")
    wrong_out = out_problem(Path(args.out))
    if wrong_out:
        p.error(f"--out {args.out}: {wrong_out}")
    return args


def out_problem(out: Path):
    """Why the report cannot be written to ``out`` (checked before any run), or None."""
    if out.is_dir():
        return f"is a folder; give the JSON file to write, e.g. {out / DEFAULT_OUT.name}"
    folder = out.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable; give --out a file in a folder you can write"
    return None


def main(argv=None):
    """The checks; exit status 0 (passed), 1 (a check failed: a temporary work folder is kept for its logs),
    2 (refused in one line). A temporary work folder is removed in every other case."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="check_gpu."))
    code = 2
    try:
        work.mkdir(parents=True, exist_ok=True)
        code = run_checks(args, work)
        return code
    except ConfigError as e:
        return refuse(PROG, e)
    finally:
        if not args.work_dir and code != 1:
            shutil.rmtree(work, ignore_errors=True)


def run_checks(args, work):
    import torch

    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    model_dir, model = find_model(args, cuda, work)
    batch, tokens, updates = (
        given if given is not None else default
        for given, default in zip(
            (args.batch_size, args.tokens, args.updates), GPU_SHAPES if cuda else CPU_SHAPES, strict=False
        )
    )
    device = torch.device("cuda" if cuda else "cpu")
    from fairseq_idpg.check_gpu.timing import device_name

    report = Report(device_name(device) or "cpu", torch.__version__, torch.version.cuda, model)
    where = f" ({model_dir})" if str(model_dir) != model else ""
    print(f"GPU check: {report.device}, torch {report.torch}, CUDA {report.cuda}; model {model}{where}")
    print(f"  batch {batch} x {tokens} tokens, {updates} updates per run; work folder {work}", flush=True)
    if not cuda:
        print("  no CUDA device: the runs use --cpu at this size (fp16/bf16 on the CPU: compat fix 11); "
              "this checks the code path, not a GPU", flush=True)  # fmt: skip

    from fairseq_idpg.check_gpu.data import write_synthetic_data
    from fairseq_idpg.check_gpu.training import Setup

    data = write_synthetic_data(work / "data", model_dir / "dict.txt", 2 * batch * updates, batch, tokens)
    setup = Setup(model_dir, data, work, not cuda, batch, tokens, updates, tuple(shlex.split(args.train_args)))
    family_runs(report, setup, args.families, args.precisions, cuda)
    distributed(report, setup, gpus, cuda, args.no_distributed)
    timings(report, setup, device, args, batch, tokens)

    print("\n" + report.table())
    out = report.write(args.out)
    print(f"\nwrote {out}")
    if not report.passed:
        print(f"logs kept in {work}")
    print(report.verdict(), flush=True)
    return 0 if report.passed else 1


def find_model(args, cuda, work):
    """(model folder, its name for the report): ``--model``, else roberta.large (GPU) or a tiny random one."""
    from fairseq_idpg.run import find_backbone
    from fairseq_idpg.run_config import RunConfig, RunError

    if args.model is None and not cuda:
        from fairseq_idpg.conversion.errors import ConversionError
        from fairseq_idpg.conversion.tiny import write_tiny_roberta

        try:  # its vocabulary is the stand-in's
            folder = Path(write_tiny_roberta(work / "tiny-roberta", **TINY))
        except ConversionError as e:
            print(f"check_gpu.sh: error: {e} (or give --model)", file=sys.stderr)
            sys.exit(2)
        return folder, "tiny random RoBERTa ({layers} x {dim}, {heads} heads)".format(**TINY)
    name = args.model or "roberta.large"
    try:
        backbone = find_backbone(RunConfig("SST-2", model=name))
    except RunError as e:
        print(f"check_gpu.sh: error: {e}", file=sys.stderr)
        sys.exit(2)
    return Path(backbone.dir), name


def family_runs(report, setup, families, precisions, cuda):
    """Check 1: a few fairseq-train updates per family and precision."""
    import torch

    from fairseq_idpg.check_gpu.training import (
        fairseq_train_argv,
        judge,
        launcher_command,
        seconds_per_update,
        train_in_process,
    )

    print(f"\n[1] fairseq-train, {setup.updates} updates per family and precision", flush=True)
    # fp32 first: it is the reference each half-precision run of the family is judged against
    order = ["fp32"] + [p for p in precisions if p != "fp32"]
    for family in families:
        name = FAMILIES[family]
        reference = None
        for precision in order:
            check = f"{precision} {family} ({name})"
            if precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
                report.add(Check(check, "skip", "this GPU has no bf16 (Ampere or newer has)"))
                continue
            launcher = launcher_command(setup, name, precision)
            result = train_in_process(fairseq_train_argv(launcher, setup.cpu), setup.work / "logs" / f"{check}.log")
            if result.refused:
                raise refused_arguments(result.refused, setup.extra)
            status, detail = judge(result, precision, setup.updates, reference)
            if precision == "fp32":
                reference = [s.get("loss") for s in result.train_inner()] if status == "pass" else None
            seconds = seconds_per_update(result)
            if status == "pass" and seconds is not None:
                report.seconds_per_update.append(Timing(name, precision, setup.batch_size, setup.tokens, seconds))
                detail += f", {seconds * 1000:.1f} ms/update"
            report.add(Check(check + (" on the CPU" if setup.cpu else ""), status, detail))


def refused_arguments(reason, train_args):
    """fairseq-train refused its arguments: the user's --train-args (most likely), not the device."""
    if train_args:
        return ConfigError(f"--train-args {shlex.join(train_args)!r}: fairseq-train refused its arguments ({reason}); "
                           f"give flags fairseq-train knows (fairseq-train --help), or none")  # fmt: skip
    return ConfigError(f"fairseq-train refused the check's own arguments ({reason}): a bug of the check, not the "
                       f"device; please report it")  # fmt: skip


def distributed(report, setup, gpus, cuda, skip):
    """Check 2: 1 device with update-freq 2 against 2 devices, the same global batch, fp32, no dropout."""
    from fairseq_idpg.check_gpu.training import (
        compare_tensors,
        fairseq_train_argv,
        launcher_command,
        train_in_process,
        train_in_subprocess,
        trained_tensors,
    )

    backend = "NCCL" if cuda else "gloo"
    name = f"1 vs 2 {'GPUs' if cuda else 'CPU processes'} ({backend}, {DISTRIBUTED_METHOD}, fp32)"
    print(f"\n[2] {name}", flush=True)
    if skip:
        report.add(Check(name, "skip", "--no-distributed"))
        return
    if cuda and gpus < 2:
        report.add(Check(name, "skip", f"{gpus} GPU visible: the comparison needs 2"))
        return
    one, two = setup.work / "dist-1", setup.work / "dist-2"
    launcher = launcher_command(setup, DISTRIBUTED_METHOD, update_freq=2, save=one, extra=NO_DROPOUT)
    first = train_in_process(fairseq_train_argv(launcher, setup.cpu), setup.work / "logs" / "dist-1.log")
    second = train_in_subprocess(
        launcher_command(setup, DISTRIBUTED_METHOD, nproc=2, save=two, extra=NO_DROPOUT),
        setup.work / "logs" / "dist-2.log",
    )
    failed = next((r for r in (first, second) if r.error), None)
    if failed is not None and failed.refused:
        raise refused_arguments(failed.refused, setup.extra)
    if failed is not None:
        report.add(Check(name, "fail", f"{failed.error} (log: {failed.log})"))
        return
    try:
        a, b = trained_tensors(one / "checkpoint_last.pt"), trained_tensors(two / "checkpoint_last.pt")
    except (OSError, KeyError, RuntimeError) as e:
        report.add(Check(name, "fail", f"no checkpoint to compare: {e}"))
        return
    ok, worst, where = compare_tensors(a, b, DISTRIBUTED_RTOL, DISTRIBUTED_ATOL)
    detail = (f"{len(a)} trained tensors after {setup.updates} updates, largest difference {worst:.3g} ({where}); "
              f"tolerance {DISTRIBUTED_ATOL:g} + {DISTRIBUTED_RTOL:g} |x|")  # fmt: skip
    report.add(Check(name, "pass" if ok else "fail", detail))


def timings(report, setup, device, args, batch, tokens):
    """Check 3: seconds per step against PEFT, and M-IDPG-PHM against prompt tuning."""
    import torch

    print("\n[3] seconds per step: ours against Hugging Face PEFT, M-IDPG-PHM against prompt tuning", flush=True)
    name = "timings against PEFT"
    if args.no_timings:
        report.add(Check(name, "skip", "--no-timings"))
        return
    if device.type == "cpu" and not args.cpu_timings:
        report.add(Check(name, "skip", "no GPU: timings run on a GPU (--cpu-timings times the CPU at this size)"))
        return
    try:
        import peft  # noqa: F401
    except ImportError:
        report.add(Check(name, "skip", "peft is not installed (pip install peft)"))
        return
    from fairseq_idpg.check_gpu.timing import SAME_WEIGHTS_ATOL, compare, load_backbone, ratios, same_weights_gap
    from fairseq_idpg.check_gpu.training import describe_error

    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # CPU time of one thread: the machine may be shared
    try:
        state, sizes, dictionary = load_backbone(setup.model)
        tokens_ = torch.randint(dictionary.nspecial, len(dictionary) - 1, (2, tokens))
        gap = same_weights_gap(setup.model, state, sizes, dictionary, tokens_)
        report.add(Check("same weights in fairseq and transformers", "pass" if gap <= SAME_WEIGHTS_ATOL else "fail",
                         f"fp32 logits differ by {gap:.2g} (tolerance {SAME_WEIGHTS_ATOL:g})"))  # fmt: skip
        del state
        precisions = [
            p for p in args.precisions if p != "bf16" or device.type == "cpu" or torch.cuda.is_bf16_supported()
        ]
        times, skipped = compare(setup.model, device, precisions, batch, tokens)
    except Exception as e:  # noqa: BLE001  (out of memory, a PEFT API change: a finding, not a crash)
        report.add(Check(name, "fail", describe_error(e)))
        return
    finally:
        torch.set_num_threads(threads)
    for t in times:
        report.seconds_per_update.append(Timing(t.name, t.precision, batch, tokens, t.seconds))
    for what, reason in skipped.items():
        report.add(Check(f"timing {what}", "skip", f"PEFT refused it: {reason}"))
    for label, ratio, goal in ratios(times):
        if goal is None:
            report.add(Check(f"timing {label}", "pass", f"{ratio:.3f} (no goal; informational)"))
            continue
        met = "met" if ratio <= goal else "NOT met"
        report.add(Check(f"timing {label}", "pass", f"{ratio:.3f} (goal <= {goal:g}: {met}; informational)"))
