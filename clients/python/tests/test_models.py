"""mxserve.rlhf.safetensors_io and mxserve.rlhf.models: the file format against the spec, and
GPT-2 / Qwen2 against naive float64 implementations written here, on tiny
checkpoints the tests write themselves in Hugging Face's layout."""

import json
import math
import struct

import pytest

torch = pytest.importorskip("torch")

from mxserve.rlhf import models  # noqa: E402
from mxserve.rlhf.models import (KVCache, ModelConfig, apply_rotary, build_model,  # noqa: E402
                            load_pretrained, rotary_embedding, save_pretrained)
from mxserve.rlhf.safetensors_io import (read_safetensors, read_safetensors_header,  # noqa: E402
                                    write_safetensors)

VOCAB = 50


def raw_safetensors(path, header: dict, data: bytes, header_size=None):
    """A safetensors file from its parts, written without the module under test."""
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded) if header_size is None else header_size))
        f.write(encoded)
        f.write(data)


# --- safetensors -------------------------------------------------------------------

def test_safetensors_reads_a_file_built_by_hand(tmp_path):
    # Two F32 values 1.5, -2 and one I64 7, laid out per the spec.
    data = struct.pack("<2f", 1.5, -2.0) + struct.pack("<q", 7)
    raw_safetensors(tmp_path / "a.safetensors",
                    {"x": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]},
                     "n": {"dtype": "I64", "shape": [], "data_offsets": [8, 16]},
                     "__metadata__": {"format": "pt"}}, data)
    tensors = read_safetensors(tmp_path / "a.safetensors")
    assert tensors["x"].tolist() == [[1.5], [-2.0]]
    assert tensors["n"].dtype == torch.int64 and tensors["n"].shape == () and tensors["n"] == 7
    assert read_safetensors_header(tmp_path / "a.safetensors").metadata == {"format": "pt"}


def test_safetensors_round_trips_every_dtype(tmp_path):
    tensors = {
        "f64": torch.randn(3, 2, dtype=torch.float64),
        "f32": torch.randn(4),
        "f16": torch.randn(2, 3).half(),
        "bf16": torch.randn(5, 1).bfloat16(),
        "i64": torch.tensor([-(2 ** 40), 3]),
        "i32": torch.tensor([[1, -2]], dtype=torch.int32),
        "i16": torch.tensor([-300], dtype=torch.int16),
        "i8": torch.tensor([-5, 5], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
        "strided": torch.arange(12.0).view(3, 4).t(),  # not contiguous
    }
    path = tmp_path / "all.safetensors"
    write_safetensors(path, tensors, metadata={"who": "test"})
    header_size = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert header_size % 8 == 0
    back = read_safetensors(path)
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert read_safetensors_header(path).metadata == {"who": "test"}


GOOD = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, data, header_size, message", [
    ({"w": GOOD}, b"\0" * 8, 10 ** 6, r"header length 1000000 is beyond"),
    ({"w": GOOD}, b"\0" * 8, 2 ** 40, r"header length"),
    (None, b"", None, r"not valid UTF-8 JSON"),
    ([1, 2], b"", None, r"JSON list, expected an object"),
    ({"w": {**GOOD, "dtype": "F8"}}, b"\0" * 8, None, r"'w': unknown dtype 'F8'"),
    ({"w": {**GOOD, "shape": [-2]}}, b"\0" * 8, None, r"'w': shape \[-2\]"),
    ({"w": {**GOOD, "shape": [2.0]}}, b"\0" * 8, None, r"'w': shape"),
    ({"w": {**GOOD, "data_offsets": [0, 16]}}, b"\0" * 8, None,
     r"'w': data_offsets \[0, 16\] lie outside the data buffer of 8 bytes"),
    ({"w": {**GOOD, "data_offsets": [4, 0]}}, b"\0" * 8, None, r"'w': data_offsets"),
    ({"w": {**GOOD, "shape": [3]}}, b"\0" * 12, None, r"'w': .* hold 8 bytes, but shape"),
    ({"w": {**GOOD, "extra": 1}}, b"\0" * 8, None, r"'w': header entry has keys"),
    ({"w": GOOD, "__metadata__": {"a": 1}}, b"\0" * 8, None, r"__metadata__"),
])
def test_safetensors_rejects_a_corrupt_header(tmp_path, header, data, header_size, message):
    path = tmp_path / "bad.safetensors"
    if header is None:  # a header that is not JSON
        path.write_bytes(struct.pack("<Q", 5) + b"{nope" + data)
    else:
        raw_safetensors(path, header, data, header_size)
    with pytest.raises(ValueError, match=message) as error:
        read_safetensors(path)
    assert str(path) in str(error.value)


def test_safetensors_rejects_a_truncated_file_and_duplicate_names(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\1\0\0")
    with pytest.raises(ValueError, match="too short"):
        read_safetensors(path)
    header = b'{"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"w":{}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ValueError, match="duplicate key 'w'"):
        read_safetensors(path)


# --- tiny checkpoints in Hugging Face's layout --------------------------------------

GPT2_HF_CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                  "vocab_size": VOCAB, "n_embd": 16, "n_layer": 2, "n_head": 2,
                  "n_inner": None, "n_positions": 32, "n_ctx": 32,
                  "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
                  "bos_token_id": 0, "eos_token_id": 0}
QWEN2_HF_CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                   "vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 24, "max_position_embeddings": 64,
                   "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
                   "tie_word_embeddings": True, "use_sliding_window": False,
                   "rope_scaling": None, "bos_token_id": None, "eos_token_id": 1}


def random_tensors(shapes: dict, seed: int) -> dict:
    """float32 tensors of the given shapes; norm weights near 1, everything else
    (biases included, so that they matter) around 0."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        values = torch.randn(shape, generator=generator) * 0.3
        norm = any(part in name for part in ("ln_", "layernorm", "norm.")) and "weight" in name
        tensors[name] = values + 1 if norm else values
    return tensors


def gpt2_hf_tensors(seed=1, prefix="transformer.") -> dict:
    """GPT-2 weights as HF stores them: Conv1D weights [in, out], no lm_head (tied),
    and the old files' attn.bias / attn.masked_bias buffers."""
    shapes = {"wte.weight": [VOCAB, 16], "wpe.weight": [32, 16],
              "ln_f.weight": [16], "ln_f.bias": [16]}
    for i in range(2):
        shapes.update({f"h.{i}.ln_1.weight": [16], f"h.{i}.ln_1.bias": [16],
                       f"h.{i}.attn.c_attn.weight": [16, 48], f"h.{i}.attn.c_attn.bias": [48],
                       f"h.{i}.attn.c_proj.weight": [16, 16], f"h.{i}.attn.c_proj.bias": [16],
                       f"h.{i}.ln_2.weight": [16], f"h.{i}.ln_2.bias": [16],
                       f"h.{i}.mlp.c_fc.weight": [16, 64], f"h.{i}.mlp.c_fc.bias": [64],
                       f"h.{i}.mlp.c_proj.weight": [64, 16], f"h.{i}.mlp.c_proj.bias": [16]})
    tensors = {prefix + name: t for name, t in random_tensors(shapes, seed).items()}
    for i in range(2):
        tensors[f"{prefix}h.{i}.attn.bias"] = torch.ones(1, 1, 32, 32).tril()
        tensors[f"{prefix}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return tensors


def qwen2_hf_tensors(seed=2) -> dict:
    shapes = {"model.embed_tokens.weight": [VOCAB, 16], "model.norm.weight": [16]}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [16],
                       p + "self_attn.q_proj.weight": [16, 16], p + "self_attn.q_proj.bias": [16],
                       p + "self_attn.k_proj.weight": [8, 16], p + "self_attn.k_proj.bias": [8],
                       p + "self_attn.v_proj.weight": [8, 16], p + "self_attn.v_proj.bias": [8],
                       p + "self_attn.o_proj.weight": [16, 16],
                       p + "post_attention_layernorm.weight": [16],
                       p + "mlp.gate_proj.weight": [24, 16], p + "mlp.up_proj.weight": [24, 16],
                       p + "mlp.down_proj.weight": [16, 24]})
    return random_tensors(shapes, seed)


def write_checkpoint(directory, config: dict, tensors: dict):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


@pytest.fixture
def gpt2_dir(tmp_path):
    return write_checkpoint(tmp_path / "gpt2", GPT2_HF_CONFIG, gpt2_hf_tensors())


@pytest.fixture
def qwen2_dir(tmp_path):
    return write_checkpoint(tmp_path / "qwen2", QWEN2_HF_CONFIG, qwen2_hf_tensors())


# --- naive float64 references, straight from the HF tensors ---------------------------

def softmax(scores):
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    return [e / sum(exps) for e in exps]


def causal_attention(q, k, v, heads, kv_heads):
    """One sequence, head by head and query by query: q [T, heads*D], k/v [T, kv*D]."""
    length, dim = q.shape[0], q.shape[1] // heads
    out = torch.zeros(length, heads * dim, dtype=torch.float64)
    for h in range(heads):
        qs, kvs = slice(h * dim, (h + 1) * dim), h // (heads // kv_heads)
        ks = slice(kvs * dim, (kvs + 1) * dim)
        for i in range(length):
            p = softmax([float(q[i, qs] @ k[j, ks]) / math.sqrt(dim) for j in range(i + 1)])
            out[i, qs] = sum(p[j] * v[j, ks] for j in range(i + 1))
    return out


def naive_gpt2(w: dict, ids: list) -> torch.Tensor:
    w = {name.removeprefix("transformer."): t.double() for name, t in w.items()}

    def layer_norm(x, name):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * w[name + ".weight"] + w[name + ".bias"]

    def conv1d(x, name):  # HF's Conv1D: x @ W[in, out] + b
        return x @ w[name + ".weight"] + w[name + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    x = w["wte.weight"][ids] + w["wpe.weight"][:len(ids)]
    for i in range(2):
        qkv = conv1d(layer_norm(x, f"h.{i}.ln_1"), f"h.{i}.attn.c_attn")
        q, k, v = qkv[:, :16], qkv[:, 16:32], qkv[:, 32:]
        x = x + conv1d(causal_attention(q, k, v, 2, 2), f"h.{i}.attn.c_proj")
        hidden = gelu_new(conv1d(layer_norm(x, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc"))
        x = x + conv1d(hidden, f"h.{i}.mlp.c_proj")
    return layer_norm(x, "ln_f") @ w["wte.weight"].T


def rotate_by_hand(x, position, theta=10000.0):
    """Rotates pairs (x_i, x_{i+d/2}) of each head's vector by position·θ^(−2i/d)."""
    dim = x.shape[-1]
    out = x.clone()
    for i in range(dim // 2):
        angle = position * theta ** (-2 * i / dim)
        a, b = x[..., i], x[..., i + dim // 2]
        out[..., i] = a * math.cos(angle) - b * math.sin(angle)
        out[..., i + dim // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


def naive_qwen2(w: dict, ids: list) -> torch.Tensor:
    w = {name.removeprefix("model."): t.double() for name, t in w.items()}

    def rms_norm(x, name):
        return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * w[name + ".weight"]

    def linear(x, name):  # nn.Linear: x @ W[out, in]ᵀ (+ b)
        return x @ w[name + ".weight"].T + w.get(name + ".bias", 0)

    def rope(x, heads):  # x [T, heads * 4]
        return torch.cat([torch.stack([rotate_by_hand(x[t, h * 4:(h + 1) * 4], t)
                                       for h in range(heads)]).reshape(1, -1)
                          for t in range(x.shape[0])])

    x = w["embed_tokens.weight"][ids]
    for i in range(2):
        p = f"layers.{i}."
        h = rms_norm(x, p + "input_layernorm")
        q = rope(linear(h, p + "self_attn.q_proj"), 4)
        k = rope(linear(h, p + "self_attn.k_proj"), 2)
        v = linear(h, p + "self_attn.v_proj")
        x = x + linear(causal_attention(q, k, v, 4, 2), p + "self_attn.o_proj")
        h = rms_norm(x, p + "post_attention_layernorm")
        gate = linear(h, p + "mlp.gate_proj")
        x = x + linear(gate * torch.sigmoid(gate) * linear(h, p + "mlp.up_proj"),
                       p + "mlp.down_proj")
    return rms_norm(x, "norm") @ w["embed_tokens.weight"].T


IDS = [3, 17, 42, 0, 9, 9, 31]


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_logits_equal_a_naive_implementation(tmp_path, arch):
    config, tensors, naive = {"gpt2": (GPT2_HF_CONFIG, gpt2_hf_tensors(), naive_gpt2),
                              "qwen2": (QWEN2_HF_CONFIG, qwen2_hf_tensors(), naive_qwen2)}[arch]
    directory = write_checkpoint(tmp_path / arch, config, tensors)
    expected = naive(tensors, IDS)
    model64 = load_pretrained(directory, dtype=torch.float64)
    out = model64(torch.tensor([IDS]))
    assert out.logits.dtype == torch.float64 and out.cache is None
    torch.testing.assert_close(out.logits[0], expected, rtol=0, atol=1e-10)
    # hidden is lm_head's input.
    torch.testing.assert_close(out.logits, model64.lm_head(out.hidden), rtol=0, atol=0)
    model32 = load_pretrained(directory)
    assert model32.lm_head.weight.dtype == torch.float32
    torch.testing.assert_close(model32(torch.tensor([IDS])).logits[0].double(), expected,
                               rtol=0, atol=1e-4)


def test_gpt2_loads_a_bare_backbone_checkpoint(tmp_path):
    # The original gpt2 files were saved from GPT2Model: "h.0...", not "transformer.h.0...".
    tensors = gpt2_hf_tensors(prefix="")
    model = load_pretrained(write_checkpoint(tmp_path / "bare", GPT2_HF_CONFIG, tensors),
                            dtype=torch.float64)
    torch.testing.assert_close(model(torch.tensor([IDS])).logits[0],
                               naive_gpt2(tensors, IDS), rtol=0, atol=1e-10)


def test_rotary_embedding_at_known_positions():
    # d = 8, θ = 10000: pair i turns by p·10000^(−2i/8) = p·10^(−i).
    x = torch.randn(1, 3, 2, 8, dtype=torch.float64)  # [B, heads, T, d] at positions 0, 3
    cos, sin = rotary_embedding(torch.tensor([[0, 3]]), 8, 10000.0, torch.float64)
    assert cos.shape == sin.shape == (1, 1, 2, 8)
    rotated = apply_rotary(x, cos, sin)
    assert torch.equal(rotated[:, :, 0], x[:, :, 0])
    for i, angle in enumerate([3.0, 0.3, 0.03, 0.003]):
        a, b = x[:, :, 1, i], x[:, :, 1, i + 4]
        torch.testing.assert_close(rotated[:, :, 1, i], a * math.cos(angle) - b * math.sin(angle))
        torch.testing.assert_close(rotated[:, :, 1, i + 4],
                                   b * math.cos(angle) + a * math.sin(angle))
    # Rotation keeps lengths, and the float32 tables match within float32.
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    cos32, _ = rotary_embedding(torch.tensor([[0, 3]]), 8, 10000.0, torch.float32)
    assert cos32.dtype == torch.float32
    torch.testing.assert_close(cos32.double(), cos, rtol=0, atol=1e-6)


@pytest.fixture(params=["gpt2", "qwen2"])
def model64(request, gpt2_dir, qwen2_dir):
    directory = {"gpt2": gpt2_dir, "qwen2": qwen2_dir}[request.param]
    return load_pretrained(directory, dtype=torch.float64)


def test_decoding_token_by_token_with_the_cache_equals_the_full_forward(model64):
    ids = torch.tensor([IDS, [5, 4, 3, 2, 1, 0, 49]])
    full = model64(ids)
    prompt = model64(ids[:, :3], use_cache=True)
    assert isinstance(prompt.cache, KVCache) and prompt.cache.length == 3
    heads = model64.config.num_kv_heads
    assert prompt.cache.keys[0].shape == (2, heads, 3, model64.config.head_dim)
    steps, cache = [prompt.logits], prompt.cache
    for t in range(3, ids.shape[1]):
        out = model64(ids[:, t:t + 1], cache=cache)
        steps.append(out.logits)
        cache = out.cache
    assert cache.length == ids.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full.logits, rtol=0, atol=1e-12)
    # A forward does not change the cache it was given: the prompt's cache continues
    # the same way a second time.
    again = model64(ids[:, 3:4], cache=prompt.cache)
    torch.testing.assert_close(again.logits, steps[1], rtol=0, atol=0)


def test_a_left_padded_batch_matches_each_sequence_alone(model64):
    long, short = [7, 8, 9, 10, 11], [20, 21, 22]
    ids = torch.tensor([long, [0, 0] + short])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    batch = model64(ids, attention_mask=mask, use_cache=True)
    assert torch.isfinite(batch.logits).all()  # padding rows attend to nothing: no NaN
    alone_long = model64(torch.tensor([long]), use_cache=True)
    alone_short = model64(torch.tensor([short]), use_cache=True)
    torch.testing.assert_close(batch.logits[0], alone_long.logits[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(batch.logits[1, 2:], alone_short.logits[0], rtol=0, atol=1e-12)
    # One more token each, through the batch's cache, the mask grown by one.
    step = model64(torch.tensor([[30], [31]]), attention_mask=torch.cat(
        [mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1), cache=batch.cache)
    torch.testing.assert_close(step.logits[0],
                               model64(torch.tensor([[30]]), cache=alone_long.cache).logits[0],
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(step.logits[1],
                               model64(torch.tensor([[31]]), cache=alone_short.cache).logits[0],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_a_padded_batch_runs_under_low_precision_autocast(arch, gpt2_dir, qwen2_dir):
    """The CUDA FP16 baseline runs under autocast, where the attention scores come
    out in the autocast dtype; the mask value must fit it (float32's minimum raised
    "cannot be converted to type c10::Half without overflow"). CPU autocast is
    BF16-only in this torch, and float32's minimum overflows BF16 just the same."""
    model = load_pretrained({"gpt2": gpt2_dir, "qwen2": qwen2_dir}[arch])
    ids = torch.tensor([[7, 8, 9, 10, 11], [0, 0, 20, 21, 22]])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    reference = model(ids, attention_mask=mask).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(ids, attention_mask=mask).logits.float()
    assert torch.isfinite(low).all()
    # BF16 products: close to the FP32 forward, not equal.
    assert (low - reference).abs().max() < 0.05 * reference.abs().max()
    # The masking itself, on FP16 scores (CPU has no FP16 matmul to produce them).
    scores = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=torch.float16)
    allowed = torch.tensor([[[[True, False], [True, True]]]])
    masked = models._mask_scores(scores, allowed)
    assert masked.dtype == torch.float16
    assert masked[0, 0, 0, 1].item() == torch.finfo(torch.float16).min
    assert masked[0, 0, 1].tolist() == [3.0, 4.0]


def test_explicit_positions_and_a_wrong_mask(model64):
    ids = torch.tensor([IDS[:4]])
    default = model64(ids).logits
    torch.testing.assert_close(model64(ids, position_ids=torch.arange(4)[None]).logits, default,
                               rtol=0, atol=0)
    # Positions with other distances between them (rotary embeddings only see distances).
    assert not torch.allclose(model64(ids, position_ids=torch.tensor([[0, 1, 2, 7]])).logits,
                              default)
    with pytest.raises(ValueError, match=r"attention_mask is \[1, 3\], expected \[1, 4\]"):
        model64(ids, attention_mask=torch.ones(1, 3))


def test_gpt2_positions_beyond_its_table(gpt2_dir):
    model = load_pretrained(gpt2_dir)
    with pytest.raises(ValueError, match="position 32 is beyond GPT-2's 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_tied_embeddings_and_a_bit_exact_round_trip(tmp_path, gpt2_dir, qwen2_dir):
    gpt2, qwen2 = load_pretrained(gpt2_dir), load_pretrained(qwen2_dir)
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight
    assert qwen2.lm_head.weight is qwen2.model.embed_tokens.weight
    for model in (gpt2, qwen2):
        assert all(isinstance(getattr(m, "weight", None), torch.nn.Parameter)
                   for m in model.modules() if isinstance(m, torch.nn.Linear))
        save_pretrained(model, tmp_path / "saved")
        stored = read_safetensors(tmp_path / "saved" / "model.safetensors")
        assert "lm_head.weight" not in stored
        back = load_pretrained(tmp_path / "saved")
        assert back.config == model.config
        assert back.lm_head.weight is back.input_embeddings.weight
        state, back_state = model.state_dict(), back.state_dict()
        assert state.keys() == back_state.keys()
        assert all(torch.equal(state[name], back_state[name]) for name in state)
    # GPT-2's projections are saved the HF way, [in, out], and equal the file they came from.
    stored_gpt2 = read_safetensors(gpt2_dir / "model.safetensors")
    save_pretrained(gpt2, tmp_path / "gpt2-again")
    saved = read_safetensors(tmp_path / "gpt2-again" / "model.safetensors")
    assert saved["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)
    for name, tensor in saved.items():
        assert torch.equal(tensor, stored_gpt2[name]), name
    assert json.loads((tmp_path / "gpt2-again" / "config.json").read_text())["n_embd"] == 16


def test_an_untied_model_saves_and_loads_its_head(tmp_path):
    torch.manual_seed(0)
    config = ModelConfig.from_hf(dict(QWEN2_HF_CONFIG, tie_word_embeddings=False))
    model = build_model(config)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    save_pretrained(model, tmp_path / "untied")
    assert "lm_head.weight" in read_safetensors(tmp_path / "untied" / "model.safetensors")
    back = load_pretrained(tmp_path / "untied")
    ids = torch.tensor([IDS])
    assert torch.equal(back(ids).logits, model(ids).logits)


def test_build_model_initializes_like_hugging_face():
    torch.manual_seed(0)
    config = ModelConfig("gpt2", vocab_size=500, hidden_size=64, num_layers=8, num_heads=4,
                         num_kv_heads=4, intermediate_size=256, max_positions=64,
                         norm_eps=1e-5)
    model = build_model(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.transformer.h[0].mlp.c_proj.weight.std().item() == \
        pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert torch.equal(model.transformer.h[0].attn.c_attn.bias, torch.zeros(192))
    assert torch.equal(model.transformer.ln_f.weight, torch.ones(64))
    torch.manual_seed(0)
    assert torch.equal(build_model(config).transformer.wpe.weight, model.transformer.wpe.weight)


def test_config_round_trips_and_names_what_is_wrong():
    gpt2 = ModelConfig.from_hf(GPT2_HF_CONFIG)
    assert (gpt2.hidden_size, gpt2.num_kv_heads, gpt2.intermediate_size) == (16, 2, 64)
    assert gpt2.tie_word_embeddings and gpt2.eos_token_id == 0
    qwen2 = ModelConfig.from_hf(QWEN2_HF_CONFIG)
    assert (qwen2.num_heads, qwen2.num_kv_heads, qwen2.head_dim) == (4, 2, 4)
    for config in (gpt2, qwen2):
        assert ModelConfig.from_hf(config.to_hf()) == config
    # Qwen2's tie_word_embeddings defaults to False, as in Hugging Face.
    untied = {k: v for k, v in QWEN2_HF_CONFIG.items() if k != "tie_word_embeddings"}
    assert not ModelConfig.from_hf(untied).tie_word_embeddings
    with pytest.raises(ValueError, match="gpt2 config lacks 'n_layer'"):
        ModelConfig.from_hf({k: v for k, v in GPT2_HF_CONFIG.items() if k != "n_layer"})
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        ModelConfig.from_hf({"model_type": "llama"})
    with pytest.raises(ValueError, match="use_sliding_window=True is not supported"):
        ModelConfig.from_hf(dict(QWEN2_HF_CONFIG, use_sliding_window=True))
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        ModelConfig.from_hf(dict(QWEN2_HF_CONFIG, num_key_value_heads=3))


# --- bad checkpoints ------------------------------------------------------------------

def test_missing_directory_config_and_weights(tmp_path, gpt2_dir):
    with pytest.raises(FileNotFoundError, match=r"nowhere: model directory not found"):
        load_pretrained(tmp_path / "nowhere")
    (gpt2_dir / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json: not found"):
        load_pretrained(gpt2_dir)
    (gpt2_dir / "config.json").write_text(json.dumps(GPT2_HF_CONFIG))
    (gpt2_dir / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError,
                       match=r"neither model\.safetensors nor model\.safetensors\.index\.json"):
        load_pretrained(gpt2_dir)
    (gpt2_dir / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: "):
        load_pretrained(gpt2_dir)


def test_a_sharded_checkpoint(tmp_path):
    tensors = qwen2_hf_tensors()
    directory = tmp_path / "sharded"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(QWEN2_HF_CONFIG))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:10],
              "model-00002-of-00002.safetensors": names[10:]}
    for file, part in shards.items():
        write_safetensors(directory / file, {name: tensors[name] for name in part})
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    model = load_pretrained(directory, dtype=torch.float64)
    torch.testing.assert_close(model(torch.tensor([IDS])).logits[0],
                               naive_qwen2(tensors, IDS), rtol=0, atol=1e-10)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model-00002-of-00002\.safetensors: shard"):
        load_pretrained(directory)
    index["weight_map"][names[0]] = "../elsewhere.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"not a file name in the directory"):
        load_pretrained(directory)


def test_missing_wrong_and_unexpected_tensors(tmp_path):
    tensors = gpt2_hf_tensors()
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(ValueError, match=r"lacks tensor 'transformer\.h\.1\.mlp\.c_fc\.bias' "
                                         r"\(expected shape \[64\]\)"):
        load_pretrained(write_checkpoint(tmp_path / "missing", GPT2_HF_CONFIG, tensors))

    tensors = gpt2_hf_tensors()
    # Stored as nn.Linear would, [out, in]: the wrong way round for HF's Conv1D.
    tensors["transformer.h.0.attn.c_attn.weight"] = torch.zeros(48, 16)
    with pytest.raises(ValueError, match=r"'transformer\.h\.0\.attn\.c_attn\.weight' has shape "
                                         r"\[48, 16\], expected \[16, 48\]"):
        load_pretrained(write_checkpoint(tmp_path / "shape", GPT2_HF_CONFIG, tensors))

    tensors = qwen2_hf_tensors()
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(16)
    with pytest.raises(ValueError, match=r"unexpected tensors for qwen2: "
                                         r"model\.layers\.0\.self_attn\.o_proj\.bias"):
        load_pretrained(write_checkpoint(tmp_path / "extra", QWEN2_HF_CONFIG, tensors))

    tensors = qwen2_hf_tensors()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(2)  # old files
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # tied, equal
    model = load_pretrained(write_checkpoint(tmp_path / "quirks", QWEN2_HF_CONFIG, tensors))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="lm_head.weight differs from the token embedding"):
        load_pretrained(write_checkpoint(tmp_path / "quirks", QWEN2_HF_CONFIG, tensors))


def test_a_corrupt_weights_file_is_named(gpt2_dir):
    weights = gpt2_dir / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(ValueError, match=r"model\.safetensors: header length"):
        load_pretrained(gpt2_dir)


def test_state_dict_names_follow_hugging_face():
    torch.manual_seed(0)
    names = set(models.hf_tensors(build_model(ModelConfig.from_hf(GPT2_HF_CONFIG))))
    buffers = (".attn.bias", ".attn.masked_bias")
    assert names == {n for n in gpt2_hf_tensors() if not n.endswith(buffers)}
    names = set(models.hf_tensors(build_model(ModelConfig.from_hf(QWEN2_HF_CONFIG))))
    assert names == set(qwen2_hf_tensors())


def test_a_sequence_classification_checkpoint_loads_with_its_score_head(tmp_path):
    # Hugging Face's Qwen2ForSequenceClassification: untied, no lm_head, a score head.
    config = dict(QWEN2_HF_CONFIG, tie_word_embeddings=False,
                  architectures=["Qwen2ForSequenceClassification"])
    tensors = qwen2_hf_tensors()
    tensors["score.weight"] = torch.arange(16, dtype=torch.float32)[None, :]
    directory = write_checkpoint(tmp_path / "rm", config, tensors)
    model, extra = models.load_pretrained_with_extra(directory, extra=("score.weight",))
    assert torch.equal(extra["score.weight"], tensors["score.weight"])
    assert torch.equal(model.model.embed_tokens.weight, tensors["model.embed_tokens.weight"])
    assert torch.isfinite(model.lm_head.weight).all()
    # Without asking for it the head is an unexpected tensor, and the untied lm_head is missing.
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_pretrained(directory)
    del tensors["score.weight"]
    write_checkpoint(directory, config, tensors)
    with pytest.raises(ValueError, match="lacks tensor 'score.weight'"):
        models.load_pretrained_with_extra(directory, extra=("score.weight",))
