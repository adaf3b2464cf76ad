#!/usr/bin/env python3
"""Write a PEFT LoRA or VeRA adapter, or an AdapterHub ``adapters`` adapter (Houlsby, Compacter, parallel, prefix
tuning, MAM), trained on the Hugging Face model of one of our backbones as our compact checkpoint of that
method, which fairseq-validate and the hub score. docs/using.md, "PEFT and adapters".

    python3 scripts/import_peft.py ADAPTER_DIR OUT.pt --backbone models/minilm-l6-fairseq/model.pt \
        --data data-bin/standin/SST-2

The adapter's rank, alpha, dropout and targets (query / value) become --lora-rank, --lora-alpha,
--lora-dropout and --lora-targets (rsLoRA's alpha / sqrt(r) as --lora-alpha alpha sqrt(r)); its classification
head (modules_to_save) our head; use_dora and init_lora_weights "pissa" import as the dora and pissa records
(--lora-dora, --lora-init pissa). What our LoRA cannot hold (other target modules, biases, per-layer ranks, other
trained modules, a base changed otherwise, such as a randomised SVD's residual) is refused in one line naming the
field.
A PEFT VeRA adapter becomes the vera record (r, projection_prng_key, vera_dropout, d_initial and targets as
--vera-rank, --vera-seed, --vera-dropout, --vera-d-initial, --vera-targets); stored projections must be the
draw of projection_prng_key.
An adapters folder (pytorch_adapter.bin or adapter.safetensors, as ``save_adapter(..., with_head=True)``
writes it) becomes the houlsby-adapter, compacter, prefix-tuning or mam-adapter record with its sizes as flags
(a parallel adapter alone: the parallel FFN adapter's flags alone); gates, new LayerNorms, other placements or
non-linearities and other heads are refused in one line.
The adapter's base model (base_model_name_or_path, adapters' model_name, or the weights digest our export
writes beside it) must be --backbone's; --ignore-base-model imports it onto another backbone anyway.
"""

import argparse
import os
import sys

from fairseq_idpg.errors import ConfigError, one_line_errors, refuse


def main(argv=None):
    parser = one_line_errors(argparse.ArgumentParser(prog="import_peft.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("adapter", metavar="ADAPTER_DIR", help="a PEFT or adapters folder (adapter_config.json, ...)")
    parser.add_argument("out", metavar="OUT", help="the checkpoint to write")
    parser.add_argument("--backbone", metavar="PATH", required=True, help="our fairseq backbone (model.pt)")
    parser.add_argument("--data", metavar="DIR", required=True, help="the prepared task folder (data-bin/...)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace OUT if it exists (never a file this reads), atomically"
    )
    parser.add_argument(
        "--ignore-base-model",
        action="store_true",
        help="import although the adapter names another base model than --backbone (you vouch for the weights)",
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"{args.out}: its folder does not exist")
    try:
        from fairseq_idpg.files import check_output_file

        check_output_file(args.out, inputs(args), args.overwrite)
        return run(args)
    except ConfigError as e:
        return refuse(parser.prog, e)


def inputs(args):
    """The files this reads: the adapter's, the backbone, the data's."""
    files = [args.backbone]
    for folder in (args.adapter, args.data):
        for root, _, names in os.walk(folder):
            files += [os.path.join(root, name) for name in names]
    return files


def run(args):
    from fairseq_idpg.interop import adapters_format, peft_format
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    hf = hf_backbone_for(args.backbone)
    if adapters_format.is_adapters_folder(args.adapter):
        method, _ = adapters_format.import_adapters(
            args.adapter, hf, args.backbone, args.data, args.out, any_base=args.ignore_base_model
        )
        print(f"wrote {args.out}: {method} from the adapters folder {args.adapter}")
        return 0
    method, rank = peft_format.import_peft(
        args.adapter, hf, args.backbone, args.data, args.out, any_base=args.ignore_base_model
    )
    print(f"wrote {args.out}: {method} (r {rank}) from {args.adapter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
