"""``python -m fairseq_idpg.serve --backbone PATH --task NAME=RUN [--task NAME=RUN ...]``: serve every task on
one frozen backbone over HTTP (docs/serving.md). A bad flag or a run that cannot attach is one line, exit 2."""

import argparse
import socket
import sys

from fairseq_idpg.errors import ConfigError


def parser():
    p = argparse.ArgumentParser(prog="python -m fairseq_idpg.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", required=True, metavar="PATH", help="the frozen backbone (fairseq checkpoint)")
    p.add_argument("--task", action="append", required=True, metavar="NAME=RUN", help="a run folder or checkpoint")
    p.add_argument("--task-data", action="append", default=[], metavar="NAME=DATA", help="a task's prepared data")
    p.add_argument("--bpe", help="the BPE (default: the one each checkpoint records), e.g. wordpiece or gpt2")
    p.add_argument("--wordpiece-vocab", metavar="PATH", help="vocab.txt of --bpe wordpiece (the stand-in's)")
    p.add_argument("--gpt2-encoder-json", metavar="PATH", help="encoder.json of --bpe gpt2")
    p.add_argument("--gpt2-vocab-bpe", metavar="PATH", help="vocab.bpe of --bpe gpt2")
    p.add_argument("--device", default="cpu", help="where the backbone and tasks live (cpu, cuda, cuda:1, ...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a request waits for others to batch")
    p.add_argument("--max-batch-rows", type=int, default=64, help="a batch's rows beyond which it waits no longer")
    p.add_argument("--max-request-rows", type=int, default=256, help="sentences one request may hold")
    return p


def pairs(p, values, flag):
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            p.error(f"{flag} {value}: expected NAME=PATH")
        if name in out:
            p.error(f"{flag} {value}: task {name} given twice")
        out[name] = path
    return out


def build_model(p, args):
    from fairseq_idpg.hub import MultiTaskModel

    options = {k: getattr(args, k) for k in ("bpe", "wordpiece_vocab", "gpt2_encoder_json", "gpt2_vocab_bpe")}
    model = MultiTaskModel(args.backbone, device=args.device, **{k: v for k, v in options.items() if v})
    runs, data = pairs(p, args.task, "--task"), pairs(p, args.task_data, "--task-data")
    for name in sorted(set(data) - set(runs)):
        p.error(f"--task-data {name}=...: no --task {name}")
    for name, run in runs.items():
        try:
            model.attach(name, run, data=data.get(name))
        except (ConfigError, OSError, RuntimeError, ValueError) as error:
            p.error(f"task {name}: {error}" if f"task {name}" not in str(error) else str(error))
    return model


def main(argv=None):
    import uvicorn

    from .app import build_app
    from .requests import Limits

    p = parser()
    args = p.parse_args(argv)
    if args.max_wait_ms < 0 or args.max_batch_rows < 1 or args.max_request_rows < 1:
        p.error("--max-wait-ms must be >= 0, --max-batch-rows and --max-request-rows >= 1")
    model = build_model(p, args)
    for name, task in model.describe().items():
        print(f"task {name}: {task['arch']}, pass {task['group']}", file=sys.stderr)
    limits = Limits(max_rows=args.max_request_rows)
    app = build_app(model, limits, args.max_batch_rows, args.max_wait_ms / 1000)
    listening = socket.create_server((args.host, args.port))  # bound here: --port 0 takes a free port to print
    host, port = listening.getsockname()[:2]
    print(f"serving {len(model.tasks)} tasks on http://{host}:{port}", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listening])


if __name__ == "__main__":
    main()
