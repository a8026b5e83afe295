"""The weights file (trainpipe.training.weights_file): plain safetensors written from the tensors' own memory,
its sha256 taken while writing and trusted only for that very file, and a second name that is the same file."""

from __future__ import annotations

import hashlib
import os

import pytest

from trainpipe.training import weights_file

pytestmark = pytest.mark.unit


def tensors():
    import torch

    g = torch.Generator().manual_seed(0)
    return {
        "body.0.weight": torch.randn(33, 7, generator=g),
        "body.0.bias": torch.randn(33, generator=g).bfloat16(),
        "norm.mean": torch.zeros(7, dtype=torch.float64),
        "steps": torch.tensor(3),
        "mask": torch.tensor([True, False]),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
    }


def test_the_file_is_plain_safetensors_and_its_digest_is_the_files(tmp_path):
    import torch
    from safetensors.torch import load_file

    state = tensors()
    path = tmp_path / "model.safetensors"
    sha = weights_file.write(path, state)
    back = load_file(str(path))
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest() == weights_file.recorded_digest(path)
    assert weights_file.read_header(path)["body.0.bias"]["dtype"] == "BF16"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_digest_is_trusted_only_for_the_file_it_was_taken_of(tmp_path):
    path = tmp_path / "model.safetensors"
    weights_file.write(path, tensors())
    os.replace(tmp_path / "model.safetensors", tmp_path / "kept")
    path.write_bytes((tmp_path / "kept").read_bytes())  # the same bytes, another file: read again, not trusted
    assert weights_file.recorded_digest(path) is None


def test_a_second_name_is_the_same_file_and_keeps_its_digest(tmp_path):
    src, dest = tmp_path / "ckpt.safetensors", tmp_path / "model.safetensors"
    sha = weights_file.write(src, tensors())
    dest.write_bytes(b"an older model")
    assert weights_file.share(src, dest) is True
    assert os.stat(src).st_ino == os.stat(dest).st_ino and weights_file.recorded_digest(dest) == sha
