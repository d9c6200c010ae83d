"""gil_spin: pure-Python work per request, optionally spread over threads inside ``execute``.

A Python-backend instance is one stub process running one ``execute`` at a time, and inside it
the GIL lets one thread run Python bytecode at a time. So ``threads > 1`` cannot keep more than one
core busy, while a second instance (a second process, its own GIL) can run on a second core.
Each response says which stub ran it (PID) and how many cores its ``execute`` kept busy (CORES:
the process's CPU time over the wall time of the call).
"""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils


def spin(iterations, seed):
    """Pure-Python arithmetic: holds the GIL the whole time (no numpy, no sleep, no I/O)."""
    total = seed
    for i in range(iterations):
        total = (total * 31 + i) % 1000003
    return total


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})

        def param(key, default):
            return int(params.get(key, {}).get("string_value", default))

        self.iterations = param("spin_iterations", 100000)
        self.threads = max(1, param("threads", 1))
        self.pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def execute(self, requests):
        wall, cpu = time.perf_counter(), time.process_time()  # process_time: every thread of this stub
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        jobs = [(self.iterations * x.shape[0], int(x.reshape(-1)[0])) for x in inputs]
        if self.pool is None:
            results = [spin(n, seed) for n, seed in jobs]
        else:
            results = list(self.pool.map(lambda job: spin(*job), jobs))
        cores = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", np.full(x.shape, float(r), dtype=np.float32)),
                pb_utils.Tensor("PID", np.full((x.shape[0], 1), os.getpid(), dtype=np.int64)),
                pb_utils.Tensor("CORES", np.full((x.shape[0], 1), cores, dtype=np.float32)),
            ])
            for x, r in zip(inputs, results)
        ]

    def finalize(self):
        if self.pool is not None:
            self.pool.shutdown()
