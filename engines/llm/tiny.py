"""A tiny random Llama-style model and byte-level BPE tokenizer, built locally (nothing downloads).

What the tests, the benchmarks and the experiments run every model path on where the real model would be too
slow: `build_tiny_model(dir)` (tests get it through the `tiny_model` fixture), and `TINY_RUN`, the `--set`
overrides that size a `sage run` for it. Deterministic: the same call builds the same weights.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "What is 7 * 8? The answer is 56. \\boxed{56}",
    "Write a function def add(a, b): return a + b",
    "<question>Compute 12 + 30.</question><answer>42</answer>",
    "<plan>1. Read the question. 2. Compute. 3. Check.</plan>",
    "<score>7</score> The plan is clear and correct.",
    "```python\ndef solve(x):\n    return x * 2\n```",
    "system user assistant You are a helpful assistant.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = ( ) [ ] { } , . : ; ' \" < > \\ _ #",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


# `--set` overrides that size a `sage run` of `cpu.yaml` for the tiny model: a few rows per stage, short
# outputs, a rank-4 LoRA. Used by the flow tests and `experiments.learning --model tiny`; later overrides win.
TINY_RUN = ["seeds.n_math=12", "seeds.n_code=4", "validate.n_math=4", "validate.n_code=4", "iteration.n_challenge=4",
            "iteration.n_plan=4", "iteration.n_probe=2", "iteration.n_solve=2", "roles.challenger.max_new_tokens=96",
            "roles.planner.max_new_tokens=48", "roles.critic.max_new_tokens=32", "roles.solver.max_new_tokens=64",
            "train.lora_rank=4", "train.lora_alpha=8", "validate.max_new_tokens=64"]


def build_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None, chat_template=CHAT_TEMPLATE,
                                   padding_side="left")


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random LlamaForCausalLM + tokenizer to `out_dir` (once) and return the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
