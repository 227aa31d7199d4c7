"""mxserve.rlhf.tokenizer: byte-level BPE on hand-made vocabularies whose tokens are
worked out by hand, in both of Hugging Face's file forms."""

import json

import pytest

from mxserve.rlhf.tokenizer import GPT2_PATTERN, AddedToken, BPETokenizer, bytes_to_unicode

B2U = bytes_to_unicode()
SP = B2U[ord(" ")]  # "Ġ"

# The ranks decide: "l o" (0) beats "Ġ l" (3), "e r" (2) beats "Ġ l" (3).
MERGES = [("l", "o"), ("lo", "w"), ("e", "r"), (SP, "l"), ("lo", "lo")]
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
ADDED = [{"id": 300, "content": "<|endoftext|>", "special": True},
         {"id": 301, "content": "<|im_start|>", "special": True},
         {"id": 302, "content": "<|im_end|>", "special": True},
         {"id": 303, "content": "<tool>", "special": False}]


def byte_level_vocab(merges=MERGES) -> dict:
    """Every byte's symbol (id = the byte), then each merge's result in rank order."""
    vocab = {B2U[byte]: byte for byte in range(256)}
    for first, second in merges:
        vocab.setdefault(first + second, len(vocab))
    return vocab


def ids_of(vocab, *tokens):
    return [vocab[token] for token in tokens]


def write_gpt2_files(directory, vocab, merges):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False),
                                          encoding="utf-8")
    (directory / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return directory / "vocab.json", directory / "merges.txt"


def tokenizer_json(vocab, merges, added=ADDED, pairs=False, pre_tokenizer=None,
                   normalizer=None) -> dict:
    return {"version": "1.0", "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer or {"type": "ByteLevel", "add_prefix_space": False,
                                               "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": [list(m) if pairs else " ".join(m) for m in merges]}}


def write_json(path, data):
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture
def tok(tmp_path):
    return BPETokenizer.from_files(*write_gpt2_files(tmp_path, byte_level_vocab(), MERGES))


def test_the_byte_table_follows_gpt2s_definition():
    assert len(B2U) == 256 and len(set(B2U.values())) == 256
    assert B2U[ord("A")] == "A" and B2U[ord("~")] == "~" and B2U[0xE9] == "é"
    # The 68 others, in byte order, from chr(256): 0..32, 127, 128..160, 173.
    assert (B2U[0], B2U[9], B2U[10], B2U[32]) == ("Ā", "ĉ", "Ċ", "Ġ")
    assert (B2U[127], B2U[128], B2U[160], B2U[173]) == (chr(289), chr(290), chr(322), chr(323))


def test_merges_worked_out_by_hand(tok):
    vocab = byte_level_vocab()
    # "lower": l o w e r -> lo w e r -> low e r -> low er
    assert tok.encode("lower") == ids_of(vocab, "low", "er")
    # " low": Ġ l o w -> "l o" (rank 0) before "Ġ l" (rank 3) -> Ġ lo w -> Ġ low
    assert tok.encode(" low") == ids_of(vocab, SP, "low")
    # " lolo": both "l o" at once -> Ġ lo lo -> Ġ lolo
    assert tok.encode(" lolo") == ids_of(vocab, SP, "lolo")
    # " ler": "e r" (2) before "Ġ l" (3) -> Ġ l er -> Ġl er
    assert tok.encode(" ler") == ids_of(vocab, SP + "l", "er")
    assert tok.encode("lower low lolo ler") == ids_of(
        vocab, "low", "er", SP, "low", SP, "lolo", SP + "l", "er")
    # Whitespace before a word goes with it, a run of spaces keeps its last one for the
    # word: "x  low" -> "x", " ", " low".
    assert tok.encode("x  low") == ids_of(vocab, "x", SP, SP, "low")
    assert tok.decode(tok.encode("lower low")) == "lower low"
    assert tok.id_to_token(vocab["low"]) == "low" and tok.token_to_id("er") == vocab["er"]
    assert tok.token_to_id("nope") is None and tok.id_to_token(10 ** 6) is None
    assert tok.vocab_size == len(vocab)


ROUND_TRIP = ["Hello, world! It's 2024: 3.14 × 2 = 6.28?\n\n  Indented\tand tabbed\r\n",
              "Café déjà vu — naïve façade", "中文分词测试。", "emoji 🙂👍🏽 and 🇫🇷!",
              "   leading and trailing   ", "\n", "a", "", "'s'S 've 'll \x00\x7f"]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_encode_decode_round_trips(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.encode(text) == ids  # from the cache, the same


def test_a_character_cut_between_tokens_decodes_with_a_replacement(tok):
    ids = tok.encode("é")  # two byte tokens
    assert len(ids) == 2 and tok.decode(ids[:1]) == "\ufffd"


def test_tokenizer_json_gives_the_same_ids_as_vocab_and_merges(tmp_path, tok):
    vocab = byte_level_vocab()
    vocab["<|endoftext|>"] = 300
    for pairs in (False, True):
        path = write_json(tmp_path / f"tokenizer-{pairs}.json",
                          tokenizer_json(vocab, MERGES, added=ADDED[:1], pairs=pairs))
        from_json = BPETokenizer.from_tokenizer_json(path)
        for text in ROUND_TRIP + ["lower low lolo ler"]:
            assert from_json.encode(text) == tok.encode(text)
        assert from_json.eos_token_id == 300


def test_special_tokens_are_matched_whole(tmp_path):
    vocab = byte_level_vocab()
    tok = BPETokenizer.from_tokenizer_json(
        write_json(tmp_path / "tokenizer.json", tokenizer_json(vocab, MERGES)))
    text = "<|im_start|>user\nlow<|im_end|><tool> <|endoftext|><|endoftext"
    ids = tok.encode(text)
    assert ids == [301, *tok.encode("user\nlow"), 302, 303, *tok.encode(" "), 300,
                   *tok.encode("<|endoftext")]
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user\nlow<tool> <|endoftext"
    assert tok.eos_token_id == 300 and tok.pad_token_id == 300  # pad falls back to eos
    assert tok.vocab_size == 304 and tok.id_to_token(302) == "<|im_end|>"
    # Longest first: an added token that extends another wins.
    longer = BPETokenizer(vocab, MERGES, added_tokens=[AddedToken("<a>", 400),
                                                       AddedToken("<a><b>", 401)])
    assert longer.encode("<a><b><a>") == [401, 400]


def test_a_qwen2_style_tokenizer_json(tmp_path):
    # Qwen2: NFC first, then a Split regex that takes digits one at a time, ByteLevel
    # without its own regex.
    merges = MERGES + [("1", "2"), ("Ã", "©")]  # "é" is bytes C3 A9: "Ã" "©"
    vocab = byte_level_vocab(merges)
    pre_tokenizer = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}
    qwen = BPETokenizer.from_tokenizer_json(write_json(
        tmp_path / "qwen.json", tokenizer_json(vocab, merges, pre_tokenizer=pre_tokenizer,
                                               normalizer={"type": "NFC"})))
    gpt2 = BPETokenizer.from_tokenizer_json(write_json(
        tmp_path / "gpt2.json", tokenizer_json(vocab, merges)))
    assert gpt2.encode("12") == ids_of(vocab, "12")
    assert qwen.encode("12") == ids_of(vocab, "1", "2")      # one digit per word
    assert qwen.encode("e\u0301") == ids_of(vocab, "Ã©")      # NFC: e + ◌́ is é
    assert gpt2.encode("e\u0301") == ids_of(vocab, "e", "Ì", B2U[0x81])
    for text in ROUND_TRIP:
        assert qwen.decode(qwen.encode(text)) == text


def test_from_pretrained_with_either_form(tmp_path):
    vocab = byte_level_vocab()
    fast = tmp_path / "fast"
    fast.mkdir()
    write_json(fast / "tokenizer.json", tokenizer_json(vocab, MERGES))
    write_json(fast / "tokenizer_config.json",
               {"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"},
                "bos_token": None, "add_bos_token": False})
    tok = BPETokenizer.from_pretrained(fast)
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (302, 300, None)
    assert tok.encode("low", add_special_tokens=True) == tok.encode("low")

    slow = tmp_path / "slow"
    write_gpt2_files(slow, dict(vocab, **{"<|endoftext|>": 300}), MERGES)
    write_json(slow / "added_tokens.json", {"<tool>": 303})
    write_json(slow / "special_tokens_map.json",
               {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                "additional_special_tokens": []})
    write_json(slow / "tokenizer_config.json", {"add_bos_token": True})
    tok = BPETokenizer.from_pretrained(slow)
    assert tok.eos_token_id == tok.bos_token_id == tok.pad_token_id == 300
    assert tok.encode("low", add_special_tokens=True) == [300] + tok.encode("low")
    assert tok.encode("<tool><|endoftext|>") == [303, 300]
    assert tok.decode([303, 300], skip_special_tokens=True) == "<tool>"


def test_missing_and_malformed_files(tmp_path):
    vocab_file, merges_file = write_gpt2_files(tmp_path / "t", byte_level_vocab(), MERGES)
    with pytest.raises(FileNotFoundError, match=r"not found: .*nope\.txt"):
        BPETokenizer.from_files(vocab_file, tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match=r"nowhere: tokenizer directory not found"):
        BPETokenizer.from_pretrained(tmp_path / "nowhere")
    merges_file.unlink()
    with pytest.raises(FileNotFoundError, match=r"merges\.txt \(and there is no tokenizer\.json"):
        BPETokenizer.from_pretrained(tmp_path / "t")

    merges_file.write_text("#version: 0.2\nl o\nlo w extra\n")
    with pytest.raises(ValueError, match=r"merges\.txt line 3: malformed merge"):
        BPETokenizer.from_files(vocab_file, merges_file)
    merges_file.write_text("l o\n\nq z\n")
    with pytest.raises(ValueError, match=r"merges\.txt line 3: merge 'q' 'z' uses 'qz', "
                                         r"which is not in the vocabulary"):
        BPETokenizer.from_files(vocab_file, merges_file)
    vocab_file.write_text('{"a": "zero"}')
    with pytest.raises(ValueError, match=r"vocab\.json: expected an object of token"):
        BPETokenizer.from_files(vocab_file, merges_file)

    path = write_json(tmp_path / "bad.json", tokenizer_json(byte_level_vocab(), [["l"]]))
    with pytest.raises(ValueError, match=r"bad\.json: model\.merges\[0\]: malformed merge"):
        BPETokenizer.from_tokenizer_json(path)
    data = tokenizer_json(byte_level_vocab(), MERGES)
    data["model"]["type"] = "WordPiece"
    with pytest.raises(ValueError, match="expected a tokenizers file with a BPE model"):
        BPETokenizer.from_tokenizer_json(write_json(path, data))
    data = tokenizer_json(byte_level_vocab(), MERGES,
                          pre_tokenizer={"type": "Whitespace"})
    with pytest.raises(ValueError, match="pre-tokenizer .* is not supported"):
        BPETokenizer.from_tokenizer_json(write_json(path, data))


def test_bad_vocabularies_and_ids(tok):
    with pytest.raises(ValueError, match=r"id 999 is not in the vocabulary"):
        tok.decode([999])
    with pytest.raises(ValueError, match=r"'▁the' \(id 7\) is not made of byte-level"):
        BPETokenizer({"▁the": 7}, [])
    with pytest.raises(ValueError, match="special token '<pad>' is not in the vocabulary"):
        BPETokenizer(byte_level_vocab(), MERGES, pad_token="<pad>")
    with pytest.raises(ValueError, match="id 0 is both"):
        BPETokenizer(byte_level_vocab(), MERGES, added_tokens=[AddedToken("<x>", 0)])
    # Without every byte in the vocabulary some text cannot be encoded.
    small = BPETokenizer({"a": 0}, [], pattern=GPT2_PATTERN)
    with pytest.raises(ValueError, match=r"BPE of 'ab' gives 'b'"):
        small.encode("ab")
