#!/usr/bin/env python3
"""Build a tiny random-weight Llama model directory that vLLM (CPU build) can serve.

No model can be downloaded on the project's machines, so this trains a small byte-level
BPE tokenizer on generated text and saves a ``LlamaForCausalLM`` with random weights
(fixed seed, so the output is deterministic).  Takes a few seconds.

Usage:  python build_tiny_model.py OUTPUT_DIR [--vocab-size 4096] [--max-len 4096]

Run it with an interpreter that has ``torch``, ``transformers`` and ``tokenizers``
(the vLLM venv has all three).

Shape notes: hidden 128, 2 layers, 2 attention heads, 1 KV head, head_dim 64.  The vLLM
CPU attention kernel rejects head_dim 16, so head_dim is set explicitly (>= 32).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 1234

# A chat template in the Llama-3 spirit but with plain-text role markers, so every
# message (including role "tool") renders and the prompt prefix of turn N is a
# token-exact prefix of turn N+1 (this is what makes prefix caching hit).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start|>{{ message['role'] }}\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|start|>", "<|end|>"]

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "ta",
    "shi",
    "po",
    "ve",
    "den",
    "gar",
    "ul",
    "fen",
    "tor",
    "ix",
    "sa",
    "bre",
    "quo",
    "zi",
    "mar",
    "el",
    "on",
    "ast",
    "ryn",
    "tek",
    "vol",
    "pra",
]
_WORDS_EN = (
    "the agent calls a tool and reads the result then plans the next step with context "
    "from previous turns user assistant system function file search query cache block "
    "token request session trace span metric latency prefix evict memory model server "
    "error retry status ok json value list number name path line code test build run"
).split()


def _corpus(n_lines: int, rng: random.Random) -> list[str]:
    words = list(_WORDS_EN)
    for _ in range(600):
        words.append("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))))
    lines = []
    for _ in range(n_lines):
        n = rng.randint(5, 40)
        toks = []
        for _ in range(n):
            w = rng.choice(words)
            r = rng.random()
            if r < 0.05:
                w = str(rng.randint(0, 99999))
            elif r < 0.08:
                w = w + rng.choice([",", ".", ":", ";", "()", "{}", '"'])
            toks.append(w)
        lines.append(" ".join(toks))
    # JSON-ish lines, like tool results
    for _ in range(n_lines // 10):
        lines.append(json.dumps({rng.choice(words): rng.randint(0, 1000) for _ in range(4)}))
    return lines


def build_tokenizer(out: Path, vocab_size: int, max_len: int, rng: random.Random):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(20000, rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=["<|start|>", "<|end|>"],
        model_max_length=max_len,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def build_model(out: Path, tokenizer, max_len: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    eos_ids = [tokenizer.convert_tokens_to_ids("</s>"), tokenizer.convert_tokens_to_ids("<|end|>")]
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=max_len,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
    ).save_pretrained(str(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--max-len", type=int, default=4096)
    args = ap.parse_args()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    tok = build_tokenizer(out, args.vocab_size, args.max_len, rng)
    build_model(out, tok, args.max_len)
    print(f"tiny model written to {out} (vocab {len(tok)})")


if __name__ == "__main__":
    main()
