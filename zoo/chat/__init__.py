"""The embedded chat language model: its instruction world, tokenizer and model, and training recipe.

    python -m zoo.chat world --out DIR --n 1000     # export the world as JSONL
    python -m zoo.chat train --out runs/chat        # the recipe (also: python -m zoo train chat)
"""
