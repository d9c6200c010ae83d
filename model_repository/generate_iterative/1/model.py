"""generate_iterative: PROMPT + MAX_TOKENS -> MAX_TOKENS responses, one token per EXECUTION (continuous batching).

Each ``execute`` is ONE step: one forward pass of the character model over every request the
iterative sequence batcher handed in, one token streamed to each, then each unfinished request is
released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` (python_backend README "Request
Rescheduling" at r24.10: a decoupled model must set it before ``execute`` returns). The scheduler
re-enqueues it for the next step; a request admitted meanwhile joins that step. The last token goes
out with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` and the request is released normally: the
iterative sequencer then enqueues a null END request for its correlation ID, which frees its
sequence slot (core ``sequence_utils.cc`` 40-56 at r24.10).

Cancellation: a request whose client went away is handed back with RESCHEDULE too, with no token
and no FINAL. Released normally it would free nothing: the sequencer skips the END request for a
cancelled request (``sequence_utils.cc`` 43), so its slot would wait for the idle reaper
(``max_sequence_idle_microseconds``, 5 s here). Rescheduled, it is back at the head of its slot's
queue, where the batcher finds it cancelled and frees the slot before forming the next step
(``sequence_batch_scheduler.cc`` 1644-1656); the core answers it CANCELLED (84-97). The check comes
after the step's compute: a request spends nearly all its time inside a step, so that is where a
cancel lands (one that lands while it waits in its slot is found by the batcher itself).

State between steps lives here, keyed by the correlation ID the iterative sequencer gave the
request (core ``sequence_utils.h`` 78-90 at r24.10): the text so far and the step count.

Null requests: the ``direct`` strategy fills an empty slot below the highest busy one with a null
request whose inputs are garbage; its READY control input is 0, and it is skipped (no response).

The model's own records travel with every token: EXEC (this instance's execution counter), STEP
(the token's index in its request), BATCH (how many requests this step's forward pass held) and
NULLS (how many null requests this execution carried, skipped).

Cost: the network is tiny (microseconds). A real LLM's step costs milliseconds, mostly reading its
weights once per step whatever the batch, plus a little per sequence. So a step here lasts
``step_ms + per_sequence_ms * B`` (config parameters): the real forward pass, then a sleep for the
rest. Same arithmetic and same cost as generate_static: only the scheduling differs.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
CONTEXT = 24  # lab_backends/charlm/net.py CONTEXT


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.step_s = float(params.get("step_ms", "6")) / 1000
        self.per_sequence_s = float(params.get("per_sequence_ms", "0.5")) / 1000
        self.limit = int(params.get("max_tokens_limit", "256"))
        folder = os.path.join(args["model_repository"], args["model_version"])
        with np.load(os.path.join(folder, "charlm.npz"), allow_pickle=False) as data:
            self.w = {k: data[k] for k in data.files}
        self.vocab = "".join(self.w.pop("vocab").tolist())
        self.index = {c: i for i, c in enumerate(self.vocab)}
        self.live = {}  # correlation ID -> {"text": str, "start": len(prompt), "max": int}
        self.executions = 0

    def _ids(self, text):
        tail = text[-CONTEXT:].rjust(CONTEXT)
        return [self.index.get(c, self.index[" "]) for c in tail]

    def _step(self, texts):
        """One forward pass over every sequence (the same arithmetic as lab_backends.charlm.net.step)."""
        w = self.w
        x = w["emb"][np.array([self._ids(t) for t in texts])].reshape(len(texts), -1)
        h = np.maximum(x @ w["w1"] + w["b1"], 0)
        h = np.maximum(h @ w["w2"] + w["b2"], 0)
        return np.argmax(h @ w["w3"] + w["b3"], axis=1)

    def _admit(self, request, key):
        prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0]
        prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
        n = int(pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy().reshape(-1)[0])
        if not 1 <= n <= self.limit:
            raise ValueError(f"MAX_TOKENS must be between 1 and {self.limit}, got {n}")
        self.live[key] = {"text": prompt, "start": len(prompt), "max": n}

    def execute(self, requests):
        self.executions += 1
        active, nulls = [], 0
        for request in requests:
            ready = pb_utils.get_input_tensor_by_name(request, "READY")
            if ready is not None and int(ready.as_numpy().reshape(-1)[0]) == 0:
                nulls += 1
                continue  # a null request filling an empty slot: garbage inputs, nobody to answer
            key = request.correlation_id()
            sender = request.get_response_sender()
            if key not in self.live or request.flags() & 1:  # 1: TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                try:
                    self._admit(request, key)
                except ValueError as exc:
                    self.live.pop(key, None)
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
                    continue
            active.append((request, key, sender))
        if not active:
            return None
        started = time.perf_counter()
        tokens = self._step([self.live[key]["text"] for _, key, _ in active])
        time.sleep(max(0.0, self.step_s + self.per_sequence_s * len(active) - (time.perf_counter() - started)))
        for (request, key, sender), token in zip(active, tokens):
            if sender.is_cancelled():  # the client went away: forget it, and let the scheduler free its slot
                del self.live[key]
                request.set_release_flags(RESCHEDULE)  # no token, no FINAL: the core answers it CANCELLED
                continue
            state = self.live[key]
            state["text"] += self.vocab[int(token)]
            step = len(state["text"]) - state["start"] - 1
            done = step + 1 >= state["max"]
            if done:
                del self.live[key]
            else:
                request.set_release_flags(RESCHEDULE)  # before execute returns: back to the scheduler
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TEXT", np.array([[self.vocab[int(token)].encode()]], dtype=object)),
                pb_utils.Tensor("STEP", np.array([[step]], dtype=np.int32)),
                pb_utils.Tensor("EXEC", np.array([[self.executions]], dtype=np.int64)),
                pb_utils.Tensor("BATCH", np.array([[len(active)]], dtype=np.int32)),
                pb_utils.Tensor("NULLS", np.array([[nulls]], dtype=np.int32)),
            ]), flags=FINAL if done else 0)
        return None
