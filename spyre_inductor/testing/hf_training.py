"""transformers' own model classes at tiny sizes with their training heads, for one training step.

The causal LMs and BERT's masked-LM head compute their own loss (cross_entropy) from ``labels``.
Dropout probabilities are 0 so that a step on spyre and on the CPU compute the same numbers
(dropout itself draws from the device generator: tests/eager/test_training_strict.py).
"""

from __future__ import annotations

import torch

from .hf_models import SEQ, VOCAB, _DECODER, _TOKENS


def _gpt2():
    import transformers
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                 bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    import transformers
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, pad_token_id=0)
    return transformers.BertForMaskedLM(cfg)


def _llama():
    import transformers
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**_DECODER, **_TOKENS, "attention_dropout": 0.0}))


def _causal(name):
    """A causal LM of hf_models (their configs' dropout probabilities are 0 by default)."""
    def build():
        from . import hf_models
        return hf_models.build(name)[0]
    return build


MODELS = {"gpt2": _gpt2, "bert": _bert, "llama": _llama,
          **{name: _causal(name) for name in ("mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
                                              "granite", "phi3", "mixtral", "gpt_oss")}}


def build(name: str, batch: int = 2, seq: int = SEQ):
    """(model in train mode, fp32, seeded; its keyword inputs with ``labels``). BERT's labels
    mark the positions a masked LM predicts, the rest -100 (cross_entropy's ignore_index)."""
    torch.manual_seed(0)
    model = MODELS[name]()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    inputs = {"input_ids": ids}
    if name == "bert":
        labels = ids.clone()
        labels[:, ::3] = -100
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        inputs["attention_mask"][-1, seq - 4:] = 0
        inputs["input_ids"] = ids.masked_fill(torch.arange(seq) % 5 == 1, 0)  # some pad tokens (padding_idx 0)
        inputs["labels"] = labels
    else:
        inputs["labels"] = ids
    return model.train(), inputs
