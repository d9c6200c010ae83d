"""generate_static: PROMPT + MAX_TOKENS -> MAX_TOKENS responses, the whole batch generated in ONE execution.

Static batching: the dynamic batcher hands ``execute`` up to 8 requests, and ``execute`` does not
return until the longest of them is done. Every step is one forward pass of the character model
over the whole batch (a finished member keeps its row: padding), each unfinished request gets its
token at once (decoupled: streamed through its response sender), and a request's last token carries
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. While the loop runs the instance is busy, so a request
that arrives meanwhile waits in the dynamic batcher's queue for the whole batch to end.

The same records as generate_iterative travel with every token: EXEC (this instance's execution
counter: one per batch here), STEP (the token's index in its request) and BATCH (rows in the pass).
A step lasts ``step_ms + per_sequence_ms * B`` (the real forward pass, then a sleep for the rest:
the stand-in for a larger model's step, as in generate_iterative).
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
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
        self.executions = 0

    def _ids(self, text):
        tail = text[-CONTEXT:].rjust(CONTEXT)
        return [self.index.get(c, self.index[" "]) for c in tail]

    def _step(self, texts):
        """One forward pass over every row (the same arithmetic as lab_backends.charlm.net.step)."""
        w = self.w
        x = w["emb"][np.array([self._ids(t) for t in texts])].reshape(len(texts), -1)
        h = np.maximum(x @ w["w1"] + w["b1"], 0)
        h = np.maximum(h @ w["w2"] + w["b2"], 0)
        return np.argmax(h @ w["w3"] + w["b3"], axis=1)

    def _read(self, request):
        prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0]
        prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
        n = int(pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy().reshape(-1)[0])
        if not 1 <= n <= self.limit:
            raise ValueError(f"MAX_TOKENS must be between 1 and {self.limit}, got {n}")
        return prompt, n

    def execute(self, requests):
        self.executions += 1
        rows = []  # [sender, text, start, max tokens, open]
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt, n = self._read(request)
            except ValueError as exc:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
                continue
            rows.append([sender, prompt, len(prompt), n, True])
        longest = max((row[3] for row in rows), default=0)
        for step in range(longest):  # the batch lasts as long as its longest member
            started = time.perf_counter()
            tokens = self._step([row[1] for row in rows])
            time.sleep(max(0.0, self.step_s + self.per_sequence_s * len(rows) - (time.perf_counter() - started)))
            for row, token in zip(rows, tokens):
                row[1] += self.vocab[int(token)]
                sender, _, _, n, open_ = row
                if not open_:
                    continue  # finished: its row is padding until the batch ends
                if sender.is_cancelled():
                    row[4] = False
                    sender.send(flags=FINAL)
                    continue
                done = step + 1 >= n
                row[4] = not done
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("TEXT", np.array([[self.vocab[int(token)].encode()]], dtype=object)),
                    pb_utils.Tensor("STEP", np.array([[step]], dtype=np.int32)),
                    pb_utils.Tensor("EXEC", np.array([[self.executions]], dtype=np.int64)),
                    pb_utils.Tensor("BATCH", np.array([[len(rows)]], dtype=np.int32)),
                ]), flags=FINAL if done else 0)
        return None
