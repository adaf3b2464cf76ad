"""The check's results: checks and timings, the table it prints, and the JSON file a sweep reads.

    {"device": "NVIDIA H100 80GB HBM3 x 2" | "cpu", "torch": "2.13.0", "cuda": "12.6" | null,
     "model": "roberta.large",
     "checks": [{"name": "fp16 lora", "status": "pass" | "fail" | "skip", "detail": "..."}, ...],
     "seconds_per_update": [{"method": "lora", "precision": "bf16", "batch_size": 16,
                             "tokens_per_sample": 128, "seconds": 0.21}, ...],
     "passed": true}

``passed`` is true when no check that ran failed (skipped ones do not count). In ``seconds_per_update``
a ``method`` that is a record name of ``fairseq_idpg.methods`` is fairseq-train's own figure (one update
of the trainer: forward, backward, optimizer, logging); ``step:NAME`` and ``peft:NAME`` are the
one-process comparison with Hugging Face PEFT (forward, backward and Adam on the trained parameters
only, the same loop for both).
"""

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

STATUSES = ("pass", "fail", "skip")


@dataclass
class Check:
    name: str
    status: str  # one of STATUSES
    detail: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"check status must be one of {', '.join(STATUSES)}, got {self.status!r}")


@dataclass
class Timing:
    method: str
    precision: str  # fp32, fp16, bf16
    batch_size: int
    tokens_per_sample: int
    seconds: float  # per update: wall (GPU, synchronised) or CPU time of the process (CPU)


@dataclass
class Report:
    device: str
    torch: str
    cuda: Optional[str]
    model: str
    checks: List[Check] = field(default_factory=list)
    seconds_per_update: List[Timing] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        print(f"  {check.status:4}  {check.name}: {check.detail}", flush=True)
        return check

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "torch": self.torch,
            "cuda": self.cuda,
            "model": self.model,
            "checks": [asdict(c) for c in self.checks],
            "seconds_per_update": [asdict(t) for t in self.seconds_per_update],
            "passed": self.passed,
        }

    def write(self, path) -> Path:
        """Written whole or not at all (a failed write is a ConfigError naming the file)."""
        from fairseq_idpg.files import write_json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.to_dict(), path)
        return path

    def table(self) -> str:
        """The checks, one line each, then the timings (the verdict line is ``verdict()``)."""
        width = max([len(c.name) for c in self.checks] + [5])
        lines = [f"{'check':{width}}  status  detail", f"{'-' * width}  ------  ------"]
        lines += [f"{c.name:{width}}  {c.status:6}  {c.detail}" for c in self.checks]
        if self.seconds_per_update:
            lines += ["", "seconds per update:"]
            lines += [
                f"  {t.method:24} {t.precision:5} batch {t.batch_size:3} x {t.tokens_per_sample:4} tokens  "
                f"{t.seconds * 1000:10.2f} ms"
                for t in self.seconds_per_update
            ]
        return "\n".join(lines)

    def verdict(self) -> str:
        counts = {s: sum(c.status == s for c in self.checks) for s in STATUSES}
        summary = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
        if self.passed:
            return f"GPU check PASSED on {self.device} ({summary})"
        failed = ", ".join(c.name for c in self.checks if c.status == "fail")
        return f"GPU check FAILED on {self.device} ({summary}): {failed}"
