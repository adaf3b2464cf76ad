"""K fairseq-train runs in one process, meeting at each update for one fused forward and backward.

Each member runs fairseq-train's own loop (``fairseq_cli.train.main``) in a thread of its own: its data order
(its seed), its optimizer and lr schedule, gradient clipping, validation, checkpoint_best/last, early stop and
divergence are fairseq's, as in a lone run. Only the computation of a training step is shared: a member's
``task.train_step`` hands its batch to the group and waits; when every running member has handed one in, the
last to arrive runs ``StackedMembers`` over all the batches (one forward and one backward through the frozen
backbone), the members' losses on their own rows (``sentence_prediction``'s for all of them at once,
``criterion.py``; any other criterion called per member), and gives each member its loss, logging output and the
gradients of its own tensors, which its fairseq trainer then clips, normalises and steps on as usual. The
logging outputs' scalars come to the host in one copy for all members (``_logs_on_host``): fairseq's meters
then add Python numbers, not device tensors.

- One member thread runs at a time (``turn``; the fused step waits for every running member's batch anyway), so
  the members never compete for the device or the host's cores. fairseq's per-run state (its metrics'
  aggregators, ``save_checkpoint.best``, ``should_stop_early``'s best and patience) is each member thread's own:
  ``fairseq_idpg_compat`` (fix 18) keeps it per context, and each member's thread starts a run of its own
  (``new_run``); nothing is saved, swapped or restored between members. numpy's and torch's global generators are
  not per member either, and need not be: fairseq seeds torch's at every update (``Trainer._set_seed``) and draws
  its data order from generators of its own (``data_utils.numpy_seed``, its epoch iterators).
- A member finds its group through ``FUSED_MEMBER`` (``tasks/peft_sentence_prediction.py``), a context variable
  set in its thread: its task then hands the model it built to the group (``Member.joined``: it takes the group's
  frozen backbone) and each training step's batch (``Member.train_step``). fairseq-train's own ``main`` runs
  unchanged, with fairseq's own ``Trainer``.
- Member tensors live in the stacked ones: after each member has built its model and loaded its checkpoint,
  its trained parameters become views of their member's slice of the stacked tensors (``p.data = stacked[k]``),
  so what its optimizer writes is what the fused forward reads, and its validation and checkpoints see it.
- A member's frozen backbone is the first member's (shared as each member's model is built: one copy in memory).
- Batches of different sizes: a member's batch is padded to the longest sequence (masked pads) and to the most
  rows by repeating its first row; the extra rows' outputs are dropped before its criterion.
- A member that ends (its last update, early stop, divergence, an error) leaves; its slot then repeats another
  member's batch and nothing reads it.
- The fused step runs on one thread of the group's own (``_StepThread``), whichever member completes the round:
  the host allocator (glibc's malloc) gives each thread an arena of its own and keeps what a thread freed for
  that thread, so a step run by each member's thread in turn left a step's working memory (K members' activations)
  in each of the K arenas: host memory K^2 (e.g. 14.7 GB at K = 20 on the stand-in, CPU). One thread: one step's.
- Dropout: the fused step seeds torch from the members' seeds and updates, so a rerun draws the same masks;
  a member's masks are not those of its lone run (with dropout off, it computes what its lone run computes).
"""

import contextlib
import ctypes
import queue
import threading
import time

import torch

from fairseq_idpg.errors import ConfigError
from fairseq_idpg_compat import gradients_given, known_gradient_norm, takes_known_gradient_norm

from . import criterion as batched
from .stacked import StackedMembers


class Member:
    """One run of the group (module docstring): the model its task built, its trained parameters and the optimizer
    its trainer steps with, once it has them."""

    def __init__(self, group, index, seed):
        self.group, self.index, self.seed = group, index, seed
        self.model = self.criterion = self.optimizer = None
        self.params = []  # its trained parameters, in the stacked tensors' order
        self.update = 0

    def joined(self, model):
        """Its task built ``model``: the group's frozen backbone replaces the model's own (one copy in memory)."""
        first = next((m for m in self.group.members if m.model is not None), None)
        if first is not None:
            share_frozen(model, first.model)
        self.model = model
        self.params = [p for _, p in model.named_parameters() if p.requires_grad]
        if self.group.template is None:
            self.group.template = self.index

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """Its task's ``train_step``: the batch goes to the group's fused step; the gradients it returns become the
        member's, for its trainer to clip, normalise and step on as in a lone run."""
        model.train()
        model.set_num_updates(update_num)
        self.criterion, self.optimizer, self.update = criterion, optimizer, update_num
        loss, sample_size, logging_output, grads = self.group.step(self.index, sample)
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g
        gradients_given(optimizer)
        return loss, sample_size, logging_output


def share_frozen(model, template):
    """Make ``model``'s frozen tensors ``template``'s own (the same backbone: one copy in memory)."""
    own = dict(template.named_parameters(remove_duplicate=False))
    try:  # (the template may already be in fp16/bf16: the fingerprint's tolerance covers the rounding)
        model.check_backbone(template.backbone_fingerprint())
    except ConfigError:
        raise ConfigError("fused runs: the members' backbones differ; give every member the same --backbone") from None
    modules = dict(model.named_modules(remove_duplicate=False))
    for name, p in list(model.named_parameters(remove_duplicate=False)):
        if not p.requires_grad and name in own:
            owner, _, leaf = name.rpartition(".")
            modules[owner]._parameters[leaf] = own[name]
    release_freed_memory()


def release_freed_memory():
    """Give the host memory malloc holds free back to the system (glibc's ``malloc_trim``; elsewhere nothing).
    After a member's model took the shared backbone, its own (fairseq's random initialisation, freed) stays in its
    thread's malloc arena otherwise: about a third of a backbone per member."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


def glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


class FusedGroup:
    """The meeting point of K member threads (module docstring)."""

    def __init__(self, seeds, round_starts=None):
        self.members = [Member(self, i, s) for i, s in enumerate(seeds)]
        self.round_starts = round_starts  # a list: each fused step's start (time.perf_counter), for benchmarks
        self.k = len(seeds)
        self.turn_lock = threading.Lock()  # held by the one member thread that runs (``turn``)
        self.cond = threading.Condition()
        self.active = set(range(self.k))
        self.waiting = {}  # member index -> its prepared sample
        self.results = {}
        self.generation = 0
        self.stacked = None
        self.template = None  # the member whose model was built first: the others share its frozen tensors
        self.steps = 0
        self._probe, self._probe_round, self._probe_on = None, None, False  # count_round
        self._step_thread = None  # _StepThread, started by the first fused step

    def close(self):
        """Stop the group's step thread (when the members have ended)."""
        if self._step_thread is not None:
            self._step_thread.close()
            self._step_thread = None

    # ---------------------------------------------------------------- a member's thread
    @contextlib.contextmanager
    def turn(self, index):
        """Member ``index`` runs inside (holding ``turn_lock``: no other member runs meanwhile)."""
        self.turn_lock.acquire()
        self._count(True)
        try:
            yield
        finally:
            self._count(False)
            self.turn_lock.release()

    def count_round(self, round_index, count):
        """Count (``launches.ThreadsCount``) what every thread does in round ``round_index`` (0-based): from the
        start of its fused step to the start of the next one's, each member's update once (its optimizer step,
        logging, next batch) and the fused forward and backward."""
        self._probe, self._probe_round, self._probe_on = count, round_index, False

    def _count(self, on):
        if self._probe is not None and (self._probe_on or not on):
            self._probe.enter() if on else self._probe.exit()

    def leave(self, index):
        """Member ``index`` has ended: the others no longer wait for it (called without ``turn_lock``)."""
        with self.cond:
            self.active.discard(index)
            batches = self._claim()
        if batches is not None:
            with self.turn_lock:
                self._run_step(batches)

    def step(self, index, sample):
        """Member ``index``'s batch in; (loss, sample_size, logging_output, grads) out, once the group stepped.
        Called from the member's ``task.train_step``, holding ``turn_lock``; the last member to hand in its batch
        runs the fused step (still holding it: every other member is waiting)."""
        with self.cond:
            self.waiting[index] = sample
            generation = self.generation
            batches = self._claim()
        if batches is not None:
            self._run_step(batches)
        self._count(False)
        self.turn_lock.release()
        try:
            with self.cond:
                self.cond.wait_for(lambda: self.generation != generation)
                result = self.results.pop(index)
        finally:
            self.turn_lock.acquire()
            self._count(True)
        if isinstance(result, BaseException):
            raise result
        return result

    # ---------------------------------------------------------------- the fused step
    def _claim(self):
        """The batches of a complete round (every running member's), taken; else None. Under ``cond``."""
        if not self.waiting or len(self.waiting) != len(self.active):
            return None
        batches, self.waiting = self.waiting, {}
        return batches

    def _run_step(self, batches):
        if self.round_starts is not None:
            self.round_starts.append(time.perf_counter())
        if self._probe is not None and self.steps in (self._probe_round, self._probe_round + 1):
            self._probe_on = self.steps == self._probe_round
            self._count(self._probe_on)
        if self._step_thread is None:
            self._step_thread = _StepThread()
        try:
            results = self._step_thread.run(self._counted_step, batches)
        except BaseException as e:  # every waiting member sees the failure as its own step's
            results = {i: e for i in batches}
        with self.cond:
            self.results.update(results)
            self.generation += 1
            self.cond.notify_all()

    def _counted_step(self, batches):
        """The fused step, on the step thread: counted there too while ``count_round``'s round is on."""
        self._count(True)
        try:
            return self._fused_step(batches)
        finally:
            self._count(False)

    def _build_stacked(self):
        template = self.members[self.template].model
        states = [
            {n: p.detach() for n, p in m.model.named_parameters() if p.requires_grad} if m.model is not None else None
            for m in self.members
        ]
        fill = next(s for s in states if s is not None)
        self.stacked = StackedMembers(template, members=[s if s is not None else fill for s in states])
        for m in self.members:
            if m.model is None:
                continue
            for tensor, p in zip(self.stacked.tensors, m.params, strict=True):
                p.data = tensor.data[m.index]  # the member's optimizer now writes into the stacked tensor

    def _fused_step(self, waiting):
        if self.stacked is None:
            self._build_stacked()
        filler = next(iter(waiting.values()))
        samples = [waiting.get(i, filler) for i in range(self.k)]
        template = self.members[self.template]
        tokens, per_row, targets, rows = _stack_batches(samples, template.model.encoder.sentence_encoder.padding_idx)
        seed = sum(m.seed * 1_000_003 + m.update for m in self.members) % (2**31)
        self.steps += 1
        head = template.criterion.classification_head_name
        with torch.random.fork_rng(devices=[tokens.device] if tokens.is_cuda else []):
            torch.manual_seed(seed)
            template.model.train()
            logits = self.stacked(tokens, features_only=True, classification_head_name=head, **per_row)
        if targets is not None and batched.batched_for(template.criterion, template.model):
            results = self._members_loss(waiting, samples, logits, targets, rows)
        else:
            results = self._each_members_loss(waiting, logits, rows)
        out = {}
        for i, (loss, sample_size, logging_output) in results.items():
            grads = [t.grad[i] if t.grad is not None else None for t in self.stacked.tensors]
            out[i] = (loss.detach(), sample_size, logging_output, grads)
        return out

    def _loss_scales(self, indices):
        """Each member's fp16 loss scale (fairseq's dynamic loss scaler; 1 without one), 0 for a filler slot."""
        scales = [0.0] * self.k
        for i in indices:
            scaler = getattr(self.members[i].optimizer, "scaler", None)
            scales[i] = scaler.loss_scale if scaler is not None else 1.0
        return scales

    def _members_loss(self, waiting, samples, logits, targets, rows):
        """Every member's loss and logging output in one set of operators (``criterion.members_loss``), backward
        run; the logging values on the host in one copy."""
        template = self.members[self.template]
        losses, values = batched.members_loss(template.criterion, logits, targets, rows)
        scales = self._loss_scales(waiting)
        weighted = losses if all(s == 1.0 for s in scales) else losses * losses.new_tensor(scales)
        for t in self.stacked.tensors:
            t.grad = None
        weighted.sum().backward()
        knows_norm = {i for i in waiting if takes_known_gradient_norm(self.members[i].optimizer)}
        norms = [self._grad_norms()] if knows_norm else []
        host = torch.stack([losses.detach(), *(v.to(losses.dtype) for v in values.values()), *norms]).tolist()
        results = {}
        for i in waiting:
            if i in knows_norm:
                known_gradient_norm(self.members[i].optimizer, host[-1][i])
            own = {key: int(column[i]) for key, column in zip(values, host[1 : 1 + len(values)], strict=True)}
            log = batched.logging_output(host[0][i], samples[i], rows[i], own)
            results[i] = (losses[i], rows[i], log)
        return results

    def _grad_norms(self):
        """Each member's gradient norm [K] (fp32): the norm of its tensors' norms, as fairseq's ``clip_grad_norm_``
        computes it from the same gradients."""
        grads = [t.grad for t in self.stacked.tensors if t.grad is not None]
        norms = [torch.linalg.vector_norm(g.reshape(g.size(0), -1), dim=1, dtype=torch.float32) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms), dim=0)

    def _each_members_loss(self, waiting, logits, rows):
        """Each member's criterion on its own rows (any criterion), backward run."""
        total, results = None, {}
        for i, sample in waiting.items():
            member = self.members[i]
            output = _FixedOutput(member.model, logits[i, : rows[i]])
            loss, sample_size, logging_output = member.criterion(output, sample)
            scaler = getattr(member.optimizer, "scaler", None)
            scaled = scaler.scale(loss) if scaler is not None else loss
            total = scaled if total is None else total + scaled
            results[i] = (loss, sample_size, logging_output)
        for t in self.stacked.tensors:
            t.grad = None
        total.backward()
        _logs_on_host([log for _, _, log in results.values()])
        return results


class _StepThread:
    """One thread that runs every fused step (module docstring: one malloc arena holds the steps' memory, not
    one per member). ``run(fn, arg)`` runs ``fn(arg)`` there, in the caller's grad mode, autocast and CUDA device, and
    returns its result or raises its exception; the caller waits (it holds ``turn_lock``: nothing else runs)."""

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="fused-step", daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, arg, grad, device, autocast, box, done = job
            try:
                with contextlib.ExitStack() as stack:
                    stack.enter_context(torch.set_grad_enabled(grad))
                    if device is not None:
                        stack.enter_context(torch.cuda.device(device))
                    for kind, dtype in autocast:  # fairseq's --amp: its trainer's autocast, entered by the member
                        stack.enter_context(torch.autocast(kind, dtype=dtype))
                    box.append(fn(arg))
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                box.append(e)
                box.append(None)  # marks an exception
            finally:
                done.set()

    def run(self, fn, arg):
        device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        kinds = [kind for kind in ("cuda", "cpu") if torch.is_autocast_enabled(kind)]
        autocast = [(kind, torch.get_autocast_dtype(kind)) for kind in kinds]
        box, done = [], threading.Event()
        self._jobs.put((fn, arg, torch.is_grad_enabled(), device, autocast, box, done))
        done.wait()
        if len(box) == 2:
            raise box[0]
        return box[0]

    def close(self):
        self._jobs.put(None)
        self._thread.join()


def _logs_on_host(logging_outputs):
    """The members' logging-output scalars (device tensors: loss, correct counts, ...) as Python numbers, in one
    copy to the host per dtype, in place. fairseq's meters then sum them on the host; on the device each value of
    each member costs a few kernels an update (about 44 a member), and its log line reads each back anyway."""
    found = {}
    for log in logging_outputs:
        for key, value in log.items():
            if torch.is_tensor(value) and value.numel() == 1:
                found.setdefault(value.dtype, []).append((log, key, value))
    for items in found.values():
        values = torch.stack([v.detach().reshape(()) for _, _, v in items]).tolist()
        for (log, key, _), value in zip(items, values, strict=True):
            log[key] = value


class _FixedOutput:
    """Stands for a member's model in its criterion: returns the fused forward's rows of this member."""

    def __init__(self, model, logits):
        self._model, self._logits = model, logits
        self.training = True

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._logits, {}


def _stack_batches(samples, pad):
    """[K, B, T] tokens (each member's right-padded to the longest T, its rows repeated to the most B), the other
    per-row net_input tensors [K, B, ...] (src_lengths, IDPG's sentence_ids), the targets [K, B] (None without
    them), each member's own row count."""
    rows = [s["net_input"]["src_tokens"].size(0) for s in samples]
    most_rows = max(rows)
    longest = max(s["net_input"]["src_tokens"].size(1) for s in samples)

    def fill_rows(t):
        extra = most_rows - t.size(0)
        return t if extra == 0 else torch.cat([t, t[:1].expand(extra, *t.shape[1:])])

    tokens = []
    for s in samples:
        t = s["net_input"]["src_tokens"]
        t = torch.nn.functional.pad(t, (0, longest - t.size(1)), value=pad)
        tokens.append(fill_rows(t))
    keys = [k for k, v in samples[0]["net_input"].items() if torch.is_tensor(v) and k != "src_tokens"]
    per_row = {k: torch.stack([fill_rows(s["net_input"][k]) for s in samples]) for k in keys}
    targets = None
    if all(torch.is_tensor(s.get("target")) for s in samples):
        targets = torch.stack([fill_rows(s["target"].view(-1)) for s in samples])
    return torch.stack(tokens), per_row, targets, rows
