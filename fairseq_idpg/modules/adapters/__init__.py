"""Layer-side blocks: adapters beside or after the sublayers of a frozen encoder layer.

- ``bottleneck.BottleneckAdapter``: the Houlsby adapter and He et al.'s parallel FFN adapter;
- ``compacter.CompacterAdapter``: the bottleneck with PHM projections (Compacter);
- ``adapted_layer.AdaptedEncoderLayer``: fairseq's encoder layer with the adapter slots.
"""
