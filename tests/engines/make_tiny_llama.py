"""Write a tiny random-weight Llama that a real vLLM can serve: no model hub, byte-identical.

    python tests/engines/make_tiny_llama.py OUT_DIR

Runs with the engine's own interpreter (it needs numpy, tokenizers and safetensors, which vLLM
brings); tests import `train_tokenizer` from it with the project's. What it writes:

- `config.json`: LlamaForCausalLM, hidden 256, 2 layers, 4 heads, intermediate 512, 4,096
  positions — small enough that one CPU core decodes a batch in milliseconds, real enough that
  vLLM runs its whole V1 path (continuous batching, chunked prefill, prefix caching, priority).
- `model.safetensors`: seeded normal weights (float32; vLLM casts to --dtype).
- `tokenizer.json` + `tokenizer_config.json`: a byte-level BPE trained in about a second on
  seeded synthetic text made of the same consonant-vowel words fairbench's prompts use, with a
  Zipf skew, so the frequent words become single tokens and the rare ones split — the mix that
  fairbench's prompt-length calibration must handle on a real tokenizer. A chat template with
  `<|user|>` / `<|assistant|>` markers.

Output text is random tokens: always send `ignore_eos` and `max_tokens`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SEED = 20261129
HIDDEN, LAYERS, HEADS, INTER, POSITIONS = 256, 2, 4, 512, 4096
TOKENIZER_VOCAB = 2048
SPECIAL = ["<|pad|>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def words() -> list[str]:
    """The consonant-vowel-consonant-vowel words (the shape of fairbench's prompt vocabulary)."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    out = [a + b + c + d for a in consonants for b in vowels for c in consonants for d in vowels]
    return out[:4096]


def corpus(rng: np.random.Generator) -> list[str]:
    vocab = np.array(words())
    ranks = np.arange(1, len(vocab) + 1, dtype=float)
    p = ranks**-1.1
    p /= p.sum()
    lines = []
    for _ in range(4000):
        n = int(rng.integers(5, 40))
        lines.append(" ".join(vocab[rng.choice(len(vocab), size=n, p=p)]))
    return lines


def train_tokenizer(rng: np.random.Generator) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer=trainer)
    return tok


def weights(rng: np.random.Generator, vocab: int) -> dict[str, np.ndarray]:
    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w[p + f"self_attn.{name}.weight"] = normal(HIDDEN, HIDDEN)
        w[p + "mlp.gate_proj.weight"] = normal(INTER, HIDDEN)
        w[p + "mlp.up_proj.weight"] = normal(INTER, HIDDEN)
        w[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTER)
        w[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    w["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    w["lm_head.weight"] = normal(vocab, HIDDEN)
    return w


def main(out: Path) -> None:
    from safetensors.numpy import save_file  # the engine's venv has it; tests import the rest

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    tok = train_tokenizer(rng)
    vocab = tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIAL}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "max_position_embeddings": POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<|pad|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]}, indent=2) + "\n"
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<|pad|>",
                "model_max_length": POSITIONS,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    save_file(weights(rng, vocab), str(out / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_llama.py OUT_DIR")
    main(Path(sys.argv[1]))
