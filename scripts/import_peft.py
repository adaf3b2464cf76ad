#!/usr/bin/env python3
"""Write a PEFT LoRA adapter, or an AdapterHub ``adapters`` adapter (Houlsby, Compacter, parallel, prefix
tuning, MAM), trained on the Hugging Face model of one of our backbones as our compact checkpoint of that
method, which fairseq-validate and the hub score. docs/using.md, "PEFT and adapters".

    python3 scripts/import_peft.py ADAPTER_DIR OUT.pt --backbone models/minilm-l6-fairseq/model.pt \
        --data data-bin/standin/SST-2

The adapter's rank, alpha, dropout and targets (query / value) become --lora-rank, --lora-alpha,
--lora-dropout and --lora-targets; its classification head (modules_to_save) our head. What our LoRA
cannot hold (other target modules, biases, rsLoRA, DoRA, per-layer ranks) is refused in one line.
An adapters folder (pytorch_adapter.bin or adapter.safetensors, as ``save_adapter(..., with_head=True)``
writes it) becomes the houlsby-adapter, compacter or mam-adapter record with its sizes as flags; gates, new
LayerNorms, other placements or non-linearities and other heads are refused in one line.
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
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"{args.out}: its folder does not exist")
    try:
        from fairseq_idpg.interop.files import check_output_file

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
    from fairseq_idpg.methods import METHODS

    if adapters_format.is_adapters_folder(args.adapter):
        hf = hf_backbone_for(args.backbone)
        method, _ = adapters_format.import_adapters(args.adapter, hf, args.backbone, args.data, args.out)
        print(f"wrote {args.out}: {method} from the adapters folder {args.adapter}")
        return 0
    config, _ = peft_format.read_peft(args.adapter)
    peft_format.lora_import_settings(config, args.adapter)  # before anything is built
    hf = hf_backbone_for(args.backbone)
    peft_format.import_peft(args.adapter, hf, METHODS["lora"], args.backbone, args.data, args.out)
    print(f"wrote {args.out}: lora (r {config['r']}) from {args.adapter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
