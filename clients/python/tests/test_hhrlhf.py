"""mxserve.rlhf.hhrlhf: prompt/response splits worked out by hand, the seeded subset, and
the errors, on tiny files written here in HH-RLHF's format."""

import gzip
import json
import random

import pytest

from mxserve.rlhf.hhrlhf import PreferencePair, load_hh_rlhf, read_hh_rlhf, split_pair

TURN = "\n\nHuman: Hi there\n\nAssistant: Hello! What can I do?\n\nHuman: Tell me a joke"


def line(chosen, rejected):
    return json.dumps({"chosen": chosen, "rejected": rejected}) + "\n"


def write_jsonl(path, lines):
    data = "".join(lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def test_the_prompt_ends_after_the_last_assistant_turn():
    pair = split_pair(TURN + "\n\nAssistant: Why did the chicken cross the road?",
                      TURN + "\n\nAssistant: No.")
    assert pair == PreferencePair(TURN + "\n\nAssistant:",
                                  " Why did the chicken cross the road?", " No.")
    # The answers start alike: the common prefix is cut back to "Assistant:".
    pair = split_pair(TURN + "\n\nAssistant: I think yes", TURN + "\n\nAssistant: I think no")
    assert (pair.chosen, pair.rejected) == (" I think yes", " I think no")
    # One transcript goes on where the other ends.
    pair = split_pair(TURN + "\n\nAssistant: Sure.\n\nHuman: More", TURN + "\n\nAssistant: Sure.")
    assert pair.prompt == TURN + "\n\nAssistant:"
    assert (pair.chosen, pair.rejected) == (" Sure.\n\nHuman: More", " Sure.")
    # No "Assistant:" in the common prefix: all of it is the prompt.
    assert split_pair("Human: a b", "Human: a c") == PreferencePair("Human: a ", "b", "c")


@pytest.mark.parametrize("name", ["train.jsonl", "train.jsonl.gz"])
def test_reads_plain_and_gzipped_files_in_order(tmp_path, name):
    path = write_jsonl(tmp_path / name, [
        line(TURN + "\n\nAssistant: Ha!", TURN + "\n\nAssistant: Meh."),
        "\n", "   \n",
        line("\n\nHuman: Café?\n\nAssistant: Oui ☕", "\n\nHuman: Café?\n\nAssistant: Non"),
    ])
    pairs = read_hh_rlhf(path)
    assert pairs == [PreferencePair(TURN + "\n\nAssistant:", " Ha!", " Meh."),
                     PreferencePair("\n\nHuman: Café?\n\nAssistant:", " Oui ☕", " Non")]


@pytest.mark.parametrize("bad", [
    json.dumps({"rejected": "x"}),
    json.dumps({"chosen": "x", "rejected": 3}),
    json.dumps(["x", "y"]),
    '{"chosen": "x", "rejected": ',
])
def test_a_bad_line_names_the_file_and_line(tmp_path, bad):
    path = write_jsonl(tmp_path / "train.jsonl", [line("a", "b"), "\n", bad + "\n"])
    with pytest.raises(ValueError, match=r"train\.jsonl line 3: expected a JSON object with "
                                         r"string fields 'chosen' and 'rejected'"):
        read_hh_rlhf(path)


def test_bad_utf8_is_a_bad_line(tmp_path):
    path = tmp_path / "test.jsonl.gz"
    path.write_bytes(gzip.compress(line("a", "b").encode() + b'{"chosen": "\xff"}\n'))
    with pytest.raises(ValueError, match=r"test\.jsonl\.gz line 2: expected a JSON object"):
        read_hh_rlhf(path)


def numbered(n, tag):
    return [line(f"\n\nHuman: {tag} {i}\n\nAssistant: good", f"\n\nHuman: {tag} {i}"
                 "\n\nAssistant: bad") for i in range(n)]


def test_the_seeded_subset_is_fixed(tmp_path):
    write_jsonl(tmp_path / "train.jsonl.gz", numbered(25, "train"))
    write_jsonl(tmp_path / "test.jsonl", numbered(8, "test"))
    train, test = load_hh_rlhf(tmp_path, n_train=10, n_test=20)
    assert len(train) == 10 and len(test) == 8  # test has only 8
    # Each split drawn on its own with Random(42), in the sampled order.
    expected = [f"\n\nHuman: train {i}\n\nAssistant:"
                for i in random.Random(42).sample(range(25), 10)]
    assert [pair.prompt for pair in train] == expected
    assert [pair.prompt for pair in test] == [f"\n\nHuman: test {i}\n\nAssistant:"
                                              for i in random.Random(42).sample(range(8), 8)]
    assert all((p.chosen, p.rejected) == (" good", " bad") for p in train + test)
    assert load_hh_rlhf(tmp_path, n_train=10, n_test=20) == (train, test)
    assert load_hh_rlhf(tmp_path, n_train=10, n_test=20, seed=7)[0] != train
    # The defaults, 1,000 + 200, take everything here, shuffled.
    all_train, _ = load_hh_rlhf(tmp_path)
    assert [pair.prompt for pair in all_train] == [
        f"\n\nHuman: train {i}\n\nAssistant:" for i in random.Random(42).sample(range(25), 25)]


def test_missing_and_empty_splits(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", numbered(3, "train"))
    with pytest.raises(FileNotFoundError, match=r"neither test\.jsonl nor test\.jsonl\.gz found"):
        load_hh_rlhf(tmp_path)
    write_jsonl(tmp_path / "test.jsonl", ["\n"])
    with pytest.raises(ValueError, match=r"test\.jsonl: no preference pairs"):
        load_hh_rlhf(tmp_path)
