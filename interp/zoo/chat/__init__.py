"""The embedded chat language model: its instruction world, tokenizer and model, and training recipe.

    python -m interp.zoo.chat world --out DIR --n 1000     # export the world as JSONL
    python -m interp.zoo.chat train --out runs/chat        # the recipe (also: python -m interp.zoo train chat)
"""
