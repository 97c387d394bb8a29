"""Hugging Face-format checkpoint folders: config translation, weight layout, loading, tokenizer, export."""
