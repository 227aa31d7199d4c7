"""Byte-level BPE tokenization as GPT-2's and Qwen2's tokenizers do it, without the
`tokenizers` or `transformers` packages, from Hugging Face's files.

Encoding: added tokens (<|endoftext|>, <|im_start|>, ...) are cut out of the text
whole first; the rest is normalized (Qwen2: NFC), split into words by a regex
(GPT-2's, or the one tokenizer.json's Split pre-tokenizer gives), each word's UTF-8
bytes are written as GPT-2's printable stand-in characters, and BPE merges
adjacent symbols, lowest rank first, until no ranked pair is left. Decoding maps
the characters back to bytes and the bytes to UTF-8 text.

    tokenizer = BPETokenizer.from_pretrained("models/gpt2")
    ids = tokenizer.encode("Hello world")          # [15496, 995]
    tokenizer.decode(ids)                          # "Hello world"
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import regex

# GPT-2's pre-tokenization: contractions, letters, digits and other symbols each with
# an optional leading space, then runs of whitespace.
GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                r"""|\s+(?!\S)|\s+""")
# GPT-2 and Qwen2 both end a document with it and name it nowhere else.
ENDOFTEXT = "<|endoftext|>"
_CACHE_LIMIT = 100_000  # words whose BPE result is remembered


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's table from each byte to one printable character, so that BPE works on
    strings without whitespace or control characters: the bytes printable in
    Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, and the other 68,
    in increasing order, for chr(256), chr(257), ..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    for n, byte in enumerate(b for b in range(256) if b not in table):
        table[byte] = chr(256 + n)
    return dict(sorted(table.items()))


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {char: byte for byte, char in _BYTE_TO_CHAR.items()}


@dataclass(frozen=True)
class AddedToken:
    """A token matched whole in the text before BPE; `special` ones are dropped by
    decode(skip_special_tokens=True)."""
    content: str
    id: int
    special: bool = True


class BPETokenizer:
    """A byte-level BPE tokenizer: vocabulary, ranked merges, added tokens.

    vocab maps byte-level token strings to ids; merges are the pairs in rank order;
    added_tokens and the named special tokens (bos/eos/pad, and special_tokens) are
    matched whole. Without an eos_token, <|endoftext|> is the end of text when the
    vocabulary has it, as GPT-2's and Qwen2's tokenizers do. With add_bos_token,
    encode(..., add_special_tokens=True) starts with bos_token; GPT-2's and Qwen2's
    tokenizers add nothing.
    """

    def __init__(self, vocab: Mapping[str, int], merges: Sequence[Tuple[str, str]],
                 added_tokens: Sequence[AddedToken] = (), special_tokens: Sequence[str] = (),
                 pattern: str = GPT2_PATTERN, normalization: Optional[str] = None,
                 bos_token: Optional[str] = None, eos_token: Optional[str] = None,
                 pad_token: Optional[str] = None, add_bos_token: bool = False):
        self._vocab = dict(vocab)
        self._ranks = {}
        for rank, pair in enumerate(merges):
            self._ranks.setdefault(tuple(pair), rank)
        self._added = {token.content: token for token in added_tokens}
        if eos_token is None and (ENDOFTEXT in self._vocab or ENDOFTEXT in self._added):
            eos_token = ENDOFTEXT
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        for content in (*special_tokens, bos_token, eos_token, pad_token):
            if content is not None and content not in self._added:
                if content not in self._vocab:
                    raise ValueError(f"special token {content!r} is not in the vocabulary")
                self._added[content] = AddedToken(content, self._vocab[content], True)
        if add_bos_token and bos_token is None:
            raise ValueError("add_bos_token needs a bos_token")
        self.add_bos_token = add_bos_token
        self._id_to_token = self._index_ids()
        self._pattern = regex.compile(pattern)
        self._normalization = normalization
        # Longest first, so that an added token extending another one wins.
        longest_first = sorted(self._added, key=len, reverse=True)
        self._added_pattern = (re.compile("|".join(map(re.escape, longest_first)))
                               if longest_first else None)
        self._cache: Dict[str, Tuple[int, ...]] = {}

    def _index_ids(self) -> Dict[int, str]:
        """id -> token, checking that ids are unique and that every token BPE can
        produce is made of byte-level characters."""
        tokens: Dict[int, str] = {}
        for token, token_id in self._vocab.items():
            if token not in self._added and not all(c in _CHAR_TO_BYTE for c in token):
                raise ValueError(f"vocabulary token {token!r} (id {token_id}) is not made of "
                                 "byte-level characters: not a byte-level BPE vocabulary")
            if tokens.setdefault(token_id, token) != token:
                raise ValueError(f"id {token_id} is both {tokens[token_id]!r} and {token!r}")
        for token in self._added.values():
            if self._vocab.get(token.content, token.id) != token.id:
                raise ValueError(f"added token {token.content!r} has id {token.id}, the "
                                 f"vocabulary {self._vocab[token.content]}")
            if tokens.setdefault(token.id, token.content) != token.content:
                raise ValueError(f"id {token.id} is both {tokens[token.id]!r} and "
                                 f"{token.content!r}")
        return tokens

    # --- loading ------------------------------------------------------------------

    @classmethod
    def from_files(cls, vocab_json: os.PathLike | str,
                   merges_txt: os.PathLike | str) -> "BPETokenizer":
        """From GPT-2-style vocab.json ({token: id}) and merges.txt ("a b" per line)."""
        _require_files(Path(vocab_json), Path(merges_txt))
        vocab = _read_vocab(Path(vocab_json))
        return cls(vocab, _read_merges(Path(merges_txt), vocab))

    @classmethod
    def from_tokenizer_json(cls, path: os.PathLike | str) -> "BPETokenizer":
        """From a Hugging Face tokenizers file (tokenizer.json) with a BPE model."""
        return cls(**_read_tokenizer_json(Path(path)))

    @classmethod
    def from_pretrained(cls, directory: os.PathLike | str) -> "BPETokenizer":
        """From a Hugging Face model directory: tokenizer.json if present, else
        vocab.json + merges.txt (with added_tokens.json); the special tokens from
        tokenizer_config.json, else special_tokens_map.json."""
        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory}: tokenizer directory not found")
        if (directory / "tokenizer.json").is_file():
            kwargs = _read_tokenizer_json(directory / "tokenizer.json")
        else:
            vocab_file, merges_file = directory / "vocab.json", directory / "merges.txt"
            _require_files(vocab_file, merges_file, instead="tokenizer.json")
            vocab = _read_vocab(vocab_file)
            kwargs = {"vocab": vocab, "merges": _read_merges(merges_file, vocab),
                      "added_tokens": _read_added_tokens(directory)}
        kwargs.update(_read_special_tokens(directory))
        return cls(**kwargs)

    # --- the vocabulary -----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """One more than the largest id: every id encode gives is below it. (A model's
        embedding may have more rows: Qwen2.5's has 151,936 for 151,665 tokens.)"""
        return max(self._id_to_token, default=-1) + 1

    def token_to_id(self, token: str) -> Optional[int]:
        if token in self._added:
            return self._added[token].id
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> Optional[str]:
        return self._id_to_token.get(token_id)

    @property
    def bos_token_id(self) -> Optional[int]:
        return None if self.bos_token is None else self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> Optional[int]:
        return None if self.eos_token is None else self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> Optional[int]:
        """The pad token's id, or the end of text's when there is no pad token (GPT-2)."""
        if self.pad_token is None:
            return self.eos_token_id
        return self.token_to_id(self.pad_token)

    # --- encoding and decoding ----------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        """Token ids of text; added tokens in it are matched whole, longest first."""
        ids = [self.bos_token_id] if add_special_tokens and self.add_bos_token else []
        for piece, added in self._split_added(text):
            if added:
                ids.append(self._added[piece].id)
                continue
            if self._normalization:
                piece = unicodedata.normalize(self._normalization, piece)
            for word in self._words(piece):
                ids.extend(self._bpe(word))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ids; bytes that are not valid UTF-8 (a character cut between
        tokens) become U+FFFD. Raises ValueError for an id the vocabulary lacks."""
        parts: List[str] = []
        pending = bytearray()
        for token_id in ids:
            token = self._id_to_token.get(int(token_id))
            if token is None:
                raise ValueError(f"id {int(token_id)} is not in the vocabulary "
                                 f"(vocab_size {self.vocab_size})")
            added = self._added.get(token)
            if added is None:
                pending.extend(_CHAR_TO_BYTE[char] for char in token)
            elif not (skip_special_tokens and added.special):
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
                parts.append(token)
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def _split_added(self, text: str) -> Iterator[Tuple[str, bool]]:
        """The text as (piece, is_added_token), in order, empty pieces left out."""
        start = 0
        if self._added_pattern is not None:
            for match in self._added_pattern.finditer(text):
                if match.start() > start:
                    yield text[start:match.start()], False
                yield match.group(), True
                start = match.end()
        if start < len(text):
            yield text[start:], False

    def _words(self, text: str) -> Iterator[str]:
        """The pre-tokenizer's words: the regex's matches and any text between them."""
        start = 0
        for match in self._pattern.finditer(text):
            if match.start() > start:
                yield text[start:match.start()]
            if match.group():
                yield match.group()
            start = match.end()
        if start < len(text):
            yield text[start:]

    def _bpe(self, word: str) -> Tuple[int, ...]:
        """The ids of one word: its bytes as symbols, merged lowest rank first."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = [_BYTE_TO_CHAR[byte] for byte in word.encode("utf-8")]
        while len(symbols) > 1:
            pairs = {pair for pair in zip(symbols, symbols[1:]) if pair in self._ranks}
            if not pairs:
                break
            best = min(pairs, key=self._ranks.__getitem__)
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        missing = [symbol for symbol in symbols if symbol not in self._vocab]
        if missing:
            raise ValueError(f"BPE of {word!r} gives {missing[0]!r}, which is not in the "
                             "vocabulary")
        ids = tuple(self._vocab[symbol] for symbol in symbols)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[word] = ids
        return ids


# --- reading Hugging Face's files -------------------------------------------------------

def _require_files(*files: Path, instead: Optional[str] = None) -> None:
    missing = [str(file) for file in files if not file.is_file()]
    if missing:
        alternative = f" (and there is no {instead})" if instead else ""
        raise FileNotFoundError(f"tokenizer file(s) not found: {', '.join(missing)}"
                                f"{alternative}")


def _read_json(file: Path):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{file}: not valid UTF-8 JSON: {error}") from None


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_vocab(vocab, where: str) -> Dict[str, int]:
    if not (isinstance(vocab, dict) and all(_is_id(v) for v in vocab.values())):
        raise ValueError(f"{where}: expected an object of token -> non-negative integer id")
    return vocab


def _read_vocab(file: Path) -> Dict[str, int]:
    return _check_vocab(_read_json(file), str(file))


def _merge_pair(entry, vocab: Mapping[str, int], where: str) -> Tuple[str, str]:
    """One merge from "a b" or ["a", "b"]; a, b and ab must all be tokens."""
    if isinstance(entry, str):
        entry = entry.split(" ")
    if not (isinstance(entry, list) and len(entry) == 2
            and all(isinstance(part, str) and part for part in entry)):
        raise ValueError(f"{where}: malformed merge, expected two tokens separated by one space")
    first, second = entry
    for token in (first, second, first + second):
        if token not in vocab:
            raise ValueError(f"{where}: merge {first!r} {second!r} uses {token!r}, which is "
                             "not in the vocabulary")
    return first, second


def _read_merges(file: Path, vocab: Mapping[str, int]) -> List[Tuple[str, str]]:
    """merges.txt: an optional "#version" line, then one "a b" merge per line, in
    rank order. Byte-level tokens hold no whitespace, so lines split on "\\n" only."""
    try:
        lines = file.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as error:
        raise ValueError(f"{file}: not UTF-8: {error}") from None
    merges = []
    for number, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        merges.append(_merge_pair(line, vocab, f"{file} line {number}"))
    return merges


def _normalization(normalizer, file: Path) -> Optional[str]:
    """tokenizer.json's normalizer as a unicodedata form, None for none."""
    if normalizer is None:
        return None
    if normalizer.get("type") == "Sequence" and len(normalizer.get("normalizers", [])) <= 1:
        return _normalization((normalizer["normalizers"] or [None])[0], file)
    if normalizer.get("type") in ("NFC", "NFD", "NFKC", "NFKD"):
        return normalizer["type"]
    raise ValueError(f"{file}: normalizer {normalizer!r} is not supported (only NFC, NFD, "
                     "NFKC, NFKD)")


def _pattern(pre_tokenizer, file: Path) -> str:
    """tokenizer.json's pre-tokenizer as one splitting regex: a Split's pattern
    (Qwen2), else GPT-2's, which is what ByteLevel with use_regex applies (GPT-2)."""
    steps = [pre_tokenizer]
    if isinstance(pre_tokenizer, dict) and pre_tokenizer.get("type") == "Sequence":
        steps = pre_tokenizer.get("pretokenizers") or []
    split, byte_level_regex = None, False
    for step in steps:
        step = step if isinstance(step, dict) else {}
        pattern = step.get("pattern")
        if (step.get("type") == "Split" and isinstance(pattern, dict) and "Regex" in pattern
                and step.get("behavior") == "Isolated" and not step.get("invert")):
            split = pattern["Regex"]
        elif step.get("type") == "ByteLevel" and not step.get("add_prefix_space"):
            byte_level_regex = step.get("use_regex", True)
        else:
            raise ValueError(f"{file}: pre-tokenizer {step!r} is not supported (only a "
                             "Split by an isolated Regex and ByteLevel without a prefix space)")
    if split is not None and byte_level_regex:
        raise ValueError(f"{file}: a Split regex followed by ByteLevel's own regex is not "
                         "supported")
    if split is None and not byte_level_regex:
        raise ValueError(f"{file}: the pre-tokenizer does not split words (neither a Split "
                         "regex nor ByteLevel with use_regex)")
    return split or GPT2_PATTERN


def _read_tokenizer_json(file: Path) -> dict:
    """BPETokenizer's arguments from a tokenizer.json."""
    _require_files(file)
    data = _read_json(file)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        raise ValueError(f"{file}: expected a tokenizers file with a BPE model")
    for option in ("byte_fallback", "ignore_merges", "continuing_subword_prefix",
                   "end_of_word_suffix"):
        if model.get(option):
            raise ValueError(f"{file}: model.{option}={model[option]!r} is not supported")
    vocab = _check_vocab(model.get("vocab"), f"{file}: model.vocab")
    merges = model.get("merges")
    if not isinstance(merges, list):
        raise ValueError(f"{file}: model.merges is not a list")
    added = []
    for index, entry in enumerate(data.get("added_tokens") or []):
        if not (isinstance(entry, dict) and isinstance(entry.get("content"), str)
                and entry["content"] and _is_id(entry.get("id"))):
            raise ValueError(f"{file}: added_tokens[{index}] needs a non-empty string "
                             "content and a non-negative integer id")
        added.append(AddedToken(entry["content"], entry["id"], bool(entry.get("special"))))
    return {"vocab": vocab,
            "merges": [_merge_pair(entry, vocab, f"{file}: model.merges[{index}]")
                       for index, entry in enumerate(merges)],
            "added_tokens": added,
            "pattern": _pattern(data.get("pre_tokenizer"), file),
            "normalization": _normalization(data.get("normalizer"), file)}


def _read_json_object(file: Path) -> dict:
    """A JSON file that must hold an object; {} when the file is absent."""
    if not file.is_file():
        return {}
    data = _read_json(file)
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object")
    return data


def _read_added_tokens(directory: Path) -> List[AddedToken]:
    """Added tokens beside a vocab.json: added_tokens.json ({content: id}) and
    tokenizer_config.json's added_tokens_decoder ({id: {content, special}})."""
    added: Dict[str, AddedToken] = {}
    file = directory / "added_tokens.json"
    for content, token_id in _check_vocab(_read_json_object(file), str(file)).items():
        added[content] = AddedToken(content, token_id, special=False)
    file = directory / "tokenizer_config.json"
    decoder = _read_json_object(file).get("added_tokens_decoder") or {}
    for key, entry in decoder.items():
        if not (key.isdigit() and isinstance(entry, dict)
                and isinstance(entry.get("content"), str) and entry["content"]):
            raise ValueError(f"{file}: added_tokens_decoder[{key!r}] needs an integer key "
                             "and a non-empty string content")
        added[entry["content"]] = AddedToken(entry["content"], int(key),
                                             bool(entry.get("special")))
    return list(added.values())


def _read_special_tokens(directory: Path) -> dict:
    """bos/eos/pad tokens, additional special tokens and add_bos_token from
    tokenizer_config.json, falling back to special_tokens_map.json."""
    sources = [_read_json_object(directory / name)
               for name in ("tokenizer_config.json", "special_tokens_map.json")]

    def first(key: str):
        return next((source[key] for source in sources if source.get(key) is not None), None)

    def token(key: str, value) -> Optional[str]:  # "tok" or {"content": "tok", ...}
        value = value.get("content") if isinstance(value, dict) else value
        if not (value is None or isinstance(value, str)):
            raise ValueError(f"{directory}: {key} {value!r} is not a token string")
        return value

    return {"bos_token": token("bos_token", first("bos_token")),
            "eos_token": token("eos_token", first("eos_token")),
            "pad_token": token("pad_token", first("pad_token")),
            "special_tokens": [token("additional_special_tokens", value)
                               for value in first("additional_special_tokens") or []],
            "add_bos_token": bool(first("add_bos_token"))}
