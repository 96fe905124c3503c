"""The on-the-fly training tasks: shapes, seeding, each task's structure, and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from atlas_core.errors import AtlasError, SpecError
from atlas_core.host.registry import Params
from atlas_core.train.tasks import (
    IGNORE_INDEX,
    TASKS,
    CopyTask,
    MQARParams,
    MQARTask,
    SelectiveCopyTask,
    SNIAHTask,
    TextTask,
    masked_accuracy,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog; héllo wörld! " * 8, "utf-8")
    return path


def small(name: str, text_file) -> dict:
    return {
        "mqar": {"vocab_size": 32, "seq_len": 40, "num_pairs": 4},
        "copy": {"vocab_size": 10, "seq_len": 20, "copy_len": 7},
        "selective_copy": {"vocab_size": 10, "seq_len": 30, "num_tokens": 5},
        "sniah": {"vocab_size": 41, "seq_len": 50, "value_len": 2},
        "text": {"path": str(text_file), "seq_len": 16},
    }[name]


# -- common contract ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TASKS))
def test_shapes_ranges_and_metrics(name, text_file):
    task = TASKS[name](small(name, text_file))
    assert task.name == name
    assert issubclass(task.Params, Params)
    x, y = task.batch(3, gen())
    T = task.seq_len
    assert x.shape == y.shape == (3, T) and x.dtype == y.dtype == torch.long
    assert 0 <= int(x.min()) and int(x.max()) < task.vocab_size
    kept = y[y != IGNORE_INDEX]
    assert kept.numel() > 0 and 0 <= int(kept.min()) and int(kept.max()) < task.vocab_size
    # A model that puts all its mass on the target scores accuracy 1 and a near-zero loss.
    logits = F.one_hot(y.clamp(min=0), task.vocab_size).float() * 50.0
    assert masked_accuracy(logits, y).item() == 1.0
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
    assert loss.item() < 1e-6
    assert masked_accuracy(torch.zeros_like(logits), y).item() < 1.0


@pytest.mark.parametrize("name", sorted(TASKS))
def test_seeded_batches_repeat_and_differ(name, text_file):
    task = TASKS[name](small(name, text_file))
    a = task.batch(4, gen(7))
    b = task.batch(4, gen(7))
    c = task.batch(4, gen(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_registry_factory_signature_and_derive():
    task = MQARTask(MQARParams(vocab_size=64, seq_len=64, num_pairs=8), ctx=None)
    longer = task.derive(seq_len=128)
    assert longer.seq_len == 128 and longer.params.num_pairs == 8 and task.seq_len == 64
    assert MQARTask().params == MQARParams()  # defaults are valid


# -- mqar -----------------------------------------------------------------------------------------
def test_mqar_structure():
    V, T, N = 64, 96, 6
    task = MQARTask({"vocab_size": V, "seq_len": T, "num_pairs": N})
    x, y = task.batch(16, gen(3))
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0 : 2 * N : 2], row_x[1 : 2 * N : 2]
        assert all(1 <= k < V // 2 for k in keys) and len(set(keys)) == N
        assert all(V // 2 <= v < V for v in values) and len(set(values)) == N
        table = dict(zip(keys, values))
        queried = []
        for p, target in enumerate(row_y):
            if target == IGNORE_INDEX:
                continue
            assert p >= 2 * N and (p - 2 * N) % 2 == 0  # a query slot after the context
            assert row_x[p] in table and table[row_x[p]] == target
            queried.append(row_x[p])
        assert sorted(queried) == sorted(keys)  # every key asked exactly once


def test_mqar_gaps_follow_a_power_law():
    def slots(power_a: float) -> torch.Tensor:
        task = MQARTask({"vocab_size": 64, "seq_len": 1032, "num_pairs": 4, "power_a": power_a})
        _, y = task.batch(400, gen(1))
        pos = (y != IGNORE_INDEX).nonzero()[:, 1]
        return (pos - 8) // 2  # 512 slots

    skewed, flat = slots(0.01), slots(1.0)
    assert skewed.numel() == flat.numel() == 1600
    # P(slot < 51) is ~0.63 for a = 0.01 (~1/g law) and ~0.1 when uniform.
    assert (skewed < 51).float().mean() > 0.5
    assert abs((flat < 51).float().mean().item() - 0.1) < 0.04
    assert skewed.float().median() < 30 < flat.float().median()


def test_mqar_without_noise_pads_with_zero():
    task = MQARTask({"vocab_size": 32, "seq_len": 40, "num_pairs": 4, "noise": False})
    x, y = task.batch(5, gen())
    unused = torch.ones_like(x, dtype=torch.bool)
    unused[:, :8] = False
    unused[y != IGNORE_INDEX] = False
    assert bool((x[unused] == 0).all()) and bool((x[~unused] != 0).all())


# -- copy / selective copy ------------------------------------------------------------------------
def test_copy_targets_are_the_sequence():
    task = CopyTask({"vocab_size": 10, "seq_len": 20, "copy_len": 7})
    x, y = task.batch(6, gen(2))
    assert torch.equal(y[:, 7:14], x[:, :7])
    assert bool((x[:, 7] == 1).all()) and bool((x[:, :7] >= 2).all())
    assert bool((y[:, :7] == IGNORE_INDEX).all()) and bool((y[:, 14:] == IGNORE_INDEX).all())
    assert torch.equal(y[:, 7:13], x[:, 8:14])  # teacher forcing: the copy is also the input


def test_selective_copy_targets_are_the_non_noise_tokens_in_order():
    task = SelectiveCopyTask({"vocab_size": 12, "seq_len": 40, "num_tokens": 5, "span_len": 30})
    x, y = task.batch(8, gen(4))
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        span = row_x[:30]
        data = [t for t in span if t != 2]  # 2 = noise
        assert len(data) == 5 and all(t >= 3 for t in data)
        assert row_x[30] == 1  # separator
        assert [t for t in row_y if t != IGNORE_INDEX] == data
        assert row_y[30:35] == data


# -- sniah ----------------------------------------------------------------------------------------
def test_sniah_target_is_the_needle_value():
    V, T, n = 41, 60, 3
    task = SNIAHTask({"vocab_size": V, "seq_len": T, "value_len": n})
    x, y = task.batch(10, gen(5))
    H = T - 1 - n
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        key = row_x[T - n]
        assert row_x[T - n - 1] == 1  # QUERY
        assert 2 <= key < 15  # keys are [2, 2 + (V - 2) // 3)
        hits = [p for p in range(H) if row_x[p] == key]
        assert len(hits) == 1  # the needle is the only occurrence of the key
        value = row_x[hits[0] + 1 : hits[0] + 1 + n]
        assert all(15 <= v < 28 for v in value)
        assert row_y[T - n :] == value and set(row_y[: T - n]) == {IGNORE_INDEX}
        # The rest of the haystack is filler only.
        rest = row_x[:hits[0]] + row_x[hits[0] + 1 + n : H]
        assert all(v >= 28 for v in rest)


@pytest.mark.parametrize("depth, first", [(0.0, 0), (1.0, 60 - 1 - 2 - 3)])
def test_sniah_depth_places_the_needle(depth, first):
    task = SNIAHTask({"vocab_size": 41, "seq_len": 60, "value_len": 2, "depth": depth})
    x, _ = task.batch(4, gen())
    assert torch.equal(x[:, first], x[:, 60 - 2])  # the needle's key is the queried key


def test_sniah_random_depth_covers_the_whole_haystack():
    T, n = 12, 1  # H = 10 haystack tokens, needle of 2: starts 0 .. 8
    task = SNIAHTask({"vocab_size": 41, "seq_len": T, "value_len": n})
    x, _ = task.batch(400, gen(6))
    starts = set()
    for row in x.tolist():
        starts.update(p for p in range(T - 1 - n) if row[p] == row[T - n])
    assert starts == set(range(9))


# -- text -----------------------------------------------------------------------------------------
def test_text_byte_windows_come_from_the_file(text_file):
    data = text_file.read_bytes()
    task = TextTask({"path": str(text_file), "seq_len": 16, "split": "all"})
    assert task.vocab_size == 256
    x, y = task.batch(8, gen())
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        assert bytes(row_x + row_y[-1:]) in data


def test_text_windows_reach_both_ends_of_the_file(tmp_path):
    path = tmp_path / "digits.txt"
    path.write_bytes(b"0123456789abcdef")
    task = TextTask({"path": str(path), "seq_len": 4, "split": "all"})
    x, y = task.batch(400, gen())
    starts = {b"0123456789abcdef".index(bytes(row)) for row in x.tolist()}
    assert starts == set(range(12))  # 16 bytes hold 12 windows of 4 + 1


def test_text_char_vocab_and_round_trip(text_file):
    text = text_file.read_text("utf-8")
    task = TextTask({"path": str(text_file), "mode": "char", "seq_len": 12, "split": "all"})
    assert task.vocab == sorted(set(text)) and task.vocab_size == len(set(text))
    x, y = task.batch(6, gen())
    for row_x, row_y in zip(x, y):
        assert task.decode(torch.cat([row_x, row_y[-1:]])) in text
    assert task.decode(task.encode("héllo fox")) == "héllo fox"
    with pytest.raises(ValueError, match="'Z'"):
        task.encode("Zebra")


def test_text_train_and_val_splits_do_not_overlap(tmp_path):
    path = tmp_path / "ab.txt"
    path.write_bytes(b"a" * 60 + b"b" * 40)
    train = TextTask({"path": str(path), "seq_len": 10, "val_fraction": 0.4})
    val = train.derive(split="val")
    assert set(torch.cat(train.batch(32, gen())).flatten().tolist()) == {ord("a")}
    assert set(torch.cat(val.batch(32, gen())).flatten().tolist()) == {ord("b")}


# -- bad input ------------------------------------------------------------------------------------
def test_text_missing_and_empty_files(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt") as info:
        TextTask({"path": str(missing)})
    assert isinstance(info.value, AtlasError)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.txt.*empty"):
        TextTask({"path": str(empty)})
    with pytest.raises(ValueError, match="not a file"):
        TextTask({"path": str(tmp_path)})


def test_text_seq_len_longer_than_the_file(tmp_path):
    path = tmp_path / "short.txt"
    path.write_bytes(b"0123456789")
    with pytest.raises(ValueError, match=r"seq_len=10 .* 11 bytes .*short.txt.* has 10.*<= 9"):
        TextTask({"path": str(path), "seq_len": 10, "split": "all"})
    with pytest.raises(ValueError, match=r"train split .* has 9"):
        TextTask({"path": str(path), "seq_len": 9})  # 10% held out leaves 9 bytes
    assert TextTask({"path": str(path), "seq_len": 9, "split": "all"}).batch(2, gen())[0].shape


def test_text_bad_encoding_and_val_without_held_out_text(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(ValueError, match="not valid utf-8.*mode='byte'"):
        TextTask({"path": str(path), "mode": "char", "seq_len": 4})
    task = TextTask({"path": str(path), "mode": "char", "seq_len": 4, "encoding": "latin-1"})
    assert "é" in task.vocab
    with pytest.raises(SpecError, match="val_fraction"):
        TextTask({"path": str(path), "split": "val", "val_fraction": 0.0})


@pytest.mark.parametrize(
    "cls, raw, pattern",
    [
        (MQARTask, {"seq_len": 60, "num_pairs": 16},
         r"num_pairs: num_pairs=16 needs seq_len >= .* = 64.* seq_len is 60.*<= 15"),
        (MQARTask, {"vocab_size": 20, "seq_len": 64, "num_pairs": 10},
         r"num_pairs: .*vocab_size >= 22.* vocab_size is 20.*<= 9"),
        (MQARTask, {"power_a": 0.0}, r"power_a: .*greater than 0"),
        (MQARTask, {"num_kv_pairs": 4}, r"num_kv_pairs: unknown key.*num_pairs"),
        (CopyTask, {"seq_len": 10, "copy_len": 6}, r"copy_len: copy_len=6 .*>= .* 12.*<= 5"),
        (SelectiveCopyTask, {"seq_len": 20, "num_tokens": 11}, r"num_tokens: .*>= .*22"),
        (SelectiveCopyTask, {"seq_len": 20, "num_tokens": 4, "span_len": 17},
         r"span_len: .*seq_len >= 21.*<= 16"),
        (SNIAHTask, {"seq_len": 7, "value_len": 3}, r"value_len: .*>= .* 8.*seq_len is 7"),
        (SNIAHTask, {"depth": 1.5}, r"depth: .*less than or equal to 1"),
        (TextTask, {"seq_len": 8}, r"path: Field required"),
    ],
)
def test_bad_params_name_the_field_value_and_limit(cls, raw, pattern):
    with pytest.raises(SpecError, match=pattern):
        cls(raw)


def test_bad_params_from_the_pydantic_model_directly():
    with pytest.raises(ValidationError, match="num_pairs") as info:
        MQARParams(seq_len=8, num_pairs=3)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_batch_size(bad):
    with pytest.raises(ValueError, match="batch_size"):
        CopyTask().batch(bad, gen())


def test_bad_generator():
    with pytest.raises(ValueError, match="generator"):
        CopyTask().batch(2, 123)
