"""Tokenizer and model of the embedded chat LM: a word-level tokenizer trained on the world, a GPT-2 style decoder.

The model is a plain Hugging Face ``GPT2LMHeadModel`` so that it loads with ``from_pretrained``, generates
with ``generate`` and converts to TransformerLens with TransformerLens' own GPT-2 weight conversion.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
USER, ASSISTANT = "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, USER, ASSISTANT)
# The prompt format the model is trained on; apply_chat_template renders exactly this string.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|> {{ message['content'] }} {% endif %}"
    "{% if message['role'] == 'assistant' %}<|assistant|> {{ message['content'] }}{{ eos_token }} {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def format_chat(prompt: str) -> str:
    """The chat-formatted prompt, as ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` gives it."""
    return f"{BOS}{USER} {prompt} {ASSISTANT}"


def train_tokenizer(texts, min_frequency: int = 1):
    """A word-level ``PreTrainedTokenizerFast`` trained (vocabulary counted) on ``texts``.

    Words (contractions kept whole) and punctuation marks are separate tokens; decoding rejoins
    punctuation. Unknown words map to ``<unk>``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(unk_token=UNK))
    # words (with their contractions: "I'm", "can't") and single punctuation marks
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(r"\w+(?:'\w+)*|[^\w\s]"), behavior="isolated")])
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=min_frequency)
    backend.train_from_iterator(texts, trainer=trainer)
    backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                           special_tokens=[(BOS, backend.token_to_id(BOS))])
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # no '##' pieces: joins words, cleans punctuation
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                        unk_token=UNK, additional_special_tokens=[USER, ASSISTANT])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "right"
    tokenizer.model_max_length = 128
    return tokenizer


@dataclass
class ChatModelConfig:
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 128

    def to_json(self) -> dict:
        return asdict(self)


def build_model(config: ChatModelConfig, tokenizer, seed: int = 0):
    """A freshly initialised ``GPT2LMHeadModel`` (float32), dropout off, sized by ``config``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    hf_config = GPT2Config(vocab_size=len(tokenizer), n_embd=config.n_embd, n_layer=config.n_layer,
                           n_head=config.n_head, n_positions=config.n_positions, resid_pdrop=0.0, embd_pdrop=0.0,
                           attn_pdrop=0.0, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    return GPT2LMHeadModel(hf_config)
