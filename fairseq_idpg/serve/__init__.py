"""Many trained tasks on one frozen backbone over HTTP (``python -m fairseq_idpg.serve``; docs/serving.md).

``app.build_app(model)`` is the ASGI app (FastAPI) of a ``fairseq_idpg.hub.MultiTaskModel``; ``batcher.Batcher``
gathers concurrent requests into one mixed-task batch; ``requests.parse`` reads and checks a request body.
"""
