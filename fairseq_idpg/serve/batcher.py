"""Concurrent requests gathered into one mixed-task batch under a small latency budget.

A request's rows wait in a queue; the batcher takes the first waiting request, then whatever else arrives
within ``max_wait`` seconds (or until ``max_rows`` rows), and runs them all as one batch of the multi-task model
(one pass per method group present), in a worker thread so that the server keeps accepting requests. One batch
runs at a time: the model's passes already use every core.
"""

import asyncio


class Batcher:
    """``await batcher.submit(names, rows)`` -> each row's logits; ``rows``: token tensors (``model.encode``)."""

    def __init__(self, model, max_rows=64, max_wait=0.005):
        self.model, self.max_rows, self.max_wait = model, max_rows, max_wait
        self.batches = self.requests = 0  # served so far (the health route reports them)
        self._queue = None
        self._worker = None

    async def start(self):
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    async def stop(self):
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    async def submit(self, names, rows):
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((names, rows, future))
        return await future

    async def _gather(self):
        """The first waiting request and what joins it within the budget."""
        batch = [await self._queue.get()]
        rows = len(batch[0][1])
        deadline = asyncio.get_running_loop().time() + self.max_wait
        while rows < self.max_rows:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except TimeoutError:
                break
            rows += len(batch[-1][1])
        return batch

    async def _run(self):
        while True:
            batch = await self._gather()
            names = [n for item in batch for n in item[0]]
            rows = [r for item in batch for r in item[1]]
            try:
                logits = await asyncio.to_thread(self.model.logits_of_tokens, names, rows)
            except Exception as error:  # the requests fail, the server goes on
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            self.batches += 1
            self.requests += len(batch)
            start = 0
            for item_names, _, future in batch:
                if not future.done():  # a client that went away cancelled its future
                    future.set_result(logits[start : start + len(item_names)])
                start += len(item_names)
