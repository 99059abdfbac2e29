"""transformers' own model classes at tiny sizes, random weights, nothing downloaded.

What a user brings: the real classes with their own attention code, rotary embeddings, caches
and heads, only the config is small. ``build(name)`` gives the model (fp32, eval, seeded) and
the keyword inputs of one forward; ``logits(output)`` picks the tensor to compare.
"""

from __future__ import annotations

import torch

SEQ = 16
VOCAB = 256

_DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


# Token ids the default configs carry (32000, 50256, ...) lie outside a tiny vocabulary.
_TOKENS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _causal(cls_name, config_name=None, **extra):
    def build(layers):
        import transformers
        cfg_cls = getattr(transformers, (config_name or cls_name) + "Config")
        model_cls = getattr(transformers, cls_name + "ForCausalLM")
        cfg = cfg_cls(**{**_DECODER, **_TOKENS, "num_hidden_layers": layers, **extra})
        return model_cls(cfg), _ids()
    return build


def _ids(batch=1, seq=SEQ):
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, VOCAB, (batch, seq), generator=g)}


def _gpt2(layers):
    import transformers
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=layers, n_head=4, n_positions=128,
                                 bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel(cfg), _ids()


def _bert(kind="Bert"):
    def build(layers):
        import transformers
        cfg = getattr(transformers, kind + "Config")(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=128)
        model = getattr(transformers, kind + "Model")(cfg)
        inputs = _ids(batch=2)
        inputs["attention_mask"] = torch.ones(2, SEQ, dtype=torch.long)
        inputs["attention_mask"][1, SEQ - 5:] = 0
        return model, inputs
    return build


def _t5(layers):
    import transformers
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=layers,
                                num_decoder_layers=layers, num_heads=4, relative_attention_num_buckets=8,
                                relative_attention_max_distance=32, decoder_start_token_id=0)
    inputs = _ids()
    inputs["decoder_input_ids"] = _ids(seq=8)["input_ids"]
    return transformers.T5ForConditionalGeneration(cfg), inputs


def _vit(layers):
    import transformers
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                                 num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128)
    g = torch.Generator().manual_seed(1)
    return transformers.ViTModel(cfg), {"pixel_values": torch.randn(1, 3, 32, 32, generator=g)}


def _clip_vision(layers):
    import transformers
    cfg = transformers.CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=layers,
                                        num_attention_heads=4, intermediate_size=128)
    g = torch.Generator().manual_seed(1)
    return transformers.CLIPVisionModel(cfg), {"pixel_values": torch.randn(1, 3, 32, 32, generator=g)}


def _clip_text(layers):
    import transformers
    cfg = transformers.CLIPTextConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.CLIPTextModel(cfg), _ids()


MODELS = {
    "llama": _causal("Llama"),
    "mistral": _causal("Mistral", sliding_window=8),
    "qwen2": _causal("Qwen2"),
    "qwen3": _causal("Qwen3", head_dim=16),
    "gemma": _causal("Gemma", head_dim=16),
    "gemma2": _causal("Gemma2", head_dim=16, sliding_window=8),
    "gemma3": _causal("Gemma3", "Gemma3Text", head_dim=16, sliding_window=8),
    "granite": _causal("Granite"),
    "phi3": _causal("Phi3"),
    "mixtral": _causal("Mixtral", num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": _causal("GptOss", head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    "gpt2": _gpt2,
    "bert": _bert("Bert"),
    "roberta": _bert("Roberta"),
    "t5": _t5,
    "vit": _vit,
    "clip_vision": _clip_vision,
    "clip_text": _clip_text,
}


CAUSAL = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "granite", "phi3", "mixtral",
          "gpt_oss", "gpt2")


def build(name, layers=2):
    torch.manual_seed(0)
    model, inputs = MODELS[name](layers)
    return model.eval(), inputs


def logits(output):
    for key in ("logits", "last_hidden_state"):
        value = getattr(output, key, None)
        if value is not None:
            return value
    return output[0]
