"""generate_kv: PROMPT + MAX_TOKENS -> MAX_TOKENS characters of kvlm, with a paged KV cache in the stub.

Iterative scheduling as in generate_iterative (read its model.py first): each ``execute`` is ONE step
over every sequence the iterative sequence batcher handed in, one token streamed to each, and each
unfinished request released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` (python_backend README
"Request Rescheduling", r24.10) so it comes back for the next step. What is new is the cache:

- **prefill**: a sequence's first step runs its whole prompt through the transformer in one pass,
  writing every prompt token's key and value (per layer) into the cache, and produces token 0;
- **decode**: every later step runs ONE token (the last one produced) through the network; its
  attention reads the earlier tokens' keys and values from the cache instead of recomputing them
  (causal attention: they never change). All sequences in flight decode in one batched pass;
- **paged memory**: the cache is one pool per layer of ``kv_blocks`` blocks of ``block_tokens`` token
  slots (config parameters); ``kv_blocks.py`` (next to this file, the lesson's exercise) keeps each
  sequence's block table. A new block is taken when a sequence's last one is full; all of them are
  freed when it sends its last token or its request is cancelled;
- **freed**: at the last token, on a cancellation seen during a step, and for a sequence the scheduler
  dropped while it waited in its slot (cancelled there: see ``_reap``);
- **admission by memory**: a newcomer whose prompt's blocks plus one (or all it will ever hold, if fewer)
  are not free waits: released with RESCHEDULE without a step and without a response, it is tried again
  at the next execution.
  A running sequence that needs a block when none is free waits the same way; if every sequence in a
  step waits, the one admitted last is preempted (its blocks freed; it comes back as a newcomer whose
  prompt is its text so far, prefilled again: vLLM's recompute preemption), so the pool never deadlocks.

The model's own records travel with every token: STEP (its index; 0 = from the prefill), KIND
("prefill" or "decode"), BATCH (sequences that advanced in this execution), BLOCKS (blocks this
sequence holds after the step; 0 after its last token) and FREE_BLOCKS (free blocks in the pool after
the step, every release of the step counted): once every sequence is done, FREE_BLOCKS is kv_blocks.

``kv_blocks.py`` is found because the stub puts the version folder on ``sys.path`` (python_backend
``src/pb_stub.cc`` 2015-2024 at r24.10). torch is imported by this stub only (~4 s, ~200 MB), with
one thread: the server's other work keeps the second core.
"""

import json
import os
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from kv_blocks import BlockTable

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START


class Refused(Exception):
    """A request the model answers with an error (one line, sent as its final response)."""


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.kv_blocks = int(params.get("kv_blocks", "512"))
        self.block_tokens = int(params.get("block_tokens", "16"))
        self.step_s = float(params.get("step_ms", "0")) / 1000  # a floor on a step's time (tests pace with it)
        path = os.path.join(args["model_repository"], args["model_version"], "kvlm.pt")
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(f"{path} does not exist: run `lab-backends setup` to train kvlm")
        module = torch.jit.load(path, map_location="cpu")
        self.vocabulary, self.context = str(module.vocabulary), int(module.context)
        self.w = {name: p.detach() for name, p in module.named_parameters()}
        self.layers = sum(1 for name in self.w if name.endswith(".qkv.weight"))
        self.width = self.w["tok.weight"].shape[1]
        self.heads, self.head_dim = 4, self.width // 4
        # The pool: [layer, block, slot, head, head_dim], keys and values (16 KiB a block with the defaults).
        shape = (self.layers, self.kv_blocks, self.block_tokens, self.heads, self.head_dim)
        self.keys, self.values = torch.zeros(shape), torch.zeros(shape)
        self.table = BlockTable(self.kv_blocks, self.block_tokens)
        self.index = {c: i for i, c in enumerate(self.vocabulary)}
        self.live = {}  # correlation ID -> {"ids": tokens so far, "new": tokens to prefill or None, "made", "max"}
        self.admitted = []  # running sequences, in admission order (the last is preempted first)

    # ---- the network, split at the cache -------------------------------------------------------------------
    def _linear(self, x, name):
        bias = self.w.get(name + ".bias")
        return torch.nn.functional.linear(x, self.w[name + ".weight"], bias)

    def _forward(self, batch):
        """One pass over B sequences: batch = [(key, new token ids, first position, [(block, offset) per new token])].

        Each new token's key and value are written where its (block, offset) says, then every new token
        attends to its sequence's cached tokens at positions <= its own, read through the block table.
        Returns the next token of each sequence (argmax of its last new position; first maximum on ties).
        """
        b, q = len(batch), max(len(ids) for _, ids, _, _ in batch)
        ids = torch.zeros(b, q, dtype=torch.long)
        positions = torch.zeros(b, q, dtype=torch.long)
        for i, (_, new, start, _) in enumerate(batch):
            ids[i, :len(new)] = torch.tensor(new)
            positions[i, :len(new)] = torch.arange(start, start + len(new))
        written = torch.tensor([block * self.block_tokens + offset for *_, slots in batch for block, offset in slots])
        real = torch.tensor([[j < len(new) for j in range(q)] for _, new, _, _ in batch])
        # The block tables, padded to the longest: key position s of sequence i is its slot s of that gather.
        tables = [list(self.table.blocks[key]) for key, *_ in batch]
        width = max(len(t) for t in tables)
        gather = torch.tensor([t + [0] * (width - len(t)) for t in tables])
        key_positions = torch.arange(width * self.block_tokens)
        allowed = key_positions[None, None, :] <= positions[:, :, None]  # [B, Q, S]: causal, and only written slots
        x = self.w["tok.weight"][ids] + self.w["pos.weight"][positions]
        for layer in range(self.layers):
            p = f"blocks.{layer}."
            h = torch.nn.functional.layer_norm(x, (self.width,), self.w[p + "ln1.weight"], self.w[p + "ln1.bias"])
            qkv = self._linear(h, p + "qkv").view(b, q, 3, self.heads, self.head_dim)
            pool_k = self.keys[layer].view(-1, self.heads, self.head_dim)
            pool_v = self.values[layer].view(-1, self.heads, self.head_dim)
            pool_k[written] = qkv[:, :, 1][real]  # the cache write: only the new tokens' K and V
            pool_v[written] = qkv[:, :, 2][real]
            cached_k = self.keys[layer][gather].view(b, -1, self.heads, self.head_dim)  # [B, S, H, D]
            cached_v = self.values[layer][gather].view(b, -1, self.heads, self.head_dim)
            scores = torch.einsum("bqhd,bshd->bhqs", qkv[:, :, 0], cached_k) / self.head_dim ** 0.5
            weights = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
            attended = torch.einsum("bhqs,bshd->bqhd", weights, cached_v).reshape(b, q, self.width)
            x = x + self._linear(attended, p + "proj")
            h = torch.nn.functional.layer_norm(x, (self.width,), self.w[p + "ln2.weight"], self.w[p + "ln2.bias"])
            x = x + self._linear(torch.nn.functional.gelu(self._linear(h, p + "fc1")), p + "fc2")
        last = x[torch.arange(b), torch.tensor([len(new) - 1 for _, new, _, _ in batch])]
        logits = self._linear(torch.nn.functional.layer_norm(last, (self.width,), self.w["ln_f.weight"],
                                                             self.w["ln_f.bias"]), "head")
        return torch.argmax(logits, dim=-1).tolist()

    # ---- bookkeeping around kv_blocks.py -----------------------------------------------------------------
    def _slot(self, key):
        """Where ``key``'s next token goes (kv_blocks.append), checked; None when it must wait for a block."""
        try:
            slot = self.table.append(key)
        except Exception as exc:
            raise Refused(f"kv_blocks.py append raised {type(exc).__name__}: {exc}") from exc
        if slot is not None:
            block, offset = slot
            if not (0 <= block < self.kv_blocks and 0 <= offset < self.block_tokens):
                raise Refused(f"kv_blocks.py append returned {slot}: outside the pool of {self.kv_blocks} blocks "
                              f"of {self.block_tokens} tokens")
        return slot

    def _release(self, key):
        try:
            self.table.release(key)
        except Exception as exc:
            raise Refused(f"kv_blocks.py release raised {type(exc).__name__}: {exc}") from exc
        if key in self.admitted:
            self.admitted.remove(key)

    def _start(self, request, key):
        prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0]
        prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
        n = int(pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy().reshape(-1)[0])
        if len(prompt) < 1 or n < 1 or len(prompt) + n > self.context:
            raise Refused(f"prompt of {len(prompt)} characters + MAX_TOKENS {n} must be >= 1 each and at most "
                          f"{self.context} together: shorten the prompt or ask for fewer tokens")
        need = self.table.blocks_for(len(prompt) + n - 1)  # the most it will hold: its last token is never cached
        if need > self.kv_blocks:
            raise Refused(f"this sequence needs {need} KV blocks and the pool has {self.kv_blocks}: raise kv_blocks "
                          f"or block_tokens, or send a shorter one")
        ids = [self.index.get(c, self.index[" "]) for c in prompt]
        self.live[key] = {"ids": ids, "new": ids, "made": 0, "max": n}

    def _forget(self, key):
        """Drop ``key``'s state, freeing its blocks if it holds any (end, cancellation, error)."""
        self.live.pop(key, None)
        if key in self.admitted:
            self._release(key)

    # ---- one step ----------------------------------------------------------------------------------------------
    def _plan(self, entries):
        """Who advances this step: (prefills, decodes, waiting), each [(request, key, sender, slots)].

        Running sequences take their next slot first (a block when the last is full); then newcomers are
        admitted while their prompt's blocks plus one (or all they will hold, if fewer) are free; the rest
        wait. If nobody can advance, the running sequence admitted last gives its blocks back and will be
        prefilled again (preemption).
        """
        decodes, prefills, waiting, stalled = [], [], [], []
        for request, key, sender in entries:
            if key in self.admitted:
                slot = self._slot(key)
                (decodes if slot is not None else stalled).append((request, key, sender, [slot]))
        for request, key, sender in entries:
            if key in self.admitted:
                continue
            state = self.live[key]
            new = state["new"]
            if not self.table.admit(key, len(new), len(state["ids"]) - state["made"] + state["max"] - 1):
                waiting.append((request, key, sender, None))
                continue
            self.admitted.append(key)
            slots = [self._slot(key) for _ in new]
            if None in slots:
                raise Refused(f"kv_blocks.py append returned None for a prompt of {len(new)} tokens that admit() "
                              f"found room for")
            prefills.append((request, key, sender, slots))
        if not decodes and not prefills and stalled:
            victim = [key for key in self.admitted if key in {e[1] for e in stalled}][-1]
            self._release(victim)
            self.live[victim]["new"] = self.live[victim]["ids"]
        return prefills, decodes, waiting + stalled

    def _reap(self, present):
        """Free the sequences the scheduler dropped without a word: a request cancelled while it waited in its
        slot is answered by the batcher, which frees the slot and never hands it back (core
        ``sequence_batch_scheduler.cc`` 1644-1656 at r24.10). Every other live sequence is in each execution:
        the next batch is formed only once the last execution completed (1583-1588), when every rescheduled
        request is back in its slot. So a live sequence missing here is gone, and so must its blocks be."""
        for key in [key for key in self.live if key not in present]:
            self._forget(key)

    def execute(self, requests):
        entries = []
        for request in requests:
            ready = pb_utils.get_input_tensor_by_name(request, "READY")
            if ready is not None and int(ready.as_numpy().reshape(-1)[0]) == 0:
                continue  # a null request filling an empty slot of the direct strategy: nobody to answer
            key, sender = request.correlation_id(), request.get_response_sender()
            try:
                if request.flags() & START:
                    self._forget(key)
                    self._start(request, key)
                elif key not in self.live:  # never seen: _reap's premise would be wrong; say so, never restart it
                    raise Refused(f"generate_kv has no state for sequence {key}: it was dropped; send it again")
            except Refused as exc:
                self._fail(key, sender, exc)
                continue
            if sender.is_cancelled():  # cancelled while it waited: free its blocks, let the scheduler free its slot
                self._forget(key)
                request.set_release_flags(RESCHEDULE)
                continue
            entries.append((request, key, sender))
        self._reap({key for _, key, _ in entries})
        if not entries:
            return None
        started = time.perf_counter()
        try:
            prefills, decodes, waiting = self._plan(entries)
            with torch.inference_mode():
                tokens = [self._forward([(key, self.live[key]["new"], 0, slots)])[0]
                          for _, key, _, slots in prefills]
                if decodes:
                    tokens += self._forward([(key, self.live[key]["ids"][-1:], len(self.live[key]["ids"]) - 1, slots)
                                             for _, key, _, slots in decodes])
        except Exception as exc:  # noqa: BLE001 - a learner's kv_blocks.py: every sequence of this step fails, in one line
            for _, key, sender in entries:
                self._fail(key, sender, exc)
            return None
        time.sleep(max(0.0, self.step_s - (time.perf_counter() - started)))
        for request, _, _, _ in waiting:
            request.set_release_flags(RESCHEDULE)  # no step, no response: tried again at the next execution
        self._answer([(e, "prefill") for e in prefills] + [(e, "decode") for e in decodes], tokens)
        return None

    def _answer(self, advanced, tokens):
        """Record each sequence's token, free the blocks of those that ended, then send (records after all frees)."""
        out = []
        for ((request, key, sender, _), kind), token in zip(advanced, tokens):
            if sender.is_cancelled():  # the client went away during the step: free everything it held
                self._forget(key)
                request.set_release_flags(RESCHEDULE)  # no token, no FINAL: the core answers it CANCELLED
                continue
            state = self.live[key]
            if state["new"] is not None:  # a prefill: the text so far is what it ran
                state["ids"] = list(state["new"])
            state["ids"].append(token)
            state["new"], step = None, state["made"]
            state["made"] += 1
            done = state["made"] >= state["max"]
            if done:
                self._forget(key)
            else:
                request.set_release_flags(RESCHEDULE)
            out.append((sender, token, step, kind, key, done))
        free = len(self.table.free)
        for sender, token, step, kind, key, done in out:
            held = len(self.table.blocks.get(key, ())) if not done else 0
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TEXT", np.array([[self.vocabulary[token].encode()]], dtype=object)),
                pb_utils.Tensor("STEP", np.array([[step]], dtype=np.int32)),
                pb_utils.Tensor("KIND", np.array([[kind.encode()]], dtype=object)),
                pb_utils.Tensor("BATCH", np.array([[len(advanced)]], dtype=np.int32)),
                pb_utils.Tensor("BLOCKS", np.array([[held]], dtype=np.int32)),
                pb_utils.Tensor("FREE_BLOCKS", np.array([[free]], dtype=np.int32)),
            ]), flags=FINAL if done else 0)

    def _fail(self, key, sender, exc):
        """One line to the client, as its final response; the sequence and its blocks are forgotten."""
        try:
            self._forget(key)
        except Refused:
            self.live.pop(key, None)
        message = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
