"""M-IDPG's generated prompts (IDPG Eq. 2-4, section 3.2.2) at position 0 with the generator's weight
gradients taken once per backward, over every layer's rows, not once per layer.

One generator G (shared W1, b1, W2; bias c_k, k = l in the M version, 0 in the S version) makes the
inserted prompt P_0 from u = Dropout(M(x)) and, after layer l = 1..L-1, the prompt added at the slots
1..t of the hidden states x_l [T', B, d] (T' = T + t):

    s_l  = x_l[<s>]  ("previous" input)  or  u  ("first" input)         [B, d_in]
    z_l  = s_l W1 + b1,   h_l = Dropout(GELU(z_l))                      [B, m]
    P_l  = h_l W2 + c_k                                                 [B, t*d]
    x_l' = x_l + pad(P_l)   (P_l at rows 1..t, 0 elsewhere)

Autograd alone differentiates every use of the weights on its own: per layer a product and a sum for
each weight's gradient and an add that accumulates it (some ten operators a layer, the excess of
M-IDPG's launches over prompt tuning's; docs/launches.md). Their gradients are sums over the uses:

    dW1 = sum_l s_l^T dz_l = S^T dZ,   db1 = 1^T dZ,   dW2 = H^T dP,   dc_k = sum_{l: k} 1^T dP_l

with S, dZ, H, dP the uses' rows stacked: one product each, once per backward. Here each use is one
operator (``_GeneratedPrompt``) whose backward gives its input's gradient only and keeps its rows on a
``_Tape``; the weights reach every use through ``_Weights``, an identity whose backward runs after all
of the uses' (autograd waits for every consumer) and forms the stacked products from the tape.

A use also computes in fewer operators than the generic path (the same sums, added in another order):

- x_l + pad(c_k) is one add of the biases padded once per forward (``Cpad`` [K, T', 1, d]), and h_l W2
  is then added at the slots in place by one batched product (the slots are rows 1..t of x_l: one
  contiguous block of the [T', B, d] states);
- the <s> row's gradient (dx_l[<s>] += dz_l W1^T, "previous" input) is one in-place product into a
  copy of the incoming gradient (autograd: a product, a zero-filled select backward and an add);
- dropout is one ``native_dropout`` (CUDA's kernel; on the CPU it draws what ``F.dropout`` draws).

Under ``torch.func.vmap`` (fused members, ``fairseq_idpg/fused``) the two operators' vmap rules run every
member at once as runs R (a leading dimension of every tensor here; 1 for a model alone): one operator for
all members, as vmap runs the generic path's. Under other ``torch.func`` transforms the model takes the generic
path (``applies``; ``roberta_idpg``). ``tests/test_idpg_model.py`` compares logits and every gradient with it,
alone and fused.
"""

import torch
import torch.nn.functional as F

Vmap = torch._C._functorch.TransformType.Vmap


def applies():
    """Whether these operators can run here: plain autograd, or one ``torch.func.vmap`` (the fused members:
    their vmap rules run the members as runs R, below); not under ``grad``, ``jvp`` or nested transforms."""
    stack = torch._C._functorch.get_interpreter_stack()
    return stack is None or (len(stack) == 1 and stack[0].key() == Vmap)


class _Tape:
    """One forward's uses: ``rows[use]`` = (s, dz, h, dP), each [R, B, .], written by each use's backward."""

    def __init__(self, bias_index):
        self.bias_index = list(bias_index)  # k of each use
        self.rows = {}


# Every tensor below has a leading dimension R, the runs: 1 for a model alone; under vmap, the members (each
# member's [1, ...] tensors, stacked by the vmap rules: one operator for every member, as vmap would run it).
def _runs(tensor, dim, size):
    """``tensor`` [1, ...] per member, batched by vmap at ``dim`` (None: the same for all), as [size, ...]."""
    if tensor is None:
        return None
    tensor = tensor.expand(size, *tensor.shape) if dim is None else tensor.movedim(dim, 0)
    return tensor.flatten(0, 1)


def _members(tensor, size):
    return tensor.unflatten(0, (size, tensor.size(0) // size))


class _Weights(torch.autograd.Function):
    """(W1 [R, d_in, m], b1 [R, m], W2 [R, m, t*d], C [R, K, t*d]) as they are, and the biases padded to the
    hidden states' rows, Cpad [R, K, T', 1, d] (c_k at rows 1..t, zeros elsewhere). Backward: the weights'
    gradients from the tape (module docstring), plus whatever reached the outputs by other operators."""

    @staticmethod
    def forward(tape, length, t, W1, b1, W2, C):
        runs, count, size = C.shape
        Cpad = F.pad(C.view(runs, count, t, 1, size // t), (0, 0, 0, 0, 1, length - 1 - t))
        return W1.view_as(W1), b1.view_as(b1), W2.view_as(W2), C.view_as(C), Cpad

    @staticmethod
    def setup_context(ctx, inputs, output):
        tape, _, t, *_, C = inputs
        ctx.tape, ctx.t, ctx.count = tape, t, C.size(1)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, gW1, gb1, gW2, gC, gCpad):
        tape = ctx.tape
        if tape.rows:
            uses = sorted(tape.rows)
            S, dZ, H, dP = (torch.cat(rows, dim=1) for rows in zip(*(tape.rows[u] for u in uses), strict=True))
            tape.rows = {}  # freed here; a second backward (retain_graph) writes them again
            dc = _bias_gradients(dP, [tape.bias_index[u] for u in uses], ctx.count)
            gW1, gb1 = _plus(gW1, S.transpose(1, 2) @ dZ), _plus(gb1, dZ.sum(1))
            gW2, gC = _plus(gW2, H.transpose(1, 2) @ dP), _plus(gC, dc)
        if gCpad is not None:
            gC = _plus(gC, gCpad[:, :, 1 : 1 + ctx.t].flatten(2))
        return None, None, None, gW1, gb1, gW2, gC

    @staticmethod
    def vmap(info, in_dims, tape, length, t, *weights):
        runs = [_runs(w, dim, info.batch_size) for w, dim in zip(weights, in_dims[3:], strict=True)]
        out = _Weights.apply(tape, length, t, *runs)
        return tuple(_members(o, info.batch_size) for o in out), (0,) * len(out)


def _plus(a, b):
    return b if a is None else a + b


def _bias_gradients(dP, index, count):
    """dc [R, K, t*d] from the uses' stacked dP [R, n*B, t*d] and each use's bias index (M version: use l reads
    c_l, one sum over each use's rows; S version: every use reads c_0, one sum over all rows)."""
    runs, n = dP.size(0), len(index)
    per_use = dP.view(runs, n, -1, dP.size(2))
    if index == list(range(count)):
        return per_use.sum(2)
    if count == 1:
        return dP.sum(1, keepdim=True)
    rows = torch.tensor(index, device=dP.device)
    return dP.new_zeros(runs, count, dP.size(2)).index_add_(1, rows, per_use.sum(2))


class _GeneratedPrompt(torch.autograd.Function):
    """One use of G (module docstring), for R runs: with ``x`` None, P_0 [R, B, t, d] from ``inp``; else x_l'
    [R, T', B, d] from x_l [R, T', B, d] and the generator input ``inp`` [R, B, d_in] (None: x_l[<s>], the
    previous-layer input). ``bias``: C [R, K, t*d] for P_0, Cpad [R, K, T', 1, d] for x_l'; ``k``: the bias
    row; ``p``: the dropout probability (0: none). Also returns z, h and the dropout mask (not differentiable:
    for the backward)."""

    @staticmethod
    def forward(tape, use, k, p, t, x, inp, W1, b1, W2, bias):
        s = x[:, 0] if inp is None else inp
        z = torch.baddbmm(b1.unsqueeze(1), s, W1)
        h = F.gelu(z)
        mask = torch.empty(h.size(0), 0, dtype=torch.bool, device=h.device)  # none (an allocation: no launch)
        if p > 0:
            h, mask = torch.native_dropout(h, p, True)
        runs, m, size = W2.shape
        d = size // t
        if x is None:
            return torch.baddbmm(bias[:, k].unsqueeze(1), h, W2).view(runs, -1, t, d), z, h, mask
        out = x + bias[:, k]  # c_k at rows 1..t, zeros elsewhere
        if runs == 1:  # h W2 into rows 1..t ([t, B, d], contiguous) in place: one product per slot, batched
            out[0, 1 : 1 + t].baddbmm_(h[0].expand(t, -1, -1), W2[0].view(m, t, d).transpose(0, 1))
        else:  # several runs: rows 1..t of each are not one batch of matrices
            out[:, 1 : 1 + t] += torch.bmm(h, W2).view(runs, -1, t, d).transpose(1, 2)
        return out, z, h, mask

    @staticmethod
    def setup_context(ctx, inputs, output):
        tape, use, _, p, t, x, inp, W1, _, W2, _ = inputs
        _, z, h, mask = output
        ctx.tape, ctx.use, ctx.p, ctx.t, ctx.first, ctx.from_x = tape, use, p, t, x is None, inp is None
        ctx.mark_non_differentiable(z, h, mask)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x if inp is None else inp, W1, W2, z, h, mask)

    @staticmethod
    def backward(ctx, g, *_):
        s, W1, W2, z, h, mask = ctx.saved_tensors
        if ctx.from_x:
            s = s[:, 0]
        runs, bsz, t = h.size(0), h.size(1), ctx.t
        if g is None:  # nothing reached this use: no rows (zero gradients)
            return (None,) * 11
        # dP [R, B, t*d]: P_0's gradient as it is; x_l''s rows 1..t ([R, t, B, d]) in P's layout
        dP = (g if ctx.first else g[:, 1 : 1 + t].transpose(1, 2)).reshape(runs, bsz, -1)
        dh = torch.bmm(dP, W2.transpose(1, 2))
        if ctx.p > 0:
            dh = torch.ops.aten.native_dropout_backward(dh, mask, 1.0 / (1.0 - ctx.p) if ctx.p < 1 else 0.0)
        dz = torch.ops.aten.gelu_backward(dh, z)
        ctx.tape.rows[ctx.use] = (s, dz, h, dP)
        dx = dinp = None
        if not ctx.first and ctx.needs_input_grad[5]:
            if ctx.from_x:  # the <s> row is the generator's input too: dx[<s>] += dz W1^T, in place
                dx = g.clone()
                dx[:, 0].baddbmm_(dz, W1.transpose(1, 2))
            else:
                dx = g
        if not ctx.from_x and ctx.needs_input_grad[6]:
            dinp = torch.bmm(dz, W1.transpose(1, 2))
        return None, None, None, None, None, dx, dinp, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, tape, use, k, p, t, *tensors):
        if p > 0 and info.randomness != "different":
            raise RuntimeError(
                f"M-IDPG's generator dropout under vmap needs randomness='different', got {info.randomness!r}"
            )
        n = info.batch_size
        out = _GeneratedPrompt.apply(
            tape, use, k, p, t, *(_runs(a, d, n) for a, d in zip(tensors, in_dims[5:], strict=True))
        )
        return tuple(_members(o, n) for o in out), (0,) * len(out)


class GeneratedPrompts:
    """The prompts of one forward of a multi-layer IDPG model with one generator (S and M versions) at
    position 0: ``first()`` P_0 [B, t, d]; ``add_after_bos(l, x)`` x [B, T', d] with P_l added at rows
    1..t (``prompts.encoder.prompted_features`` calls it after layer l); ``self(l, x)`` P_l [B, t, d] by
    the generator's own operators (for a caller that adds it itself), its weight gradients summed with the
    rest.

    Args:
        generator: the ``PromptGenerator``.
        bias_index: k of each use 0..L-1 (c_k of layer l).
        u: Dropout(M(x)) [B, d_in].
        length: T' = T + t, the prompted rows' length.
        previous: the generator input after layer l is x_l[<s>] (else u).
    """

    def __init__(self, generator, bias_index, u, length, previous=True):
        self.generator, self.u, self.previous = generator, u, previous
        self.tape = _Tape(bias_index)
        self.t = generator.t
        dtype = u.dtype
        weights = [w.to(dtype).unsqueeze(0) for w in (*generator.weights(), generator.biases())]  # one run: [1, ...]
        self.W1, self.b1, self.W2, self.C, self.Cpad = _Weights.apply(self.tape, length, self.t, *weights)
        self.p = generator.dropout.p if generator.dropout.training else 0.0  # what nn.Dropout draws

    def _apply(self, use, x, inp, bias):
        k = self.tape.bias_index[use]
        out = _GeneratedPrompt.apply(self.tape, use, k, self.p, self.t, x, inp, self.W1, self.b1, self.W2, bias)[0]
        return out.squeeze(0)  # not [0]: a select's backward writes a zero-filled gradient

    def first(self):
        """P_0 [B, t, d] from u (inserted at the input)."""
        return self._apply(0, None, self.u.unsqueeze(0), self.C)

    def add_after_bos(self, l, x):
        """x [B, T', d] (a layer's output, batch first) with P_l added at rows 1..t."""
        inp = None if self.previous else self.u.unsqueeze(0)
        return self._apply(l, x.transpose(0, 1).unsqueeze(0), inp, self.Cpad).transpose(0, 1)

    def __call__(self, l, x):
        """P_l [B, t, d] after layer l (x [B, T', d]) by the generator's own operators."""
        inp = x[:, 0] if self.previous else self.u
        weights = (self.W1.squeeze(0), self.b1.squeeze(0), self.W2.squeeze(0))
        return self.generator(inp, self.tape.bias_index[l], weights=weights, biases=self.C.squeeze(0).unbind(0))
