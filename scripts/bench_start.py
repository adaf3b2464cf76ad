"""Where a fairseq-train process spends its CPU before its first update, each part timed in fresh interpreters
(the costs are paid once per process): importing torch and fairseq; building, stepping and saving fairseq's Adam as
torch alone would (its first ``add_param_group`` imports ``torch._dynamo``) and with the project's compat fix 16
(nothing imports the compiler); and fairseq's conversion of a command line into its config, with hydra's compose (as
fairseq alone) and with compat fix 17 (composed directly).

    python scripts/bench_start.py              # 3 fresh interpreters per part, the median CPU seconds
    python scripts/bench_start.py --repeats 5

Prints a markdown table (CPU seconds of the process: user + system) and the ratios fix / without it, for the optimizer
and the config.
"""

import argparse
import json
import statistics
import subprocess
import sys

CLOCK = "import time\nstart = time.process_time()\n"
DONE = "print(time.process_time() - start)\n"

IMPORT = CLOCK + "import fairseq_cli.train  # torch, fairseq, the compat fixes\n" + DONE

ADAM = """
import sys, time
import torch
from fairseq.optim.adam import Adam
if {torch_alone}:  # undo fix 16: torch's wrappers import torch._dynamo at their first call, as without the fix
    from fairseq_idpg_compat import dynamo_guarded
    for fn, _ in dynamo_guarded(torch.optim.Optimizer):
        setattr(fn, "__dynamo_disable", None)
p = torch.nn.Parameter(torch.zeros(1000))
start = time.process_time()
adam = Adam([p], lr=1e-3)
p.grad = torch.ones(1000)
adam.step()
adam.zero_grad()
adam.load_state_dict(adam.state_dict())
print(time.process_time() - start)
assert ("torch._dynamo" in sys.modules) == {torch_alone}
"""

CONFIG = """
import time
from fairseq import options
from fairseq.dataclass import utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
if {hydra_alone}:  # undo fix 17: hydra's compose, as fairseq alone
    utils.compose = utils.compose.hydra_compose
parser = options.get_training_parser()
args = options.parse_args_and_arch(parser, input_args=["data-bin/SST-2", "--arch", "roberta_base", "--task",
    "sentence_prediction", "--num-classes", "2", "--criterion", "sentence_prediction", "--optimizer", "adam",
    "--lr", "1e-5", "--lr-scheduler", "polynomial_decay", "--total-num-update", "100", "--max-update", "100"])
start = time.process_time()
convert_namespace_to_omegaconf(args)
print(time.process_time() - start)
"""

PARTS = {
    "import torch + fairseq": IMPORT,
    "fairseq's Adam: build, step, save (torch alone)": ADAM.format(torch_alone=True),
    "fairseq's Adam: build, step, save (compat fix 16)": ADAM.format(torch_alone=False),
    "fairseq's config from the command line (hydra's compose)": CONFIG.format(hydra_alone=True),
    "fairseq's config from the command line (compat fix 17)": CONFIG.format(hydra_alone=False),
}


def cpu_seconds(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode:
        sys.exit(f"bench_start.py: a part failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per part (default 3)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    medians = {}
    for name, code in PARTS.items():
        runs = [cpu_seconds(code) for _ in range(args.repeats)]
        medians[name] = statistics.median(runs)
        print(f"{name}: {', '.join(f'{s:.2f}' for s in runs)} s", file=sys.stderr, flush=True)
    print("| part of a fairseq-train start | CPU s (median of %d) |\n|---|---|" % args.repeats)
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} |")
    alone, fixed, hydra, composed = (medians[n] for n in list(PARTS)[1:5])
    print(f"\noptimizer, fix 16 / torch alone: {fixed:.2f} / {alone:.2f} s = {fixed / alone:.3f}")
    print(f"config, fix 17 / hydra's compose: {composed:.2f} / {hydra:.2f} s = {composed / hydra:.3f}")
    print(json.dumps({"cpu_seconds": medians}))


if __name__ == "__main__":
    main()
