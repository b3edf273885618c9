"""A tiny, randomly initialised causal LM and a tokenizer built in code, for running real TRL trainers on CPU without
the Hub (shared by the integration tests)."""
from __future__ import annotations

import random
from pathlib import Path

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "big", "small", "red", "blue", "one", "two", "three",
         "four", "five", "is", "and", "or", "not", "yes", "no", "good", "bad", "answer", "question", "sum", "plus"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def build_tiny_model(path: Path) -> str:
    """A 2-layer Llama (hidden 32, vocab ~35) and a WordLevel tokenizer trained on generated sentences, saved to
    ``path``; returns the path (TRL loads the policy and the reference model from it)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(400)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(
        special_tokens=["<pad>", "<unk>", "<s>", "</s>"], vocab_size=200))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                        bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(n)]


def log_recorder():
    """A TrainerCallback keeping a copy of every dict that reached ``on_log``: ``.logs`` (the dicts) and
    ``.stepped`` (``(global_step, dict)`` pairs)."""
    import transformers

    class Recorder(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict] = []
            self.stepped: list[tuple[int, dict]] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))
            self.stepped.append((state.global_step, self.logs[-1]))

    return Recorder()
