"""Run fairseq-train on N devices keeping the papers' effective batch.

    python -m fairseq_idpg.launch --nproc 4 --total-batch 32 --batch-size 8 -- DATA --user-dir fairseq_idpg ...
    python -m fairseq_idpg.launch --total-batch 32 --update-freq 4 -- ...    # 8 per device, 4 accumulated

``--update-freq`` (gradient accumulation) and the per-device ``--batch-size`` are completed so
that ``nproc * batch_size * update_freq == total_batch`` (the batch the paper used): give either,
or neither (``batch_size = total_batch / nproc``). A run on 1, 2 or 8 GPUs, or on a small GPU
that accumulates, follows the same optimisation path (exactly so without dropout; dropout masks
differ per worker). ``--max-tokens`` among the fairseq-train flags caps a batch's tokens too: a
batch then holds at most ``batch_size`` sentences, so an update at most ``total_batch``. One process runs
``fairseq-train`` directly; several run it under torchrun (``torch.distributed.run``),
which fairseq detects through the environment (``--distributed-init-method env://``).
On CUDA the backend is NCCL with PyTorch DDP; without a GPU (or with ``--cpu``) it is gloo
with fairseq's ``legacy_ddp`` (PyTorch DDP on CPU refuses fairseq's ``device_ids``).
``scripts/train.sh`` is a thin wrapper.

Errors are one line (``scripts/train.sh: error: ...`` for the launcher's flags, ``fairseq-train: error:
...``), exit status 2, said once: one worker is fairseq-train itself; several each write the line they
refuse the run with to torchrun's error file (``fairseq_idpg_compat`` fix 10), and this process, torchrun's
agent, prints it once.
"""

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from fairseq_idpg.errors import has_flag, one_line_errors, refuse

FAIRSEQ_TRAIN = "fairseq-train"


def console_script(name, python=sys.executable):
    """``name`` (fairseq-train, fairseq-validate) of ``python``'s environment, else the one on PATH. Not
    ``python -m fairseq_cli.train``: as ``__main__`` the compatibility fixes of that module (one-line errors,
    task and criterion from the checkpoint) would not apply."""
    beside = Path(python).parent / name
    return str(beside) if beside.is_file() else name


def update_freq_for(total_batch, nproc, batch_size):
    per_update = nproc * batch_size
    if total_batch % per_update:
        raise ValueError(
            f"--total-batch {total_batch} is not a multiple of --nproc x --batch-size = "
            f"{nproc} x {batch_size} = {per_update}; choose them so that their product divides {total_batch}"
        )
    return total_batch // per_update


def layout(total_batch, nproc=1, batch_size=None, update_freq=None):
    """(per-device batch, update freq) with ``nproc * batch * freq == total_batch``; ValueError naming
    the flag when that cannot hold."""
    for flag, value in (("--total-batch", total_batch), ("--nproc", nproc)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--batch-size", batch_size), ("--update-freq", update_freq)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if batch_size is None:
        freq = 1 if update_freq is None else update_freq
        if total_batch % (nproc * freq):
            raise ValueError(
                f"--total-batch {total_batch} is not a multiple of --nproc x --update-freq = {nproc} x {freq}"
            )
        return total_batch // (nproc * freq), freq
    freq = update_freq_for(total_batch, nproc, batch_size)
    if update_freq is not None and update_freq != freq:
        raise ValueError(
            f"--nproc {nproc} x --batch-size {batch_size} x --update-freq {update_freq} = "
            f"{nproc * batch_size * update_freq}, not --total-batch {total_batch}"
        )
    return batch_size, freq


def build_command(train_args, nproc, total_batch, batch_size, cpu=None, master_port=None, python=sys.executable):
    """The command line (list) that runs fairseq-train as described in the module docstring."""
    for flag in ("--batch-size", "--update-freq", "--distributed-world-size"):
        if has_flag(train_args, flag):
            raise ValueError(f"{flag} is set by the launcher; give --batch-size/--total-batch/--nproc to it instead")
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if cpu is None:
        import torch

        cpu = has_flag(train_args, "--cpu") or not torch.cuda.is_available()
    args = list(train_args) + [
        "--batch-size",
        str(batch_size),
        "--update-freq",
        str(update_freq_for(total_batch, nproc, batch_size)),
    ]
    if cpu and not has_flag(args, "--cpu"):
        args.append("--cpu")
    train = console_script(FAIRSEQ_TRAIN, python)
    if nproc == 1:
        # fairseq's default world size is every visible GPU: on a machine with several, one process
        # would spawn one per GPU, each with --batch-size, and the effective batch would multiply
        return [train] + args + ["--distributed-world-size", "1"]
    if not has_flag(args, "--distributed-backend"):
        args += ["--distributed-backend", "gloo" if cpu else "nccl"]
    if not has_flag(args, "--ddp-backend"):
        args += ["--ddp-backend", "legacy_ddp" if cpu else "pytorch_ddp"]
    rdzv = (
        ["--standalone"] if master_port is None else ["--master_addr", "127.0.0.1", "--master_port", str(master_port)]
    )
    return [
        python,
        "-m",
        "torch.distributed.run",
        *rdzv,
        "--nproc_per_node",
        str(nproc),
        "--no-python",
        train,
    ] + args


def run_workers(cmd):
    """torchrun (``cmd``: ``python -m torch.distributed.run ...``) in this process. The line workers refused
    the run with (each writes it to torchrun's error file, compat fix 10) is printed once, exit status 2;
    any other failure keeps torchrun's report."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # the agent's log of a failed worker ("failed (exitcode: 2)", "Sending process ... closing signal") says
    # again what the one line or torchrun's report says
    agent = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    agent.addFilter(lambda record: not re.search(r"failed \(exitcode|closing signal", record.getMessage()))
    try:
        run(parse_args(cmd[3:]))
    except ChildFailedError as e:
        said = [f.message for f in e.failures.values() if f.exitcode == 2 and isinstance(f.message, str)]
        said = [line for line in said if line.startswith(f"{FAIRSEQ_TRAIN}: error: ")]
        if not said:
            raise
        return refuse(FAIRSEQ_TRAIN, said[0].split(": error: ", 1)[1])

    return 0


def main(argv=None):
    opts, cmd = resolve(sys.argv[1:] if argv is None else argv)
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if opts.dry_run:
        return 0
    if opts.nproc > 1:
        return run_workers(cmd)  # torchrun's agent in this process: signals reach it as they reached torchrun
    # become fairseq-train: a signal to this process (Ctrl-C, kill from run.sh) reaches training
    os.execvp(cmd[0], cmd)


def resolve(argv):
    """(the launcher's options, the command it runs) for its arguments; a bad one is a one-line error."""
    if "--" in argv:
        ours, train_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    else:
        ours, train_args = argv, []
    parser = argparse.ArgumentParser(prog="scripts/train.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nproc", type=int, default=int(os.environ.get("NPROC", 1)), help="devices (processes); default $NPROC or 1"
    )
    parser.add_argument("--total-batch", type=int, required=True, help="effective batch per update (the paper's)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="per-device batch (default: total / (nproc x update-freq))"
    )
    parser.add_argument(
        "--update-freq",
        type=int,
        default=None,
        help="batches accumulated per update (default: total / (nproc x batch-size))",
    )
    parser.add_argument("--cpu", action="store_true", help="force CPU (gloo) even if CUDA is available")
    parser.add_argument(
        "--master-port", type=int, default=None, help="rendezvous port (default: torchrun --standalone)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    one_line_errors(parser)
    opts = parser.parse_args(ours)
    if not train_args:
        parser.error("give the fairseq-train arguments after --")
    try:
        batch_size, _ = layout(opts.total_batch, opts.nproc, opts.batch_size, opts.update_freq)
        cmd = build_command(
            train_args, opts.nproc, opts.total_batch, batch_size, cpu=opts.cpu or None, master_port=opts.master_port
        )
    except ValueError as e:
        parser.error(str(e))
    return opts, cmd


if __name__ == "__main__":
    sys.exit(main())
