"""GPT-2 and Qwen2 (Qwen2.5) causal language models in plain PyTorch, loading and
saving Hugging Face checkpoints (config.json + safetensors) offline.

The RLHF experiment needs real models without the `transformers` package, and it
replaces every nn.Linear by a remote layer running on mxserved. So every projection
here is an nn.Linear, the LM head included, and module names follow Hugging Face's
(`transformer.h.0.attn.c_attn`, `model.layers.0.self_attn.q_proj`, ...) so that
checkpoints load by name and layer names mean the same thing everywhere.

    model = load_pretrained("models/gpt2")
    out = model(input_ids, attention_mask=mask, use_cache=True)   # LMOutput
    out = model(next_ids, attention_mask=longer_mask, cache=out.cache)

Batches are left-padded: `attention_mask` (1 = token, 0 = padding) covers the cached
and the current tokens, and the default positions count real tokens only, so a
padded sequence gets the same logits as the same sequence alone. There is no
dropout: the models compute what Hugging Face's compute in eval mode.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import nn

from mxserve.rlhf.safetensors_io import read_safetensors, read_safetensors_header, write_safetensors

INIT_STD = 0.02  # Hugging Face's initializer_range for both architectures


@dataclass
class ModelConfig:
    """The architecture of a GPT-2 or Qwen2 model: what config.json says, in one
    vocabulary for both."""
    arch: str                 # "gpt2" or "qwen2"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int         # gpt2: == num_heads; qwen2: grouped-query attention
    intermediate_size: int    # gpt2: n_inner or 4 * hidden_size
    max_positions: int        # gpt2: n_positions; qwen2: max_position_embeddings
    norm_eps: float           # gpt2: layer_norm_epsilon; qwen2: rms_norm_eps
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None

    def __post_init__(self) -> None:
        if self.arch not in _HF_KEYS:
            raise ValueError(f"unsupported arch {self.arch!r} (supported: gpt2, qwen2)")
        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                      "intermediate_size", "max_positions"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{self.arch} config: {field} must be a positive integer, "
                                 f"not {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"{self.arch} config: hidden_size {self.hidden_size} is not a "
                             f"multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.arch} config: num_heads {self.num_heads} is not a "
                             f"multiple of num_kv_heads {self.num_kv_heads}")
        if self.arch == "gpt2" and self.num_kv_heads != self.num_heads:
            raise ValueError("gpt2 config: num_kv_heads must equal num_heads")
        if self.arch == "qwen2" and self.head_dim % 2:
            raise ValueError(f"qwen2 config: head_dim {self.head_dim} must be even for "
                             "rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, d: dict) -> "ModelConfig":
        """From a Hugging Face config.json dict with model_type "gpt2" or "qwen2".

        Keys Hugging Face gives defaults for take those defaults; options this
        implementation does not compute (another activation, sliding-window
        attention, rope scaling, ...) raise ValueError rather than load a model that
        computes something else.
        """
        if not isinstance(d, dict):
            raise ValueError(f"config is a {type(d).__name__}, expected a JSON object")
        model_type = d.get("model_type")
        if model_type not in _HF_KEYS:
            raise ValueError(f"unsupported model_type {model_type!r} (supported: gpt2, qwen2)")

        def need(key: str):
            if key not in d:
                raise ValueError(f"{model_type} config lacks {key!r}")
            return d[key]

        def only(key: str, supported) -> None:
            if key in d and d[key] != supported:
                raise ValueError(f"{model_type} config: {key}={d[key]!r} is not supported "
                                 f"(only {supported!r})")

        if model_type == "gpt2":
            only("activation_function", "gelu_new")
            only("scale_attn_weights", True)
            only("scale_attn_by_inverse_layer_idx", False)
            hidden = need("n_embd")
            return cls(arch="gpt2", vocab_size=need("vocab_size"), hidden_size=hidden,
                       num_layers=need("n_layer"), num_heads=need("n_head"),
                       num_kv_heads=need("n_head"),
                       intermediate_size=d.get("n_inner") or 4 * hidden,
                       max_positions=need("n_positions"),
                       norm_eps=float(d.get("layer_norm_epsilon", 1e-5)),
                       tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
                       bos_token_id=_token_id(d.get("bos_token_id")),
                       eos_token_id=_token_id(d.get("eos_token_id")))
        only("hidden_act", "silu")
        only("use_sliding_window", False)
        only("rope_scaling", None)
        heads = need("num_attention_heads")
        return cls(arch="qwen2", vocab_size=need("vocab_size"), hidden_size=need("hidden_size"),
                   num_layers=need("num_hidden_layers"), num_heads=heads,
                   num_kv_heads=d.get("num_key_value_heads") or heads,
                   intermediate_size=need("intermediate_size"),
                   max_positions=d.get("max_position_embeddings", 32768),
                   norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(d.get("rope_theta", 10000.0)),
                   tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                   bos_token_id=_token_id(d.get("bos_token_id")),
                   eos_token_id=_token_id(d.get("eos_token_id")))

    def to_hf(self) -> dict:
        """A Hugging Face config.json dict that from_hf (and transformers) reads back."""
        keys = _HF_KEYS[self.arch]
        d = {"architectures": [keys["class"]], "model_type": self.arch}
        d.update({hf: getattr(self, ours) for ours, hf in keys["fields"].items()})
        if self.arch == "gpt2":
            d.update(n_ctx=self.max_positions, activation_function="gelu_new")
        else:
            d.update(hidden_act="silu", use_sliding_window=False)
        return d


# config.json's names for ModelConfig's fields, per model_type.
_HF_KEYS = {
    "gpt2": {"class": "GPT2LMHeadModel", "fields": {
        "vocab_size": "vocab_size", "hidden_size": "n_embd", "num_layers": "n_layer",
        "num_heads": "n_head", "intermediate_size": "n_inner", "max_positions": "n_positions",
        "norm_eps": "layer_norm_epsilon", "tie_word_embeddings": "tie_word_embeddings",
        "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"}},
    "qwen2": {"class": "Qwen2ForCausalLM", "fields": {
        "vocab_size": "vocab_size", "hidden_size": "hidden_size",
        "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
        "num_kv_heads": "num_key_value_heads", "intermediate_size": "intermediate_size",
        "max_positions": "max_position_embeddings", "norm_eps": "rms_norm_eps",
        "rope_theta": "rope_theta", "tie_word_embeddings": "tie_word_embeddings",
        "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"}},
}


def _token_id(value) -> Optional[int]:
    """A config's bos/eos id; some configs list several ids, the first is taken."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value


class KVCache:
    """Every layer's keys and values for the tokens seen so far, each
    [batch, kv_heads, length, head_dim] (Qwen2's keys already rotated).

    Immutable: a forward with a cache returns a new one, so one prompt's cache can
    be continued several ways.
    """

    def __init__(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]):
        if not keys or len(keys) != len(values):
            raise ValueError(f"KVCache needs one key and one value tensor per layer, got "
                             f"{len(keys)} keys and {len(values)} values")
        self.keys: Tuple[torch.Tensor, ...] = tuple(keys)
        self.values: Tuple[torch.Tensor, ...] = tuple(values)

    @property
    def length(self) -> int:
        """How many tokens (padding included) the cache holds."""
        return self.keys[0].shape[2]


@dataclass
class LMOutput:
    """What a forward returns; value and reward heads read `hidden`."""
    logits: torch.Tensor             # [B, T, vocab]
    hidden: torch.Tensor             # [B, T, hidden] after the final norm: lm_head's input
    cache: Optional[KVCache]         # with use_cache=True or a cache given


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            allowed: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d) v over the keys each query is allowed to see.

    q is [B, H, T, D]; k and v are [B, H_kv, S, D], each key/value head shared by
    H / H_kv consecutive query heads (grouped-query attention); allowed is a bool
    [B, 1, T, S]. The softmax runs in float32 at least. A query allowed no key at
    all (a padding token) gets zeros rather than the NaN of an empty softmax.

    Under autocast (FP16 on CUDA, BF16 on CPU) the score product comes out in the
    autocast dtype whatever its inputs were, so the mask value must fit that dtype:
    see `_mask_scores`.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(compute) @ k.to(compute).transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = _mask_scores(scores, allowed).to(compute)
    probs = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)
    return probs.to(v.dtype) @ v


def _mask_scores(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`scores` with the positions a query may not see set to the most negative
    finite value of the scores' own dtype: float32's minimum does not convert to
    float16 (or bfloat16) and raised under CUDA FP16 autocast."""
    return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, heads * D] -> [B, heads, T, D]."""
    batch, length, _ = x.shape
    return x.view(batch, length, heads, -1).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, T, D] -> [B, T, heads * D]."""
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * dim)


def _with_past(past: Optional[Tuple[torch.Tensor, torch.Tensor]], k: torch.Tensor,
               v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    if past is None:
        return k, v
    return torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)


# --- GPT-2 -------------------------------------------------------------------------

class GPT2Attention(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.num_heads = config.num_heads
        self.c_attn = nn.Linear(config.hidden_size, 3 * config.hidden_size, **factory)
        self.c_proj = nn.Linear(config.hidden_size, config.hidden_size, **factory)

    def forward(self, x, allowed, past):
        q, k, v = (_split_heads(t, self.num_heads)
                   for t in self.c_attn(x).chunk(3, dim=-1))
        k, v = _with_past(past, k, v)
        return self.c_proj(_merge_heads(_attend(q, k, v, allowed))), k, v


class GPT2MLP(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.c_fc = nn.Linear(config.hidden_size, config.intermediate_size, **factory)
        self.c_proj = nn.Linear(config.intermediate_size, config.hidden_size, **factory)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # "gelu_new"


class GPT2Block(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, **factory)
        self.attn = GPT2Attention(config, **factory)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, **factory)
        self.mlp = GPT2MLP(config, **factory)

    def forward(self, x, allowed, past):
        attended, k, v = self.attn(self.ln_1(x), allowed, past)
        x = x + attended
        return x + self.mlp(self.ln_2(x)), k, v


class GPT2Model(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.wpe = nn.Embedding(config.max_positions, config.hidden_size, **factory)
        self.h = nn.ModuleList(GPT2Block(config, **factory) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, **factory)

    def forward(self, input_ids, position_ids, allowed, cache):
        if position_ids.numel() and int(position_ids.max()) >= self.config.max_positions:
            raise ValueError(f"position {int(position_ids.max())} is beyond GPT-2's "
                             f"{self.config.max_positions} learned positions")
        x = self.wte(input_ids) + self.wpe(position_ids)
        keys, values = [], []
        for i, block in enumerate(self.h):
            past = None if cache is None else (cache.keys[i], cache.values[i])
            x, k, v = block(x, allowed, past)
            keys.append(k)
            values.append(v)
        return self.ln_f(x), keys, values


# --- Qwen2 -------------------------------------------------------------------------

def rotary_embedding(position_ids: torch.Tensor, head_dim: int, theta: float,
                     dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, 1, T, head_dim] of the rotary angles at the given positions.

    Angle p·θ^(−2i/d) for i < d/2, repeated for the second half (Hugging Face's
    rotate_half layout), computed in float32 at least and returned in `dtype`.
    """
    compute = torch.promote_types(dtype, torch.float32)
    exponents = torch.arange(0, head_dim, 2, device=position_ids.device).to(compute) / head_dim
    inv_freq = 1.0 / theta ** exponents
    angles = position_ids.to(compute)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates each pair (x_i, x_{i+d/2}) of x [B, heads, T, d] by its angle."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class Qwen2RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, normalized in float32 at least."""

    def __init__(self, hidden_size: int, eps: float, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x):
        y = x.to(torch.promote_types(x.dtype, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class Qwen2Attention(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        dim, hidden = config.head_dim, config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * dim, **factory)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * dim, **factory)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * dim, **factory)
        self.o_proj = nn.Linear(self.num_heads * dim, hidden, bias=False, **factory)

    def forward(self, x, rope, allowed, past):
        q = apply_rotary(_split_heads(self.q_proj(x), self.num_heads), *rope)
        k = apply_rotary(_split_heads(self.k_proj(x), self.num_kv_heads), *rope)
        k, v = _with_past(past, k, _split_heads(self.v_proj(x), self.num_kv_heads))
        return self.o_proj(_merge_heads(_attend(q, k, v, allowed))), k, v


class Qwen2MLP(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=False, **factory)
        self.up_proj = nn.Linear(hidden, inner, bias=False, **factory)
        self.down_proj = nn.Linear(inner, hidden, bias=False, **factory)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.input_layernorm = Qwen2RMSNorm(config.hidden_size, config.norm_eps, **factory)
        self.self_attn = Qwen2Attention(config, **factory)
        self.post_attention_layernorm = Qwen2RMSNorm(config.hidden_size, config.norm_eps,
                                                     **factory)
        self.mlp = Qwen2MLP(config, **factory)

    def forward(self, x, rope, allowed, past):
        attended, k, v = self.self_attn(self.input_layernorm(x), rope, allowed, past)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class Qwen2Model(nn.Module):
    def __init__(self, config: ModelConfig, **factory):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(config, **factory)
                                    for _ in range(config.num_layers))
        self.norm = Qwen2RMSNorm(config.hidden_size, config.norm_eps, **factory)

    def forward(self, input_ids, position_ids, allowed, cache):
        x = self.embed_tokens(input_ids)
        rope = rotary_embedding(position_ids, self.config.head_dim, self.config.rope_theta,
                                x.dtype)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            past = None if cache is None else (cache.keys[i], cache.values[i])
            x, k, v = layer(x, rope, allowed, past)
            keys.append(k)
            values.append(v)
        return self.norm(x), keys, values


# --- the causal LMs ----------------------------------------------------------------

class CausalLM(nn.Module):
    """A decoder-only LM: a backbone (GPT-2's `transformer`, Qwen2's `model`) and an
    nn.Linear `lm_head`, which is the token embedding itself when
    config.tie_word_embeddings."""

    base_model_prefix: str                  # the backbone's attribute and HF key prefix
    hf_transposed: Tuple[str, ...] = ()     # weights HF stores as [in, out] (Conv1D)
    hf_ignored: re.Pattern                  # tensors HF files have that are not weights
    config: ModelConfig
    lm_head: nn.Linear

    def __init__(self, config: ModelConfig, backbone: nn.Module, device=None, dtype=None):
        super().__init__()
        self.config = config
        setattr(self, self.base_model_prefix, backbone)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False,
                                 device=device, dtype=dtype)
        self.tie_weights()

    @property
    def input_embeddings(self) -> nn.Embedding:
        raise NotImplementedError

    def tie_weights(self) -> None:
        """Makes lm_head.weight the embedding Parameter when the config ties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.input_embeddings.weight

    def init_weights(self) -> None:
        """Hugging Face's initialization: weights N(0, 0.02), biases 0, norms 1."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            if isinstance(module, Qwen2RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, cache: Optional[KVCache] = None,
                use_cache: bool = False) -> LMOutput:
        """Logits and final hidden states of input_ids [B, T], after the cache's tokens.

        attention_mask [B, past + T] marks real tokens (1) and padding (0) of the
        cached and the current tokens; a token attends to the real tokens up to and
        including itself. position_ids [B, T] default to the count of real tokens
        before each token (so a left-padded sequence is numbered 0..n-1 from its
        first real token), or to past..past+T-1 without a mask. The cache comes back
        extended with use_cache=True or when one was given.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens], got {list(input_ids.shape)}")
        batch, length = input_ids.shape
        past = 0
        if cache is not None:
            if len(cache.keys) != self.config.num_layers or cache.keys[0].shape[0] != batch:
                raise ValueError(f"cache has {len(cache.keys)} layers and batch "
                                 f"{cache.keys[0].shape[0]}, the model {self.config.num_layers}"
                                 f" layers and the input batch {batch}")
            past = cache.length
        total = past + length
        device = input_ids.device
        if attention_mask is not None and tuple(attention_mask.shape) != (batch, total):
            raise ValueError(f"attention_mask is {list(attention_mask.shape)}, expected "
                             f"[{batch}, {total}] (cached + current tokens)")
        if position_ids is None:
            if attention_mask is None:
                position_ids = torch.arange(past, total, device=device).expand(batch, length)
            else:
                counts = attention_mask.long().cumsum(-1) - 1
                position_ids = counts.clamp(min=0)[:, past:]
        allowed = torch.ones(length, total, dtype=torch.bool, device=device).tril(past)[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        backbone = getattr(self, self.base_model_prefix)
        hidden, keys, values = backbone(input_ids, position_ids, allowed, cache)
        new_cache = KVCache(keys, values) if use_cache or cache is not None else None
        return LMOutput(self.lm_head(hidden), hidden, new_cache)


class GPT2LMHeadModel(CausalLM):
    base_model_prefix = "transformer"
    hf_transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                     "mlp.c_proj.weight")
    # Old GPT-2 files carry the causal mask as buffers.
    hf_ignored = re.compile(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)")

    def __init__(self, config: ModelConfig, device=None, dtype=None):
        super().__init__(config, GPT2Model(config, device=device, dtype=dtype), device, dtype)

    @property
    def input_embeddings(self) -> nn.Embedding:
        return self.transformer.wte

    def init_weights(self) -> None:
        """As CausalLM's, and like Hugging Face's GPT-2 the projections back into the
        residual stream get std 0.02 / sqrt(2 · layers)."""
        super().init_weights()
        for block in self.transformer.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, std=INIT_STD / math.sqrt(2 * self.config.num_layers))


class Qwen2ForCausalLM(CausalLM):
    base_model_prefix = "model"
    # Older transformers versions saved the rotary frequencies.
    hf_ignored = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")

    def __init__(self, config: ModelConfig, device=None, dtype=None):
        super().__init__(config, Qwen2Model(config, device=device, dtype=dtype), device, dtype)

    @property
    def input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens


MODEL_CLASSES: Dict[str, Type[CausalLM]] = {"gpt2": GPT2LMHeadModel, "qwen2": Qwen2ForCausalLM}


def build_model(config: ModelConfig) -> CausalLM:
    """A randomly initialized float32 model (seed with torch.manual_seed first)."""
    model = MODEL_CLASSES[config.arch](config)
    model.init_weights()
    return model


# --- checkpoints -------------------------------------------------------------------

def hf_tensors(model: CausalLM) -> Dict[str, torch.Tensor]:
    """The model's tensors by their Hugging Face names and in HF layout: views of the
    parameters (GPT-2's Conv1D weights transposed to [in, out]), without lm_head.weight
    when it is the tied embedding, which HF files omit."""
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        tensors[name] = tensor.t() if name.endswith(model.hf_transposed) else tensor
    return tensors


def save_pretrained(model: CausalLM, path: os.PathLike | str) -> None:
    """Writes config.json and model.safetensors in Hugging Face's layout."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf()
    config["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(directory / "model.safetensors", hf_tensors(model),
                      metadata={"format": "pt"})


def _read_config(directory: Path) -> ModelConfig:
    file = directory / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: not found (a model directory holds config.json "
                                "and model.safetensors)")
    try:
        return ModelConfig.from_hf(json.loads(file.read_text(encoding="utf-8")))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{file}: {error}") from None


def read_model_config(path: os.PathLike | str) -> ModelConfig:
    """The ModelConfig of a checkpoint directory's config.json, without its weights."""
    return _read_config(Path(path))


def _weight_files(directory: Path) -> List[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json names."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if not index.is_file():
        raise FileNotFoundError(f"{directory}: neither model.safetensors nor "
                                "model.safetensors.index.json found (only safetensors "
                                "weights are read)")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (ValueError, AttributeError):
        weight_map = None
    if not (isinstance(weight_map, dict)
            and all(isinstance(f, str) for f in weight_map.values())):
        raise ValueError(f"{index}: expected a JSON object with a \"weight_map\" object "
                         "of tensor name -> file name")
    shards = []
    for name in sorted(set(weight_map.values())):
        if name in ("", ".", "..") or Path(name).name != name:
            raise ValueError(f"{index}: shard {name!r} is not a file name in the directory")
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name}: shard named in {index.name} "
                                    "not found")
        shards.append(directory / name)
    return shards


def load_pretrained(path: os.PathLike | str, dtype: torch.dtype = torch.float32) -> CausalLM:
    """A model from a Hugging Face directory: config.json and model.safetensors (or a
    sharded model.safetensors.index.json), its weights converted to `dtype`.
    See `load_pretrained_with_extra` for the checks."""
    return load_pretrained_with_extra(path, (), dtype)[0]


def load_pretrained_with_extra(path: os.PathLike | str, extra: Sequence[str] = (),
                               dtype: torch.dtype = torch.float32
                               ) -> Tuple[CausalLM, Dict[str, torch.Tensor]]:
    """load_pretrained, plus the tensors named in `extra` that the checkpoint holds
    beside the model (e.g. a sequence-classification head's "score.weight"), which
    are returned by name. With `extra`, an untied lm_head.weight may be missing (a
    classification checkpoint has none); the head keeps its initial values.

    Everything is checked before weights are read: a missing directory, config.json or
    weights file raises FileNotFoundError; a missing tensor, a wrong shape or an
    unexpected tensor raises ValueError naming it. Checkpoints saved from the bare
    backbone (keys without "transformer." / "model.", like the original gpt2 files)
    load too. A tied lm_head.weight may be present if it equals the embedding.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: model directory not found (expected "
                                "config.json and model.safetensors in it)")
    config = _read_config(directory)
    cls = MODEL_CLASSES[config.arch]
    found = {}  # name as stored -> (file, TensorInfo)
    for file in _weight_files(directory):
        for name, info in read_safetensors_header(file).tensors.items():
            if name in found:
                raise ValueError(f"{file}: tensor {name!r} is also in {found[name][0]}")
            found[name] = (file, info)
    prefix = cls.base_model_prefix + "."
    bare = not any(name.startswith(prefix) for name in found)
    rename = {name: prefix + name
              if bare and not name.startswith("lm_head.") and name not in extra else name
              for name in found}

    model = cls(config, device="meta", dtype=dtype)
    expected = hf_tensors(model)
    stored = {rename[name]: entry for name, entry in found.items()}
    tied_head = config.tie_word_embeddings and "lm_head.weight" in stored
    checked = dict(expected, **({"lm_head.weight": model.lm_head.weight} if tied_head else {}))
    for name in extra:
        if name not in stored:
            raise ValueError(f"{directory}: the checkpoint lacks tensor {name!r}")
    head_optional = bool(extra) and not config.tie_word_embeddings
    for name, tensor in checked.items():
        if name == "lm_head.weight" and head_optional and name not in stored:
            continue
        if name not in stored:
            raise ValueError(f"{directory}: the checkpoint lacks tensor {name!r} "
                             f"(expected shape {list(tensor.shape)})")
        file, info = stored[name]
        if info.shape != tuple(tensor.shape):
            raise ValueError(f"{file}: tensor {name!r} has shape {list(info.shape)}, "
                             f"expected {list(tensor.shape)} (from config.json)")
        if info.dtype not in ("F64", "F32", "F16", "BF16"):
            raise ValueError(f"{file}: tensor {name!r} is {info.dtype}, expected floating point")
    unexpected = sorted(name for name in stored if name not in checked and name not in extra
                        and not cls.hf_ignored.fullmatch(name))
    if unexpected:
        raise ValueError(f"{directory}: unexpected tensors for {config.arch}: "
                         f"{', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}")

    model.to_empty(device="cpu")  # allocates; breaks the tie, restored below
    if head_optional and "lm_head.weight" not in stored:
        model.init_weights()  # the unused head must hold numbers, not memory garbage
    targets = hf_tensors(model)
    stored_head = None
    extras: Dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for file in sorted({file for file, _ in found.values()}):
            for name, tensor in read_safetensors(file).items():
                name = rename[name]
                if name in targets:
                    targets[name].copy_(tensor)
                elif name == "lm_head.weight":
                    stored_head = tensor
                elif name in extra:
                    extras[name] = tensor.to(dtype)
    model.tie_weights()
    if stored_head is not None and not torch.equal(stored_head.to(dtype),
                                                   model.input_embeddings.weight):
        raise ValueError(f"{directory}: config.json ties the embeddings, but lm_head.weight "
                         "differs from the token embedding")
    return model, extras
