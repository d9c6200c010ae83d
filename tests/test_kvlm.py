"""kvlm, the transformer behind the KV-cache backends: the file set-up builds, as the issue-48 spec fixes it.

No server: the TorchScript file's attributes and parameter names (what the Python and C++ backends read by
name), the reference decoder's limits, what training reached, and the cache's premise checked in torch
itself: the keys and values of earlier positions do not change when a token is appended.
"""

from __future__ import annotations

import json

import pytest
import torch

from lab_backends.charlm.text import vocabulary, zen
from lab_backends.errors import LabBackendsError
from lab_backends.kvlm import ARTIFACT, METRICS, build_kvlm, is_fresh, reference
from lab_backends.kvlm.net import encode


@pytest.fixture(scope="module")
def model():
    build_kvlm()  # set-up trained it; cheap when fresh
    return reference.load(ARTIFACT)


def test_the_file_carries_its_vocabulary_context_and_the_spec_names(model) -> None:
    assert is_fresh()
    assert model.vocabulary == vocabulary(zen()) and model.context == 256
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    v = len(model.vocabulary)
    per_block = {"ln1.weight": (64,), "ln1.bias": (64,), "qkv.weight": (192, 64), "qkv.bias": (192,),
                 "proj.weight": (64, 64), "proj.bias": (64,), "ln2.weight": (64,), "ln2.bias": (64,),
                 "fc1.weight": (256, 64), "fc1.bias": (256,), "fc2.weight": (64, 256), "fc2.bias": (64,)}
    expected = {"tok.weight": (v, 64), "pos.weight": (256, 64), "ln_f.weight": (64,), "ln_f.bias": (64,),
                "head.weight": (v, 64)}
    expected |= {f"blocks.{i}.{name}": shape for i in range(2) for name, shape in per_block.items()}
    assert shapes == expected


def test_training_reached_a_model_that_recites_the_zen(model) -> None:
    metrics = json.loads(METRICS.read_text())
    assert metrics["loss"] < 0.1 and metrics["parameters"] == sum(p.numel() for p in model.parameters())
    text = zen()
    start = text.index("Flat is")
    assert reference.generate(model, text[start:start + 20], 60) == text[start + 20:start + 80]


def test_the_reference_refuses_what_the_backends_refuse(model) -> None:
    for prompt, tokens in (("", 5), ("Beautiful", 0), ("x" * 250, 7)):
        with pytest.raises(LabBackendsError, match="at most 256 together") as caught:
            reference.decode(model, prompt, tokens)
        assert "\n" not in str(caught.value)
    assert len(reference.decode(model, "x" * 250, 6).text) == 6  # 256 positions exactly: allowed


def test_earlier_keys_and_values_do_not_change_when_a_token_is_appended(model) -> None:
    """Why a cache is exact: causal attention, so position p's K and V depend on positions <= p only."""
    ids = torch.tensor([encode(model.vocabulary, zen()[:40])])
    captured: list[torch.Tensor] = []
    first, block = list(model.blocks.children())  # the second layer's input depends on the first's attention
    with torch.inference_mode():
        for length in (39, 40):
            x = model.tok(ids[:, :length]) + model.pos(torch.arange(length))
            x = first(x)
            captured.append(block.qkv(block.ln1(x))[0, :, 64:])  # K and V rows of every position
    assert torch.allclose(captured[0], captured[1][:39], atol=1e-5)
