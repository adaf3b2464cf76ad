"""Building blocks (prompt generators, PHM layers, LoRA, adapters, inducer attention), each usable alone."""
