"""Slots: the named points of a frozen fairseq module where trained blocks attach.

A host (``attention.augmented_self_attention.AugmentedSelfAttention``,
``adapters.adapted_layer.AdaptedEncoderLayer``) declares its slots and, in its forward pass, calls
whatever is attached to each one in the slot's own way (``SLOTS``); it never names a block. Which
block attaches where is data declared by the block (``fairseq_idpg/blocks/``).

| slot               | host      | call                                                                  |
|--------------------|-----------|-----------------------------------------------------------------------|
| ``keys_values``    | attention | ``P_k, P_v = block.layer_kv(layer_index)``: [l, d] each, prepended to |
|                    |           | the keys and values, never masked (prefix tuning)                     |
| ``q``, ``k``, ``v``| attention | ``y = block.project(x, y)``: the projection's input x and output y,   |
|                    |           | [T, B, d] (LoRA adds (alpha / r) B A x; (IA)^3 scales y by l)         |
| ``attention_output``| attention| ``ctx, delta = block.attend(q, ctx, scores, raw_scores, probs, pad,   |
|                    |           | scaling)``: may change the heads' context [B, H, T, d_h] and add      |
|                    |           | ``delta`` [T, B, d] (or None) to the output projection (inducer);     |
|                    |           | attaching one makes the attention compute its scores explicitly       |
| ``after_attention``| layer     | ``h = h + block(h)``: after the attention's output projection and     |
|                    |           | dropout, before the residual and LayerNorm (sequential adapter)       |
| ``ffn``            | layer     | ``out = out + block(x)``: beside the FFN, from its input x (parallel) |
| ``ffn_inner``      | layer     | ``h = block(h)``: the FFN's inner activations [T, B, d_ffn], after    |
|                    |           | the activation and its dropout, before fc2 ((IA)^3)                   |
| ``after_ffn``      | layer     | ``h = h + block(h)``: after the FFN and its dropout (sequential)      |
| ``layer_output``   | layer     | ``h = block(h, padding_mask)``: the layer's output [T, B, d], after   |
|                    |           | its final LayerNorm; [B, T] mask, True at padding (LoReFT)            |

A block attached with a ``name`` is a submodule under that name (its tensors train and are saved as
``<host>.<name>.*``, e.g. ``...self_attn.lora_q.A``); one attached with ``owned=False`` belongs to
another module (the model's shared prefix encoder) and is only referenced.
"""

ATTENTION_SLOTS = ("keys_values", "attention_output", "q", "k", "v")
LAYER_SLOTS = ("after_attention", "ffn", "ffn_inner", "after_ffn", "layer_output")
# the order blocks are built in, layer by layer (what fixes their random initialisation): the order
# of the first slot each block attaches to; "biases" (BitFit) trains backbone tensors, no module
SLOT_ORDER = (
    "keys_values", "attention_output", "q", "k", "v", "after_attention", "after_ffn", "ffn", "ffn_inner", "layer_output"
)  # fmt: skip
SLOTS = (*SLOT_ORDER, "biases")


class Slots:
    """Mixin of a host module: ``attach``, ``detach`` and ``attached`` (module docstring)."""

    SLOTS = ()

    def init_slots(self):
        self.slots = {slot: [] for slot in self.SLOTS}  # slot -> attribute names, in attaching order

    def attach(self, slot, name, block, owned=True):
        """Attach ``block`` to ``slot`` as attribute ``name`` (a submodule unless ``owned=False``)."""
        if slot not in self.slots:
            raise ValueError(f"{type(self).__name__} has no slot {slot!r}; its slots: {', '.join(self.slots)}")
        if owned:
            setattr(self, name, block)
        else:
            self.__dict__[name] = block  # a plain reference: not a submodule, not in the state dict
        self.slots[slot].append(name)
        return block

    def detach(self, name):
        """Take the block ``name`` out of its slot and of this module (e.g. once merged into a weight)."""
        for names in self.slots.values():
            if name in names:
                names.remove(name)
        if name in self._modules:
            self._modules[name] = None  # the attribute stays, as None
        else:
            self.__dict__.pop(name, None)

    def attached(self, slot):
        """The blocks attached to ``slot``, in attaching order."""
        return [getattr(self, name) for name in self.slots[slot] if getattr(self, name, None) is not None]
